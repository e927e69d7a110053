"""Sequence packing (`learner/packing.py`, `Learner(pack_tokens=...)`): the planner puts every row in
exactly one pack within the token budget; a packed forward gives each row the log-probs it has alone
(fp32 CPU, aligned W8A8-KV8 and `none`); one gradient accumulation packed equals the padded one.

Tolerances: log-probs ≤ 1e-6 (measured on a Zen 4 CPU: packed = padded bit for bit, 0.0; packed vs
each row alone 4.8e-7); gradients within 1e-5 · max|g| per entry (measured 2–4e-7: fp32 sums over
micro-batches of another composition are re-associated, and attention with gradients runs in fp32)."""
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.learner.batch import PolicyBatch
from agentq.learner import learner as learner_mod
from agentq.learner.learner import Learner
from agentq.learner.packing import PackLayout, plan_packs

SPECS = ("w8a8_kv8", "none")
LENGTHS = [3, 70, 12, 41, 130, 8, 55, 2]        # very different lengths; 130 > the budget below
BUDGET = 100


# ------------------------------------------------------------------ planner
def test_first_fit_decreasing_by_hand():
    # longest first: 9 → pack A (1 left), 7 → B (3 left), 5 → C, 3 → B (full), 1 → A (full)
    assert plan_packs([5, 9, 1, 7, 3], 10) == [[1, 2], [3, 4], [0]]
    # a row over the budget is packed alone; the rows after it open packs of their own
    assert plan_packs([12, 4, 4], 10) == [[0], [1, 2]]
    assert plan_packs([], 10) == []


def test_planner_refuses_bad_input():
    with pytest.raises(ValueError, match="max_tokens=0"):
        plan_packs([3], 0)
    with pytest.raises(ValueError, match="row 1 has length 0"):
        plan_packs([3, 0], 8)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 256))
