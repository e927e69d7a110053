"""Packs that compute a prefix several rows share once (`packing.SharedPackLayout`,
`Learner(share_prefix=True)`): the grouping and the layout by hand, then log-probs and gradients
against the same learner packing every row alone (CPU fp32, tiny model), and a layout that leaks
across segments failing that comparison."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig

from agentq.algos import make_objective
from agentq.kernels.quant_spec import QuantSpec
from agentq.learner import packing
from agentq.learner.batch import PolicyBatch
from agentq.learner.learner import Learner
from agentq.learner.packing import SharedPackLayout, plan_shared_packs, shared_prefix_groups

SPECS = ("w8a8_kv8", "none")


# ------------------------------------------------------------------ grouping and layout
def test_groups_save_the_most_tokens_by_hand():
    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 6, 7], [1, 2, 3, 9, 9, 9], [8, 8, 8, 8, 0, 0]])
    lens = [5, 6, 6, 4]
    # rows 0-2 share 3 tokens (2 computed once, the third kept by each row): saves 2 × 2 = 4;
    # rows 0-1 alone share 4 (3 once): saves 3. The first wins.
    assert shared_prefix_groups(ids, lens, min_tokens=2) == [([0, 1, 2], 2)]
    # with 3 shared tokens required only rows 0 and 1 qualify
    assert shared_prefix_groups(ids, lens, min_tokens=3) == [([0, 1], 3)]
    assert shared_prefix_groups(ids, lens, min_tokens=4) == []


def test_layout_by_hand():
    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 6, 7], [8, 8, 8, 0, 0, 0]])
    lay = SharedPackLayout.of(ids, torch.tensor([5, 6, 3]), [([0, 1], 3)])
    # shared segment [1 2 3] at 0-2, row 0's own [4 5] at 3-4, row 1's [4 6 7] at 5-7, row 2 at 8-10
    assert lay.pack(ids).tolist() == [[1, 2, 3, 4, 5, 4, 6, 7, 8, 8, 8]]
    assert lay.positions.tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 0, 1, 2]
    assert lay.q_bounds.tolist() == [0, 3, 5, 8, 11]
    # keys: the shared segment; shared + row 0; shared + row 1; row 2
    assert lay.kv_index.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8, 9, 10]
    assert lay.k_bounds.tolist() == [0, 3, 8, 14, 17]
    # token 3 (the last shared one) of both rows is read after the shared segment, at row 0's start
    assert lay.src.tolist() == [[0, 1, 2, 3, 4, -1], [0, 1, 2, 3, 6, 7], [8, 9, 10, -1, -1, -1]]
    scored = torch.zeros(3, 6, dtype=torch.bool)
    scored[1, 3] = scored[1, 5] = scored[2, 1] = True
    assert lay.pack(scored)[0].nonzero().flatten().tolist() == [3, 7, 9]
    assert lay.unpack(torch.arange(11.0)[None], 6).tolist() == [[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 6, 7],
                                                               [8, 9, 10, 0, 0, 0]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12)), min_size=1, max_size=12), st.integers(8, 40))
def test_shared_packs_cover_every_row_once_within_budget(rows, budget):
    """Rows made of one of three prompts (or none) plus a random tail: every row in one pack, each
    pack within budget counting a group's shared tokens once (or a lone oversize row)."""
    prompts = [list(range(10, 20)), list(range(10, 16)) + [99] * 4, []]
    g = torch.Generator().manual_seed(len(rows) * 100 + budget)
    seqs = [prompts[p] + torch.randint(30, 40, (n,), generator=g).tolist() for p, n in rows]
    lens = [len(s) for s in seqs]
    ids = torch.zeros(len(seqs), max(lens), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    packs = plan_shared_packs(ids, lens, budget, min_tokens=3)
    assert sorted(r for p in packs for r in p) == list(range(len(seqs)))
    for p in packs:
        sub = ids[p]
        groups = shared_prefix_groups(sub, [lens[r] for r in p], 3)
        lay = SharedPackLayout.of(sub, torch.tensor([lens[r] for r in p]), groups)
        assert lay.total <= sum(lens[r] for r in p)
        # the packed tokens rebuild every row through `src`
        assert torch.equal(lay.unpack(lay.pack(sub), sub.shape[1]), sub)


# ------------------------------------------------------------------ log-probs and gradients
@pytest.fixture(scope="module")
def vocab(tiny_model_dir) -> int:
    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size


def group_batch(vocab: int, seed: int = 0) -> PolicyBatch:
    """Two GRPO groups of three rows: each group's rows share a 40-token prompt, then a 3-token
    action and a 5-token observation per turn (1-3 turns), as a multi-turn rollout lays them
    out; one row alone (no group)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (40,), generator=g) for _ in range(2)]
    seqs, acts = [], []
    for i in range(7):
        prompt = prompts[i // 3] if i < 6 else torch.randint(3, vocab, (40,), generator=g)
        turns = 1 + i % 3
        tail = torch.randint(3, vocab, (8 * turns,), generator=g)
        seqs.append(torch.cat([prompt, tail]))
        acts.append(torch.cat([torch.zeros(40), ((torch.arange(8 * turns) % 8) < 3).float()]))
    L = max(len(s) for s in seqs)
    ids, attn, act = (torch.zeros(7, L, dtype=torch.long), torch.zeros(7, L, dtype=torch.long), torch.zeros(7, L))
    for i, (s, a) in enumerate(zip(seqs, acts)):
        ids[i, :len(s)], attn[i, :len(s)], act[i, :len(s)] = s, 1, a
    seg = torch.cumsum((act > 0) & (torch.roll(act, 1, 1) == 0), 1) * act.long()
    rollout = (-torch.log(torch.tensor(float(vocab))) - 0.1 * torch.rand(7, L, generator=g)) * act
    return PolicyBatch(ids, attn, act, seg, rollout, torch.randn(7, generator=g))


def learners(tiny_model_dir, spec: str) -> tuple[Learner, Learner]:
    kw = dict(use_reference=False, pack_tokens=400)
    return (Learner(str(tiny_model_dir), QuantSpec.preset(spec), share_prefix=True, **kw),
            Learner(str(tiny_model_dir), QuantSpec.preset(spec), share_prefix=False, **kw))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("every_token", [False, True])
def test_shared_prefix_logprobs_equal_plain_packs(tiny_model_dir, vocab, spec, every_token, monkeypatch):
    batch = group_batch(vocab)
    shared, plain = learners(tiny_model_dir, spec)
    seen = []
    real = packing.SharedPackLayout.of
    monkeypatch.setattr(packing.SharedPackLayout, "of",
                        classmethod(lambda cls, *a: seen.append(a[2]) or real(*a)))
    a = shared.logprobs(batch, every_token=every_token)
    b = plain.logprobs(batch, every_token=every_token)
    # one pack: both groups shared their 39-token prefixes (the 40th is each row's own)
    assert [sorted((sorted(r), s) for r, s in groups) for groups in seen] == [[([0, 1, 2], 39), ([3, 4, 5], 39)]]
    real_tok = batch.attention_mask.bool()
    d = (a - b)[real_tok].abs().max().item()
    print(f"\n{spec} every_token={every_token}: shared vs plain packs max|Δ| = {d:.2e}")
    assert d <= 1e-6
    assert torch.equal(a == 0, b == 0)         # the same tokens scored
    assert a[batch.action_mask.bool()].abs().min() > 0.5


def test_a_layout_that_leaks_across_segments_changes_the_logprobs(tiny_model_dir, vocab, monkeypatch):
    """The comparison above can fail: row segments attending to all earlier packed keys (the
    shared segment and the group's other rows) move the log-probs."""
    batch = group_batch(vocab)
    shared, plain = learners(tiny_model_dir, "w8a8_kv8")
    right = plain.logprobs(batch)
    real = packing.SharedPackLayout.of

    def leaky(cls, *a):
        lay = real(*a)
        qb = lay.q_bounds
        kv = torch.cat([torch.arange(int(e)) for e in qb[1:]])
        kb = torch.cat([torch.zeros(1, dtype=torch.long), qb[1:].cumsum(0)])
        return packing.SharedPackLayout(lay.src, lay.origin, lay.lengths, qb, kb, kv, lay.positions)

    monkeypatch.setattr(packing.SharedPackLayout, "of", classmethod(leaky))
    wrong = shared.logprobs(batch)
    assert (right - wrong)[batch.action_mask.bool()].abs().max() > 1e-2


@pytest.mark.parametrize("spec", SPECS)
def test_shared_prefix_gradient_equals_plain_packs(tiny_model_dir, vocab, spec):
    """One accumulate_grads: the prefix's activations get the sum of their rows' gradients."""
    objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.0, loss_agg="token_mean")
    grads = []
    for learner in learners(tiny_model_dir, spec):
        batch = group_batch(vocab)
        batch.old_logp = learner.logprobs(batch) - 0.01 * batch.action_mask
        batch = batch.weighted(objective.prepare(batch))
        sums: dict[str, float] = {}
        assert learner.accumulate_grads(batch, objective, sums)
        grads.append(torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()]))
    rel = ((grads[0] - grads[1]).norm() / grads[1].norm()).item()
    print(f"\n{spec}: shared vs plain packs, gradient relative error {rel:.2e}")
    assert grads[1].norm() > 0 and rel <= 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("spec", SPECS)
