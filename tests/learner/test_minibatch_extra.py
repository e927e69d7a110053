"""Minibatch statistics a loss reads (`Objective.minibatch_extra`), attached by
`Learner.accumulate_grads` to every row before the micro-batch, pack or rank split, so a step's
gradient is the minibatch's "as if it were one forward" whatever micro_batch_size or packing:
InterQ-RL's `renorm_retention` (÷ the minibatch token-mean of α, methods.md §4.3) and `seq_mean`
over trajectories split across rows (`traj_id`).

The references are by hand: GRPO's token_mean loss with explicit token weights that give each
token the coefficient the formula says, one forward, none of the code under test. Tolerance as in
test_packing.py: gradients within 1e-5 · max|g| (fp32 sums over micro-batches re-associated)."""
from dataclasses import replace

import pytest
import torch

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.learner.batch import PolicyBatch
from agentq.learner.learner import Learner, batching_plans

from test_packing import mixed_batch, step_gradient, vocab  # noqa: F401  (vocab: a fixture)

LENGTHS = [3, 30, 12, 21, 40, 8, 25, 2]              # 8 rows; 40 > the pack budget below
ONE_FORWARD = {"micro_batch_size": 8}
BATCHINGS = [{"micro_batch_size": 1}, {"micro_batch_size": 2}, {"micro_batch_size": 4},
             {"micro_batch_size": 8, "pack_tokens": 36}]


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> Learner:
    return Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False)


def learner(model: Learner, micro_batch_size: int, pack_tokens: int | None = None) -> Learner:
    """`model` with these training micro-batches (its weights never change here: no optimizer step)."""
    model.train_batching, _ = batching_plans(micro_batch_size, pack_tokens, None, None)
    return model


def mismatched_batch(model: Learner, vocab: int) -> PolicyBatch:  # noqa: F811
    """mixed_batch with π_old from the model (ratios e^0.01) and rollout log-probs off by 0.002 on
    even rows, 0.8 on odd ones: α near 1 on some rows, well below on others."""
    batch = mixed_batch(vocab, lengths=LENGTHS)
    act = batch.action_mask
    batch.old_logp = model.logprobs(batch) - 0.01 * act
    pos = torch.arange(act.shape[1], dtype=torch.float32)
    shift = torch.tensor([0.002, 0.8] * 4).view(-1, 1)
    batch.rollout_logp = (batch.old_logp - shift * torch.sin(pos)) * act
    return batch


def hand_gradient(model: Learner, batch: PolicyBatch, token_weight: torch.Tensor) -> tuple[torch.Tensor, float]:
    """One forward of GRPO's token_mean loss Σ m·w·u / Σ m with the given w (no KL)."""
    g, sums = step_gradient(learner(model, **ONE_FORWARD), replace(batch, token_weight=token_weight),
                            make_objective("grpo", kl_coef=0.0))
    return g, sums["loss"]


def assert_close(got: tuple[torch.Tensor, dict], want: tuple[torch.Tensor, float]) -> None:
    assert (got[0] - want[0]).abs().max() <= 1e-5 * want[0].abs().max()
    assert got[1]["loss"] == pytest.approx(want[1], rel=1e-5, abs=1e-9)


def test_renorm_retention_gradient_does_not_depend_on_micro_batching(model, vocab):  # noqa: F811
    """w_t = α_t / (token-mean of α over the minibatch's action tokens) in every micro-batch and
    pack; before the fix each micro-batch divided by its own mean (14 % off at micro_batch_size 1)."""
    objective = make_objective("interq", kl_coef=0.0, renorm_retention=True)
    batch = mismatched_batch(model, vocab)
    batch = batch.weighted(objective.prepare(batch))
    act = batch.action_mask.bool()
    alpha = batch.extra["retention"].double()
    assert alpha[act].min() < 0.8 < 0.99 < alpha[act].max()                   # the rows' α differ
    want = hand_gradient(model, batch, (alpha / alpha[act].mean()).float() * act)
    assert_close(step_gradient(learner(model, **ONE_FORWARD), batch, objective), want)
    for batching in BATCHINGS:
        assert_close(step_gradient(learner(model, **batching), batch, objective), want)


