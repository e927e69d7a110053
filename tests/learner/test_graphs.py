"""CUDA graphs of the packed learner passes (`learner/graphs.py`, `Learner(cuda_graphs=True)`).

On the CPU (CI): the buckets and the padded inputs by hand; the padded forward (`PackGraphs` with
capture=False, the function the GPU captures) gives each real row the log-probs and the gradient
of the unpadded pack; pinned weight caches rewrite their tensors in place; bad settings are
refused. On a GPU: graph replays against the same padded forward run eagerly (forward bit for bit,
gradients within bf16 rounding), and a learner with graphs tracks one without over optimizer
steps (so the weight codes the graphs read are refreshed).

Tolerances (CPU fp32): log-probs 1e-6 and gradients 1e-5 · max|g|, as in test_packing.py (the
padding only adds rows to the GEMMs and one more attention row).
"""
import functools

import pytest
import torch

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.kernels import ste
from agentq.learner import learner as learner_mod
from agentq.learner.graphs import Bucket, PackGraphs, choose_bucket, head_positions, padded_head_positions, padded_inputs
from agentq.learner.learner import Learner, packed_forward, packed_sequence_logprobs, unpack_rows
from agentq.learner.packing import PackLayout

from test_packing import mixed_batch, step_gradient, vocab  # noqa: F401  (vocab: a fixture)

CUDA = torch.cuda.is_available()


# ------------------------------------------------------------------ buckets and padding
def test_buckets_by_hand():
    # granule 8192 / 32 = 256: 3,000 → 3,072 tokens; rows ≤ 1,000 → 1,024 long; the 72 padding
    # tokens are 1 more row; 3 + 1 rows → 4 slots
    assert choose_bucket(3000, 3, 1000, 8192, 256) == Bucket(3072, 4, 1024)
    # row length from 128; 156 padding tokens → 2 padding rows; 1 + 2 → 4 slots
    assert choose_bucket(100, 1, 100, 8192, 256) == Bucket(256, 4, 128)
    # the granule is a multiple of 64 (100 / 32 → 64); the row length capped by the token count
    assert choose_bucket(128, 5, 40, 100, 256) == Bucket(128, 8, 128)
    assert choose_bucket(8192, 4, 2048, 8192, 256) == Bucket(8192, 4, 2048)     # full: no padding row
    assert choose_bucket(8193, 1, 8193, 8192, 256) is None       # an oversize row: eager
    assert choose_bucket(500, 8, 100, 8192, 8) is None            # more slots than allowed
    with pytest.raises(ValueError, match="at least one row"):
        choose_bucket(0, 0, 0, 8192, 256)


def test_padded_inputs_by_hand():
    layout = PackLayout.of(torch.tensor([3, 2]))
    ids, pos, bounds = padded_inputs(layout, torch.tensor([11, 12, 13, 21, 22]), Bucket(12, 8, 4))
    assert ids.tolist() == [[11, 12, 13, 21, 22] + [0] * 7]
    # the 7 padding tokens as rows of at most 4, positions restarting at 0
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2]]
    assert bounds.dtype == torch.int32
    assert bounds.tolist() == [0, 3, 5, 9, 12, 12, 12, 12, 12]     # 2 rows, 2 padding rows, 4 empty
    with pytest.raises(ValueError, match="does not fit"):
        padded_inputs(layout, torch.arange(5), Bucket(12, 3, 4))    # 4 rows needed
    with pytest.raises(ValueError, match="does not fit"):
        padded_inputs(layout, torch.arange(5), Bucket(12, 8, 2))    # a row longer than max_len


def test_head_positions_by_hand():
    # a step of tokens / 8 rounded up to 64: 128 → 64; 3,072 → 384
    assert head_positions(128, 23) == 64 and head_positions(128, 64) == 64 and head_positions(128, 0) == 64
    assert head_positions(128, 65) == 0                   # 128 = every position: no head bucket
    assert head_positions(3072, 700) == 768
    assert choose_bucket(3000, 3, 1000, 8192, 256, scored=700) == Bucket(3072, 4, 1024, 768)
    assert choose_bucket(3000, 3, 1000, 8192, 256, scored=3000) == Bucket(3072, 4, 1024, 0)