def test_shared_prefix_on_cuda_bf16_matches_plain_packs(tiny_model_dir, vocab, spec):
    """The GPU path: one varlen flash call whose row segments have more keys than queries (its
    causal mask aligned to the bottom right) against plain packs, log-probs and the gradient, to
    bf16 level. A top-left mask would hide most of the prefix from the rows' tokens."""
    objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.0, loss_agg="token_mean")
    kw = dict(use_reference=False, pack_tokens=400, dtype=torch.bfloat16, device="cuda")
    lps, grads = [], []
    for share in (True, False):
        learner = Learner(str(tiny_model_dir), QuantSpec.preset(spec), share_prefix=share, **kw)
        batch = group_batch(vocab)
        lps.append(learner.logprobs(batch))
        batch.old_logp = lps[-1] - 0.01 * batch.action_mask
        batch = batch.weighted(objective.prepare(batch))
        assert learner.accumulate_grads(batch, objective, {})
        grads.append(torch.cat([p.grad.float().reshape(-1) for p in learner.model.parameters()]))
    act = group_batch(vocab).action_mask.bool()
    d = (lps[0] - lps[1])[act].abs()
    rel = ((grads[0] - grads[1]).norm() / grads[1].norm()).item()
    print(f"\n[cuda bf16 {spec}] shared vs plain packs: log-prob max|Δ|={d.max():.3e} mean={d.mean():.3e}; "
          f"gradient relative error {rel:.2e}")
    assert d.mean() < 1e-2 and d.max() < 0.1 and rel < 3e-2