def test_seq_mean_over_split_trajectories_does_not_depend_on_micro_batching(model, vocab):  # noqa: F811
    """Rows (0, 1), (2, 3), (4, 5), (6, 7) are four trajectories (`traj_id`): each token's coefficient
    is 1 / (its trajectory's action tokens · 4), i.e. token_mean with w = N / (N_traj · 4)."""
    objective = make_objective("grpo", kl_coef=0.0, loss_agg="seq_mean")
    batch = mismatched_batch(model, vocab)
    batch.traj_id = torch.arange(8) // 2
    batch = batch.weighted(objective.prepare(batch))
    act = batch.action_mask
    n = act.sum(1)
    n_traj = (n.view(4, 2).sum(1)).repeat_interleave(2)                      # [8] each row's trajectory's
    assert bool((n_traj > 0).all())
    want = hand_gradient(model, batch, act * (n.sum() / (n_traj * 4)).view(-1, 1))
    assert_close(step_gradient(learner(model, **ONE_FORWARD), batch, objective), want)
    for batching in BATCHINGS:
        assert_close(step_gradient(learner(model, **batching), batch, objective), want)


def test_renorm_mean_is_the_minibatch_s_on_every_rank(tiny_model_dir, model, vocab):  # noqa: F811
    """The data-parallel hook order: `minibatch_extra` before `local_rows`, so two shards' gradients
    (each rank's share of the minibatch) add up to the hand gradient."""
    from agentq.learner.distributed import shard_rows

    class Shard(Learner):
        rank = 0

        def local_rows(self, minib: PolicyBatch) -> torch.Tensor:
            return shard_rows(minib.attention_mask.sum(1), self.rank, 2)

    objective = make_objective("interq", kl_coef=0.0, renorm_retention=True)
    batch = mismatched_batch(model, vocab)
    batch = batch.weighted(objective.prepare(batch))
    act = batch.action_mask.bool()
    alpha = batch.extra["retention"].double()
    want, _ = hand_gradient(model, batch, (alpha / alpha[act].mean()).float() * act)
    shard = Shard(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, micro_batch_size=2)
    parts = []
    for rank in (0, 1):
        shard.rank = rank
        parts.append(step_gradient(shard, batch, objective)[0])
    assert (parts[0] + parts[1] - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("name, loss_agg", [("grpo", "seq_mean"), ("grpo", "token_mean"), ("tbpo", "token_mean"),
                                            ("tbpo", "seq_mean")])
def test_clip_and_ratio_stats_do_not_depend_on_micro_batching(model, vocab, name, loss_agg):  # noqa: F811
    """clip_frac, dual_clip_frac and ratio_mean are token fractions and means (TBPO's over sequences),
    but each micro-batch's value was weighted by its share of `agg_units`: under seq_mean (trajectories)
    they changed with micro_batch_size while the update did not. Now each weighs by its own units
    (`stat_units`); the references are by hand from the ratios. Rows' π_old lie 0.01 or 0.3 nats below
    the model's, so ratios e^0.01 and e^0.3 (clipped at ε = 0.2 where Â > 0)."""
    objective = make_objective(name, kl_coef=0.0, loss_agg=loss_agg)
    batch = mixed_batch(vocab, lengths=LENGTHS)
    act = batch.action_mask
    shift = torch.tensor([0.01, 0.3] * 4)
    batch.old_logp = model.logprobs(batch) - shift.view(-1, 1) * act
    batch = batch.weighted(objective.prepare(batch))
    ratio, pos = shift.double().exp(), batch.adv > 0
    if name == "grpo":          # per token: its row's ratio; clipped above 1.2 with Â > 0 (below 0.8 with Â < 0: none)
        n = act.sum(1).double()
        want = {"clip_frac": float((n * ((ratio > 1.2) & pos)).sum() / n.sum()),
                "clip_frac_high": float((n * ((ratio > 1.2) & pos)).sum() / n.sum()),
                "ratio_mean": float((n * ratio).sum() / n.sum()), "dual_clip_frac": 0.0}
    else:   # per sequence: e^(mean log-ratio) = its row's ratio, above every band's top (1 + 4e-4, 1 + 7e-4):
        has = act.sum(1) > 0        # clipped where Â > 0, capped by the negative band's top (dual) where Â < 0
        want = {"clip_frac": float(pos[has].double().mean()), "ratio_mean": float(ratio[has].mean()),
                "dual_clip_frac": float((~pos)[has].double().mean())}
    assert 0 < want["clip_frac"] < 1
    for batching in [ONE_FORWARD, *BATCHINGS]:
        sums = step_gradient(learner(model, **batching), batch, objective)[1]
        for k, v in want.items():
            assert sums[k] == pytest.approx(v, rel=1e-5, abs=1e-12), (batching, k)