def test_padded_head_positions_by_hand():
    scored = torch.tensor([0, 0, 1, 1, 0, 0, 1, 0, 0, 1], dtype=torch.bool)       # a pack of 10 tokens
    # positions before the 4 scored tokens (1, 2, 5, 8), then before unscored ones (0, 3, 4, 6)
    heads = padded_head_positions(scored, Bucket(12, 4, 8, 8))
    assert heads.tolist() == [1, 2, 5, 8, 0, 3, 4, 6]
    assert padded_head_positions(scored, Bucket(12, 4, 8, 4)).tolist() == [1, 2, 5, 8]
    with pytest.raises(ValueError, match="does not fit"):
        padded_head_positions(scored, Bucket(12, 4, 8, 3))


# ------------------------------------------------------------------ the padded forward, eagerly (CPU)
def eager_runner(learner: Learner, train: bool) -> PackGraphs:
    return PackGraphs(learner.model, functools.partial(packed_forward, learner.model, learner.temperature),
                      128, train=train, capture=False)


def one_pack(batch, rows):
    ids = batch.input_ids[rows]
    lengths = batch.attention_mask[rows].sum(1)
    L = int(lengths.max())
    return ids[:, :L], lengths, PackLayout.of(lengths)


@pytest.mark.parametrize("spec", ["w8a8_kv8", "none"])
def test_padded_forward_gives_the_pack_its_own_logprobs(tiny_model_dir, vocab, spec):  # noqa: F811
    batch = mixed_batch(vocab)
    learner = Learner(str(tiny_model_dir), QuantSpec.preset(spec), use_reference=False, pack_tokens=100)
    ids, lengths, layout = one_pack(batch, [1, 2, 5, 0, 7])    # 95 tokens, longest 70: bucket (128, 8, 128)
    runner = eager_runner(learner, train=False)
    with torch.no_grad():
        padded = runner.run(layout, layout.pack(ids))
        want = packed_sequence_logprobs(learner.model, ids, lengths)
    assert padded.shape == (1, 128) and list(runner.entries) == [Bucket(128, 8, 128)]
    got = unpack_rows(layout, padded, ids.shape[1])
    real = torch.arange(ids.shape[1])[None] < lengths[:, None]
    d = (got - want)[real].abs().max().item()
    print(f"\n{spec}: padded pack vs pack max|Δ| = {d:.2e}")
    assert d <= 1e-6 and want[real].abs().max() > 1.0


def test_padded_forward_gives_the_pack_its_own_gradient(tiny_model_dir, vocab):  # noqa: F811
    """Gradient of Σ w·logp over the real tokens: through the padded forward = through the pack."""
    batch = mixed_batch(vocab)
    ids, lengths, layout = one_pack(batch, [6, 3])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    grads = []
    for padded in (False, True):
        learner = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False, pack_tokens=100)
        if padded:
            logp = unpack_rows(layout, eager_runner(learner, train=True).run(layout, layout.pack(ids)), ids.shape[1])
        else:
            logp = packed_sequence_logprobs(learner.model, ids, lengths)
        (logp * weights).sum().backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()]))
    assert (grads[1] - grads[0]).abs().max() <= 1e-5 * grads[0].abs().max()
    assert grads[0].abs().max() > 0