def test_every_row_once_within_budget_and_deterministic(lengths, budget):
    packs = plan_packs(lengths, budget)
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    for p in packs:
        total = sum(lengths[i] for i in p)
        assert total <= budget or (len(p) == 1 and lengths[p[0]] > budget)   # only an oversize row alone
    assert plan_packs(list(lengths), budget) == packs
    # first fit: no pack opened later could have gone into an earlier one's room at that time;
    # weaker and checkable: no two packs both hold ≤ budget / 2 tokens (they would have merged)
    small = [p for p in packs if sum(lengths[i] for i in p) <= budget // 2]
    assert len(small) <= 1


def test_layout_positions_mask_and_unpack_by_hand():
    lay = PackLayout.of(torch.tensor([2, 3]))
    assert lay.total == 5 and lay.position_ids().tolist() == [[0, 1, 0, 1, 2]]
    m = lay.causal_block_mask()[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [0, 0, 1, 0, 0],
                 [0, 0, 1, 1, 0],
                 [0, 0, 1, 1, 1]]
    rows = torch.tensor([[10, 11, 0], [20, 21, 22]])
    packed = lay.pack(rows)
    assert packed.tolist() == [[10, 11, 20, 21, 22]]
    assert lay.unpack(packed, 3).tolist() == [[10, 11, 0], [20, 21, 22]]


# ------------------------------------------------------------------ packed forward
def mixed_batch(vocab: int, lengths=LENGTHS, seed: int = 0) -> PolicyBatch:
    """Right-padded rows of the given lengths: random ids, action tokens after a 2-token prompt in
    runs of 3 (turns 1, 2, …), rollout log-probs near a uniform policy's, random advantages."""
    g = torch.Generator().manual_seed(seed)
    b, L = len(lengths), max(lengths)
    attn = (torch.arange(L)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(3, vocab, (b, L), generator=g) * attn
    pos = torch.arange(L)[None].expand(b, L)
    act = ((pos >= 2) & ((pos // 3) % 2 == 0)).float() * attn
    seg = (pos // 6 + 1) * act.long()
    rollout = (-torch.log(torch.tensor(float(vocab))) - 0.1 * torch.rand(b, L, generator=g)) * act
    return PolicyBatch(ids, attn, act, seg, rollout, torch.randn(b, generator=g))


@pytest.fixture(scope="module")
def vocab(tiny_model_dir) -> int:
    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size


def alone(learner: Learner, batch: PolicyBatch) -> torch.Tensor:
    """Each row scored by itself, unpadded (the independent reference)."""
    out = torch.zeros(batch.input_ids.shape)
    for i, n in enumerate(batch.attention_mask.sum(1).tolist()):
        one = batch.index(torch.tensor([i])).trim(n)
        out[i, :n] = learner.logprobs(one)[0]
    return out


def mask_only(monkeypatch) -> None:
    """Packed forwards without the row boundaries: rows kept apart by the 4D block mask alone
    (what an attention function that ignores HF's varlen kwargs sees)."""
    monkeypatch.setattr(learner_mod, "packed_sequence_logprobs",
                        functools.partial(learner_mod.packed_sequence_logprobs, row_bounds=False))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("by", ["row_bounds", "mask_only"])
def test_packed_logprobs_equal_padded_and_alone(tiny_model_dir, vocab, spec, by, monkeypatch):
    batch = mixed_batch(vocab)
    padded = Learner(str(tiny_model_dir), QuantSpec.preset(spec), use_reference=False, micro_batch_size=3)
    packed = Learner(str(tiny_model_dir), QuantSpec.preset(spec), use_reference=False, pack_tokens=BUDGET)
    plan = packed.micro_batches(batch.attention_mask.sum(1))
    # 130 alone (over the budget); 70 + 12 + 8 + 3 + 2 = 95; 55 + 41 = 96
    assert [p.tolist() for p in plan] == [[4], [1, 2, 5, 0, 7], [6, 3]]
    if by == "mask_only":
        mask_only(monkeypatch)
    real = batch.attention_mask.bool()
    lp_packed, lp_padded, lp_alone = packed.logprobs(batch), padded.logprobs(batch), alone(padded, batch)
    d_padded = (lp_packed - lp_padded)[real].abs().max().item()
    d_alone = (lp_packed - lp_alone)[real].abs().max().item()
    print(f"\n{spec} {by}: packed vs padded max|Δ| = {d_padded:.2e}, vs alone {d_alone:.2e}")
    assert d_padded <= 1e-6 and d_alone <= 1e-6
    assert (lp_packed[:, 0] == 0).all() and (lp_packed[~real] == 0).all()
    assert lp_packed[real].abs().max() > 1.0      # real numbers, not zeros


@pytest.mark.parametrize("leak", ["mask_across_rows", "bounds_across_rows", "positions_run_on"])
def test_a_pack_that_leaks_across_rows_changes_the_logprobs(tiny_model_dir, vocab, monkeypatch, leak):
    """The comparison above can fail: a mask letting a row see the rows before it in its pack (mask
    alone), row boundaries that join the rows, or positions that do not restart per row (RoPE of
    the packed offset) move the log-probs."""
    batch = mixed_batch(vocab)
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False, pack_tokens=BUDGET)
    right = learner.logprobs(batch)
    if leak == "mask_across_rows":
        mask_only(monkeypatch)
        monkeypatch.setattr(PackLayout, "causal_block_mask",
                            lambda self, device="cpu": torch.ones(self.total, self.total, dtype=torch.bool,
                                                                  device=device).tril()[None, None])
    elif leak == "bounds_across_rows":
        monkeypatch.setattr(PackLayout, "bounds", lambda self: torch.tensor([0, self.total]))
    else:
        monkeypatch.setattr(PackLayout, "position_ids", lambda self: torch.arange(self.total)[None])
    wrong = learner.logprobs(batch)
    real = batch.attention_mask.bool()
    assert (right - wrong)[real].abs().max() > 1e-2


# ------------------------------------------------------------------ gradients
def step_gradient(learner: Learner, batch: PolicyBatch, objective) -> tuple[torch.Tensor, dict]:
    sums: dict[str, float] = {}
    assert learner.accumulate_grads(batch, objective, sums)
    return torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()]), sums


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_packed_gradient_equals_padded(tiny_model_dir, vocab, spec, loss_agg):
    """One accumulate_grads over packs (each weighted by its rows' share of the objective's units)
    gives the padded micro-batches' gradient and loss statistics."""
    objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.0, loss_agg=loss_agg)
    grads, stats = [], []
    for pack in (None, BUDGET, 60):
        learner = Learner(str(tiny_model_dir), QuantSpec.preset(spec), use_reference=False, micro_batch_size=3,
                          pack_tokens=pack)
        batch = mixed_batch(vocab)
        batch.old_logp = learner.logprobs(batch) - 0.01 * batch.action_mask      # ratios ≠ 1: non-trivial loss
        batch = batch.weighted(objective.prepare(batch))
        g, s = step_gradient(learner, batch, objective)
        grads.append(g)
        stats.append(s)
    for g, s in zip(grads[1:], stats[1:]):
        assert (g - grads[0]).abs().max() <= 1e-5 * grads[0].abs().max()
        assert s["loss"] == pytest.approx(stats[0]["loss"], rel=1e-5, abs=1e-9)
    assert grads[0].abs().max() > 0


def test_row_shards_then_packs_sum_to_the_whole_gradient(tiny_model_dir, vocab):
    """The data-parallel hook order (`local_rows`, then packs of those rows, shares of the whole
    minibatch's units): two shards' packed gradients add up to the one-process gradient (the
    all-reduce of `RankLearner`, summed here by hand instead of over gloo)."""
    from agentq.learner.distributed import shard_rows

    class Shard(Learner):
        rank = 0

        def local_rows(self, minib: PolicyBatch) -> torch.Tensor:
            return shard_rows(minib.attention_mask.sum(1), self.rank, 2)

    objective = make_objective("grpo", kl_coef=0.0)
    batch = mixed_batch(vocab)
    whole = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False, pack_tokens=BUDGET)
    batch.old_logp = whole.logprobs(batch) - 0.01 * batch.action_mask
    batch = batch.weighted(objective.prepare(batch))
    g_whole, _ = step_gradient(whole, batch, objective)
    shard = Shard(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False, pack_tokens=BUDGET)
    parts = []
    for rank in (0, 1):
        shard.rank = rank
        parts.append(step_gradient(shard, batch, objective)[0])
    assert (parts[0] + parts[1] - g_whole).abs().max() <= 1e-5 * g_whole.abs().max()
    assert parts[0].abs().max() > 0 and parts[1].abs().max() > 0


def test_packing_refuses_left_padded_rows_and_bad_budget(tiny_model_dir, vocab):
    with pytest.raises(ValueError, match="pack_tokens=0"):
        Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, pack_tokens=0)
    batch = mixed_batch(vocab, lengths=[4, 6])
    batch.attention_mask = batch.attention_mask.flip(1)
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, pack_tokens=8)
    with pytest.raises(ValueError, match="right-padded"):
        learner.logprobs(batch)