def test_update_reports_the_tokens_shared_prefixes_saved(tiny_model_dir, vocab):
    """Two groups of 3 rows share 39 tokens each: (3 − 1) × 39 × 2 = 156 of the batch's 384 row
    tokens (7 rows of 40 prompt tokens plus 8 per turn, 13 turns) are not computed."""
    objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.0, loss_agg="token_mean")
    summaries = []
    for learner in learners(tiny_model_dir, "w8a8_kv8"):
        batch = group_batch(vocab)
        assert int(batch.attention_mask.sum()) == 384
        learner.fill_old_and_ref(batch)
        summaries.append(learner.update(batch.weighted(objective.prepare(batch)), objective))
    assert summaries[0]["prefix_tokens_saved_frac"] == pytest.approx(156 / 384)
    assert "prefix_tokens_saved_frac" not in summaries[1]


def test_identical_rows_and_a_row_that_prefixes_another(tiny_model_dir, vocab):
    """Edge cases of the grouping: two identical rows (each keeps only its last token), and a row
    that is the start of a longer one; the log-probs still equal plain packs'."""
    g = torch.Generator().manual_seed(5)
    base = torch.randint(3, vocab, (60,), generator=g)
    rows = [base, base.clone(), base[:45], torch.cat([base[:45], torch.randint(3, vocab, (10,), generator=g)])]
    L = 60
    ids, attn = torch.zeros(4, L, dtype=torch.long), torch.zeros(4, L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], attn[i, :len(r)] = r, 1
    act = attn.float() * (torch.arange(L) >= 40).float()
    batch = PolicyBatch(ids, attn, act, act.long(), -act, torch.zeros(4))
    assert shared_prefix_groups(ids, attn.sum(1).tolist()) == [([2, 3, 0, 1], 44)]
    shared, plain = learners(tiny_model_dir, "w8a8_kv8")
    a, b = shared.logprobs(batch, every_token=True), plain.logprobs(batch, every_token=True)
    assert (a - b)[attn.bool()].abs().max() <= 1e-6 and torch.equal(a[0], a[1])