@pytest.mark.parametrize("train", [False, True])
def test_padded_forward_with_head_positions_scores_the_pack_as_eager_does(tiny_model_dir, vocab, train):  # noqa: F811
    """Scored tokens only (`run(..., packed_scored)`): the head runs at the bucket's head positions
    (the scored tokens' and fillers'), and once the caller zeroes the unscored tokens, log-probs and
    gradient are those of the eager scored pack."""
    batch = mixed_batch(vocab)
    ids, lengths, layout = one_pack(batch, [1, 2, 5, 0, 7])
    scored = batch.action_mask[[1, 2, 5, 0, 7], : ids.shape[1]].bool()
    n_scored = int(layout.pack(scored)[0, 1:].sum())
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    out = []
    for graphed in (False, True):
        learner = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False, pack_tokens=100)
        with torch.set_grad_enabled(train):
            if graphed:
                runner = eager_runner(learner, train=train)
                logp = unpack_rows(layout, runner.run(layout, layout.pack(ids), layout.pack(scored)), ids.shape[1])
                logp = logp * scored
                assert list(runner.entries) == [Bucket(128, 8, 128, 64)] and 30 < n_scored < 64
            else:
                logp = packed_sequence_logprobs(learner.model, ids, lengths, scored=scored)
        if train:
            (logp * weights).sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()]) if train else None
        out.append((logp.detach(), grads))
    (want, g_want), (got, g_got) = out
    assert (got - want).abs().max() <= 1e-6 and want[scored].abs().min() > 0.1 and bool((got[~scored] == 0).all())
    if train:
        assert (g_got - g_want).abs().max() <= 1e-5 * g_want.abs().max()


def test_update_reports_the_graph_counts(tiny_model_dir, vocab):  # noqa: F811
    """The update's summary (logged to metrics.jsonl) counts replays, captures and eager packs
    over the learner's runners; here one eager-mode runner stands in for the GPU's (capture=False
    counts its buckets, not replays)."""
    objective = make_objective("grpo", kl_coef=0.0)
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, pack_tokens=100)
    batch = mixed_batch(vocab)
    batch.old_logp = learner.logprobs(batch) - 0.01 * batch.action_mask
    batch = batch.weighted(objective.prepare(batch))
    assert "graph_replays" not in learner.update(batch, objective)
    runner = eager_runner(learner, train=True)
    learner.graphs[(id(learner.model), True)] = runner
    learner.cuda_graphs = True
    out = learner.update(batch, objective)
    # packs [4] (130 tokens, over the 128-token bucket cap: eager), [1, 2, 5, 0, 7], [6, 3]
    assert (out["graph_replays"], out["graph_captures"], out["graph_eager_packs"]) == (0, 2, 1)


def test_oversize_pack_is_left_to_the_eager_path(tiny_model_dir, vocab):  # noqa: F811
    batch = mixed_batch(vocab)
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, pack_tokens=100)
    ids, lengths, layout = one_pack(batch, [4])                        # 130 tokens > 128
    runner = eager_runner(learner, train=False)
    assert runner.run(layout, layout.pack(ids)) is None and runner.eager_packs == 1


# ------------------------------------------------------------------ pinned weight caches
def test_pinned_cache_rewrites_its_tensors_in_place():
    torch.manual_seed(0)
    spec = QuantSpec.preset("w8a8_kv8")
    w = torch.randn(16, 32)
    cache = ste.WeightCache()
    cache.pin()
    w_q, s_w = cache.get(w, spec)
    deq = cache.dequantized(torch.float32)
    w_t, _ = cache.transposed()
    with torch.no_grad():
        w.mul_(3.0).add_(0.5)                    # an optimizer step: in place, version bumped
    w_q2, s_w2 = cache.get(w, spec)
    fresh = ste.WeightCache()
    f_q, f_s = fresh.get(w, spec)
    assert w_q2 is w_q and s_w2 is s_w and cache.recomputes == 2
    assert torch.equal(w_q, f_q) and torch.equal(s_w, f_s)
    assert cache.dequantized(torch.float32) is deq and torch.equal(deq, fresh.dequantized(torch.float32))
    assert torch.equal(w_t, f_q.t())
    cache.invalidate()                           # keeps the tensors, recomputes at the next get
    assert cache.get(w, spec)[0] is w_q and cache.recomputes == 3
    with pytest.raises(RuntimeError, match="changed shape"):
        cache.get(torch.randn(8, 32), spec)


def test_unpinned_cache_makes_new_tensors():
    spec = QuantSpec.preset("w8a8_kv8")
    w = torch.randn(16, 32)
    cache = ste.WeightCache()
    w_q, _ = cache.get(w, spec)
    with torch.no_grad():
        w.mul_(2.0)
    assert cache.get(w, spec)[0] is not w_q