def test_packed_gradient_with_activation_checkpointing(tiny_model_dir, vocab):
    """Recomputed decoder layers get the packed positions and row boundaries again in backward."""
    objective = make_objective("grpo", kl_coef=0.0)
    grads = []
    for pack, ckpt in ((None, False), (BUDGET, True)):
        learner = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False, micro_batch_size=3,
                          pack_tokens=pack, activation_checkpointing=ckpt)
        batch = mixed_batch(vocab)
        batch.old_logp = learner.logprobs(batch) - 0.01 * batch.action_mask
        batch = batch.weighted(objective.prepare(batch))
        grads.append(step_gradient(learner, batch, objective)[0])
    assert (grads[1] - grads[0]).abs().max() <= 1e-5 * grads[0].abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_packed_logprobs_on_cuda_bf16_match_padded(tiny_model_dir, vocab):
    """The GPU path: bf16, aligned W8A8-KV8, causal attention per row through SDPA's fused kernel
    (packed) against the padded micro-batches: agreement to bf16 level (different kernels and
    reduction orders), and the same as fp32 CPU within the bf16 tolerance."""
    batch = mixed_batch(vocab)
    real = batch.action_mask.bool()              # the tokens the learner scores (0 elsewhere)
    spec = QuantSpec.preset("w8a8_kv8")
    kw = dict(use_reference=False, dtype=torch.bfloat16, device="cuda")
    lp_packed = Learner(str(tiny_model_dir), spec, pack_tokens=BUDGET, **kw).logprobs(batch)
    lp_padded = Learner(str(tiny_model_dir), spec, micro_batch_size=3, **kw).logprobs(batch)
    lp_cpu = Learner(str(tiny_model_dir), spec, use_reference=False, micro_batch_size=3).logprobs(batch)
    d = (lp_packed - lp_padded)[real].abs()
    d_cpu = (lp_packed - lp_cpu)[real].abs()
    print(f"\n[cuda bf16] packed vs padded max|Δ|={d.max():.3e} mean={d.mean():.3e}; vs fp32 CPU max|Δ|={d_cpu.max():.3e}")
    assert d.mean() < 2e-2 and d.max() < 0.25 and d_cpu.mean() < 5e-2