# ------------------------------------------------------------------ settings
def test_cuda_graphs_refused_where_they_cannot_apply(tiny_model_dir):
    with pytest.raises(ValueError, match="CUDA bf16/fp16"):
        Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, pack_tokens=64, cuda_graphs=True)


@pytest.mark.skipif(CUDA, reason="the refusal of a machine without a GPU")
def test_capture_refused_without_a_gpu():
    with pytest.raises(RuntimeError, match="need a GPU"):
        PackGraphs(torch.nn.Linear(2, 2), lambda *a: None, 64, train=False)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graphs_need_packing_and_no_checkpointing(tiny_model_dir):
    kw = dict(use_reference=False, dtype=torch.bfloat16, device="cuda", cuda_graphs=True)
    with pytest.raises(ValueError, match="pack_tokens"):
        Learner(str(tiny_model_dir), QuantSpec.preset("none"), **kw)
    with pytest.raises(ValueError, match="activation_checkpointing"):
        Learner(str(tiny_model_dir), QuantSpec.preset("none"), pack_tokens=64, activation_checkpointing=True, **kw)


# ------------------------------------------------------------------ GPU: replays
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("spec", ["w8a8_kv8", "none"])
def test_graph_replay_matches_the_padded_forward_run_eagerly(tiny_model_dir, vocab, spec):  # noqa: F811
    """No-grad: replay = eager run of the same padded function, bit for bit, pack after pack (the
    static inputs are rewritten); training: the replayed backward's gradient = eager autograd's
    within bf16 rounding (flash attention's backward adds dQ with atomics, in no fixed order)."""
    batch = mixed_batch(vocab)
    kw = dict(use_reference=False, dtype=torch.bfloat16, device="cuda", pack_tokens=100)
    learner = Learner(str(tiny_model_dir), QuantSpec.preset(spec), **kw)
    fwd = functools.partial(packed_forward, learner.model, learner.temperature)
    graphed = PackGraphs(learner.model, fwd, 128, train=False)
    eager = PackGraphs(learner.model, fwd, 128, train=False, capture=False)
    with torch.no_grad():
        for rows in ([1, 2, 5, 0, 7], [6, 3], [1, 2, 5, 0, 7]):
            ids, lengths, layout = one_pack(batch, rows)
            want = unpack_rows(layout, eager.run(layout, layout.pack(ids)), ids.shape[1])
            got = unpack_rows(layout, graphed.run(layout, layout.pack(ids)), ids.shape[1])
            assert torch.equal(got, want), (rows, (got - want).abs().max().item())
    assert graphed.replays == 3 and len(graphed.entries) == 2

    ids, lengths, layout = one_pack(batch, [1, 2, 5, 0, 7])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3)).cuda()
    grads = []
    for capture in (False, True):
        learner.opt.zero_grad(set_to_none=True)
        runner = PackGraphs(learner.model, fwd, 128, train=True, capture=capture)
        for _ in range(2):                   # two micro-batches accumulate
            logp = unpack_rows(layout, runner.run(layout, layout.pack(ids)), ids.shape[1])
            (logp * weights).sum().backward()
        # the eager pass's graph stays alive (logp) while the next capture runs: the capture must
        # not touch its gradient accumulators (PackGraphs._capture)
        grads.append(torch.cat([p.grad.float().reshape(-1) for p in learner.model.parameters()]))
    rel = ((grads[1] - grads[0]).norm() / grads[0].norm()).item()
    print(f"\n[cuda {spec}] graphed vs eager gradient: relative {rel:.2e}")
    assert rel < 1e-2 and grads[0].abs().max() > 0
    assert runner.replays == 2 and not runner.failed


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_graphed_learner_tracks_the_eager_learner_over_steps(tiny_model_dir, vocab):  # noqa: F811
    """Two learners from the same weights, one with graphs: after each of three optimizer steps
    their π_old agree to bf16 level and have moved (the graphs read weight codes that are
    rewritten after every step; stale codes would leave the graphed log-probs where they were)."""
    objective = make_objective("grpo", kl_coef=0.0)
    kw = dict(use_reference=False, dtype=torch.bfloat16, device="cuda", pack_tokens=100, lr=1e-3)
    learners = [Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), cuda_graphs=g, **kw) for g in (False, True)]
    batch = mixed_batch(vocab)
    real = batch.action_mask.bool()              # the tokens the learner scores (0 elsewhere)
    before = learners[1].logprobs(batch)
    for step in range(3):
        lps = [ln.logprobs(batch) for ln in learners]
        d = (lps[1] - lps[0])[real].abs()
        print(f"\n[cuda] step {step}: graphed vs eager π_old max|Δ|={d.max():.3e} mean={d.mean():.3e}")
        assert d.mean() < 2e-2 and d.max() < 0.25
        b = batch.index(torch.arange(batch.num_seqs))
        b.old_logp = lps[0]
        b = b.weighted(objective.prepare(b))
        for ln in learners:
            ln.update(b, objective)
    moved = (learners[1].logprobs(batch) - before)[real].abs().mean()
    assert moved > 5e-2
    runner = learners[1].graphs[(id(learners[1].model), True)]
    assert runner.replays >= 3 and runner.eager_packs > 0 and not runner.failed   # the 130-token row: eager
    stats = learners[1].graph_stats()
    assert stats["graph_replays"] >= 6 and stats["graph_captures"] >= 2 and stats["graph_eager_packs"] >= 2


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_the_pool_counts_the_memory_its_graphs_hold():
    """`GraphPool.held_bytes` (what an out-of-memory hint quotes) sees a captured graph's output in
    its pool, and none of the memory allocated outside it."""
    from agentq.learner.graphs import GraphPool

    pool = GraphPool()
    assert pool.held_bytes() == 0
    outside = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")       # 64 MiB, not in the pool
    x = torch.ones(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2                                                             # warm-up, outside the capture
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g, pool=pool.handle):
        y = x * 2                                                             # 4 MiB inside the pool
    g.replay()
    held = pool.held_bytes()
    assert held is not None and 4 << 20 <= held < 64 << 20, held
    assert float(y.sum()) == 2 * (1 << 20)
    del outside


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_a_capture_out_of_memory_drops_every_graph_and_the_learner_goes_on_eagerly(tiny_model_dir, vocab,  # noqa: F811
                                                                                   monkeypatch):
    """The pool keeps about the largest pass's peak, which eager passes cannot use: after a capture
    ran out of memory, the next eager pack ran out too (an H100 update beside a 37.5 GiB pool). The
    capture's failure now drops every graph of the pool, captures nothing after, and the update runs
    eagerly, tracking a learner that never had graphs. (The out-of-memory error is raised by a
    stand-in for the capture proper: a real one would need the GPU filled on cue.)"""
    objective = make_objective("grpo", kl_coef=0.0)
    kw = dict(use_reference=False, dtype=torch.bfloat16, device="cuda", pack_tokens=100, lr=1e-3)
    eager, graphed = [Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), cuda_graphs=g, **kw) for g in (False, True)]
    batch = mixed_batch(vocab)
    real = batch.action_mask.bool()
    graphed.logprobs(batch)                              # the no-grad runner captures its buckets
    no_grad = graphed.graphs[(id(graphed.model), False)]
    held = graphed.graph_pool.held_bytes()
    assert no_grad.entries and held > 0

    tries = []

    def out_of_memory(self, e):
        tries.append(e.bucket)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")

    monkeypatch.setattr(PackGraphs, "_record", out_of_memory)
    b = batch.index(torch.arange(batch.num_seqs))
    b.old_logp = eager.logprobs(batch)
    b = b.weighted(objective.prepare(b))
    for _ in range(2):
        out = [ln.update(b, objective) for ln in (eager, graphed)][1]
    assert len(tries) == 1 and graphed.graph_pool.released and not no_grad.entries
    assert out["graphs_released"] == 1 and graphed.graph_pool.held_bytes() < held
    d = (graphed.logprobs(batch) - eager.logprobs(batch))[real].abs()
    print(f"\n[cuda] after the release, graphed-then-eager vs eager π max|Δ|={d.max():.3e} mean={d.mean():.3e}")
    assert d.mean() < 2e-2 and d.max() < 0.25 and len(tries) == 1
