"""GRPO base (docs/algorithms.md): k3 values, PPO dual-clip and k3-KL loss computed by hand,
advantages and the shared mismatch diagnostics."""
import math

import pytest
import torch

from agentq.algos import grpo_advantages, k3, kl_penalty_k3, make_objective, mismatch_metrics, ppo_dual_clip_loss
from agentq.algos.objective import Prepared
from algo_batches import example_batch, make_batch

TOL = 1e-6


def test_k3_unit_values():   # the mismatch diagnostics' k3
    delta = torch.tensor([0.3, -0.5, 1.2, 0.0, -2.0, 5.0, -5.0], dtype=torch.float64)
    assert k3(delta).tolist() == pytest.approx([0.049859, 0.106531, 1.120117, 0.0, 1.135335, 142.413159, 4.006738],
                                               abs=TOL)


def test_ppo_dual_clip_token_losses_by_hand():
    # ε = 0.2, c = 10.  (A, r) → u
    A = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 2.0, -0.5])
    r = torch.tensor([1.5, 0.5, 1.1, 0.5, 20.0, 1.1, 1.1, 3.0])
    u, clipped, dual, ratio = ppo_dual_clip_loss(torch.log(r), torch.zeros(8), A, 0.2, 10.0)
    # +1, r=1.5: max(−1.5, −1.2) = −1.2 (clipped);  +1, r=0.5: max(−0.5, −0.8) = −0.5
    # +1, r=1.1: −1.1;  −1, r=0.5: max(0.5, 0.8) = 0.8 (clipped);  −1, r=20: max(20, 1.2) = 20 → cap 10 (dual)
    # −1, r=1.1: 1.1;  +2, r=1.1: −2.2;  −0.5, r=3: max(1.5, 0.6) = 1.5 < cap 5 (no dual)
    assert u.tolist() == pytest.approx([-1.2, -0.5, -1.1, 0.8, 10.0, 1.1, -2.2, 1.5], abs=1e-6)
    assert clipped.tolist() == [True, False, False, True, False, False, False, False]
    assert dual.tolist() == [False, False, False, False, True, False, False, False]
    assert ratio.tolist() == pytest.approx(r.tolist(), rel=1e-6)


def test_ppo_per_token_clip_high():
    # clip_high tensor: bound 1 + 0.5 on the first token, 1 + 0.2 on the second
    u, clipped, _, _ = ppo_dual_clip_loss(torch.log(torch.tensor([1.4, 1.4])), torch.zeros(2), torch.ones(2), 0.2,
                                          10.0, clip_high=torch.tensor([0.5, 0.2]))
    assert u.tolist() == pytest.approx([-1.4, -1.2], abs=1e-6)
    assert clipped.tolist() == [False, True]


def test_kl_penalty_k3_clamped_at_10():
    logp = torch.zeros(3)
    kl = kl_penalty_k3(logp, torch.tensor([0.3, 5.0, -2.0]))   # κ = ref − logp
    assert kl.tolist() == pytest.approx([0.049859, 10.0, 1.135335], abs=TOL)


def _two_row_batch():
    """Row 0: A = +1, row 1: A = −1; each P A A O A with a padding token; r and κ = ref − logp chosen per token."""
    mask = [[0, 1, 1, 0, 1, 0], [0, 1, 1, 0, 1, 0]]
    seg = [[0, 1, 1, 0, 2, 0], [0, 1, 1, 0, 2, 0]]
    b = make_batch(mask, seg, [[0.0] * 6] * 2, adv=[1.0, -1.0])
    r = torch.tensor([[1.0, 1.5, 0.5, 1.0, 1.1, 1.0], [1.0, 0.5, 20.0, 1.0, 1.1, 1.0]])
    kappa = torch.tensor([[0.0, 0.3, -0.5, 0.0, 1.2, 0.0], [0.0, 0.0, -2.0, 0.0, 5.0, 0.0]])
    off = ~b.action_mask.bool()
    b.old_logp = torch.where(off, torch.full_like(b.old_logp, 50.0), b.old_logp)   # junk, never read
    logp = b.old_logp + torch.log(r)
    b.ref_logp = logp + kappa
    return b, logp


def test_grpo_loss_by_hand():
    b, logp = _two_row_batch()
    obj = make_objective("grpo")             # ε = 0.2, c = 10, β = 0.001
    b = b.weighted(obj.prepare(b))
    loss, stats = obj.loss(logp.clone().requires_grad_(True), b)
    # u = [−1.2, −0.5, −1.1 | 0.8, 10 (dual), 1.1] → mean 9.1 / 6
    # kl = [0.049859, 0.106531, 1.120117 | 0, 1.135335, min(142.41, 10)] → mean 12.411842 / 6
    pg, kl = 9.1 / 6, (0.049859 + 0.106531 + 1.120117 + 0.0 + 1.135335 + 10.0) / 6
    assert float(stats["pg_loss"]) == pytest.approx(pg, abs=TOL)
    assert float(stats["kl"]) == pytest.approx(kl, abs=TOL)
    assert float(loss.detach()) == pytest.approx(pg + 0.001 * kl, abs=TOL)
    assert float(stats["clip_frac"]) == pytest.approx(2 / 6)
    assert float(stats["clip_frac_high"]) == pytest.approx(1 / 6)
    assert float(stats["clip_frac_low"]) == pytest.approx(1 / 6)
    assert float(stats["dual_clip_frac"]) == pytest.approx(1 / 6)


def test_grpo_loss_gradient_by_hand():
    b, logp = _two_row_batch()
    obj = make_objective("grpo", kl_coef=0.0)
    b = b.weighted(obj.prepare(b))
    lp = logp.clone().requires_grad_(True)
    obj.loss(lp, b)[0].backward()
    # unclipped tokens: ∂u/∂logp = −A·r, divided by N = 6; clipped/dual tokens and non-actions: 0
    expected = torch.tensor([[0, 0, -0.5, 0, -1.1, 0], [0, 0, 0, 0, 1.1, 0]]) / 6
    assert torch.allclose(lp.grad, expected, atol=1e-6)


def test_seq_mean_counts_each_trajectory_once_by_hand():
    b, logp = _two_row_batch()
    b.action_mask[1, 1:3] = 0                 # row 1 keeps one action token: u = 1.1, kl = 10
    tok = make_objective("grpo")
    seq = make_objective("grpo", loss_agg="seq_mean")
    for obj in (tok, seq):
        b = b.weighted(obj.prepare(b))
    _, st_tok = tok.loss(logp, b)
    _, st_seq = seq.loss(logp, b)
    # token mean over 4 tokens: (−1.2 − 0.5 − 1.1 + 1.1) / 4; seq mean: ((−2.8 / 3) + 1.1) / 2
    assert float(st_tok["pg_loss"]) == pytest.approx(-1.7 / 4, abs=TOL)
    assert float(st_seq["pg_loss"]) == pytest.approx((-2.8 / 3 + 1.1) / 2, abs=TOL)
    # the KL term is aggregated the same way: ((0.049859 + 0.106531 + 1.120117) / 3 + 10) / 2
    assert float(st_seq["kl"]) == pytest.approx(((0.049859 + 0.106531 + 1.120117) / 3 + 10.0) / 2, abs=TOL)
    assert (tok.agg_units(b), seq.agg_units(b)) == (4.0, 2.0)
    with pytest.raises(ValueError, match="loss_agg.*valid"):
        make_objective("grpo", loss_agg="sum")


def _split_trajectory_batch():
    """Trajectory 5 over rows 0 (2 action tokens) and 1 (1 token), A = +1; trajectory 9 is row 2 (2
    tokens), A = −1. r and κ = ref − logp per token; rows are P A A."""
    b = make_batch([[0, 1, 1], [0, 1, 0], [0, 1, 1]], [[0, 1, 1], [0, 2, 0], [0, 1, 1]], [[0.0] * 3] * 3,
                   adv=[1.0, 1.0, -1.0], traj_id=[5, 5, 9])
    r = torch.tensor([[1.0, 1.1, 0.9], [1.0, 1.05, 1.0], [1.0, 1.0, 0.5]])
    kappa = torch.tensor([[0.0, 0.3, -0.5], [0.0, 1.2, 0.0], [0.0, 0.0, -2.0]])
    logp = b.old_logp + torch.log(r)
    b.ref_logp = logp + kappa
    return b, logp


def test_seq_mean_averages_trajectories_split_over_rows_by_hand():
    b, logp = _split_trajectory_batch()
    obj = make_objective("grpo", loss_agg="seq_mean")          # β = 0.001
    b = b.weighted(obj.prepare(b))
    lp = logp.clone().requires_grad_(True)
    loss, stats = obj.loss(lp, b)
    # u = [−1.1, −0.9 | −1.05 | 1.0, max(0.5, 0.8) = 0.8 (clipped)]: trajectory 5's token mean
    # −3.05 / 3, trajectory 9's 1.8 / 2, averaged over 2 trajectories (per row it was (−1 − 1.05 + 0.9) / 3)
    pg = (-3.05 / 3 + 1.8 / 2) / 2
    kl = ((0.049859 + 0.106531 + 1.120117) / 3 + (0.0 + 1.135335) / 2) / 2
    assert float(stats["pg_loss"]) == pytest.approx(pg, abs=TOL)
    assert float(stats["kl"]) == pytest.approx(kl, abs=TOL)
    assert obj.agg_units(b) == pytest.approx(2.0, abs=1e-12)
    loss.backward()
    # ∂u/∂logp = −A·r on unclipped tokens, ÷ (trajectory's tokens · 2 trajectories); KL's ∂kl/∂logp
    # = 1 − e^κ, weighted by β
    dkl = lambda k: (1 - math.exp(k))                                       # noqa: E731
    want = [[0, (-1.1 + 0.001 * dkl(0.3)) / 6, (-0.9 + 0.001 * dkl(-0.5)) / 6],
            [0, (-1.05 + 0.001 * dkl(1.2)) / 6, 0],
            [0, (1.0 + 0.001 * dkl(0.0)) / 4, (0.0 + 0.001 * dkl(-2.0)) / 4]]
    assert lp.grad.tolist() == [pytest.approx(row, abs=1e-7) for row in want]


def test_seq_mean_micro_batches_carry_the_minibatch_trajectory_counts():
    """Micro-batches {0, 2} and {1} split trajectory 5: with `minibatch_extra`'s counts (3, 3, 2) their
    units are 2/3 + 1 and 1/3, and loss × share adds up to the minibatch's loss and gradient."""
    b, logp = _split_trajectory_batch()
    obj = make_objective("grpo", loss_agg="seq_mean")
    b = b.weighted(obj.prepare(b))
    extra = obj.minibatch_extra(b)
    assert extra["traj_action_tokens"].tolist() == [3.0, 3.0, 2.0]
    mb = b.weighted(Prepared(b.token_weight, extra))
    lp = logp.clone().requires_grad_(True)
    whole = obj.loss(lp, b)[0]
    g_whole, = torch.autograd.grad(whole, lp)
    parts = [mb.index(torch.tensor(rows)) for rows in ([0, 2], [1])]
    assert [obj.agg_units(p) for p in parts] == [pytest.approx(5 / 3), pytest.approx(1 / 3)]
    acc = sum(obj.loss(lp[rows], p)[0] * obj.agg_units(p) / 2.0 for rows, p in zip(([0, 2], [1]), parts))
    g_acc, = torch.autograd.grad(acc, lp)
    assert float(acc.detach()) == pytest.approx(float(whole.detach()), abs=1e-7)
    assert torch.allclose(g_acc, g_whole, atol=1e-7, rtol=0)
    assert make_objective("grpo").minibatch_extra(b) == {}        # token_mean needs no count
    b.traj_id = None
    assert obj.minibatch_extra(b) == {}                             # nor does one row per trajectory


def test_grpo_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 2])
    adv = grpo_advantages(rewards, groups)
    s = math.sqrt(1 / 3)     # unbiased std of [1, 0, 0, 1]
    assert adv.tolist() == pytest.approx([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6),
                                          0.0, 0.0], abs=1e-6)


def test_grpo_group_of_one_has_zero_advantage_and_no_policy_gradient():
    """A group left with one rollout (its siblings errored and were dropped) has no baseline: agentq
    gives Â = 0 whatever its reward (verl would use score / (1 + ε), an uncentred REINFORCE term on
    another scale than its normalised neighbours). Its tokens then carry no policy gradient; only
    the KL term reaches them."""
    rewards = torch.tensor([1.0, 0.0, 1.0, -0.3])
    groups = torch.tensor([0, 0, 1, 2])               # groups 1 and 2: one survivor each
    adv = grpo_advantages(rewards, groups)
    assert adv[2:].tolist() == [0.0, 0.0]
    assert adv[0] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-6)
    b = make_batch([[1, 1], [1, 1], [1, 1], [1, 1]], [[1, 1]] * 4, [[0.0, 0.0]] * 4, adv=adv.tolist())
    logp = (b.old_logp + 0.1).clone().requires_grad_(True)
    loss, _ = make_objective("grpo", kl_coef=0.0).loss(logp, b)
    loss.backward()
    assert logp.grad[2:].abs().max() == 0 and logp.grad[:2].abs().max() > 0


def test_mismatch_metrics_on_worked_example():
    mm = mismatch_metrics(example_batch())
    assert mm["k3"] == pytest.approx(0.00432594, abs=1e-8)
    assert len(mm["k3_by_turn"]) == 3
    assert mm["dlogp_abs_mean"] == pytest.approx(0.61 / 9, abs=TOL)
    # sorted |δ| = 0, .01, .02, .03, .05, .05, .10, .15, .20; p99 at 0.99·8 = 7.92 → .15 + .92·.05
    assert mm["dlogp_abs_p99"] == pytest.approx(0.196, abs=TOL)
    assert mm["dlogp_abs_max"] == pytest.approx(0.20, abs=TOL)


def test_mismatch_metrics_ignore_observation_tokens_and_empty_turns():
    b = make_batch([[0, 1, 0, 1]], [[0, 1, 0, 3]], [[9.0, 0.3, -7.0, -0.5]])   # δ on non-actions is junk
    mm = mismatch_metrics(b)
    assert mm["k3"] == pytest.approx((0.049859 + 0.106531) / 2, abs=TOL)
    assert mm["k3_by_turn"][0] == pytest.approx(0.049859, abs=TOL)
    assert math.isnan(mm["k3_by_turn"][1])                  # no action token at turn 2
    assert mm["k3_by_turn"][2] == pytest.approx(0.106531, abs=TOL)
    assert mm["dlogp_abs_max"] == pytest.approx(0.5, abs=TOL)
    b.old_logp = None
    assert mismatch_metrics(b) == {}



@pytest.mark.parametrize("G, reward", [(8, -0.1), (8, 0.9), (6, -0.3), (16, -0.2), (3, 0.9), (7, 1 / 3)])
def test_grpo_all_equal_rewards_give_exactly_zero_advantage(G, reward):
    """methods.md §4.4: "Groups with zero advantage variance give zero loss whatever α is". float32's
    mean of G equal rewards is not always the reward itself: G = 8 rewards of −0.1 (one invalid-action
    penalty each, conf/pipeline.yaml) gave every episode Â = +0.0074, a push of one sign on the whole
    group (G = 8 of 0.9: −0.056). Â must be 0 exactly, and then so is the policy loss."""
    rewards = torch.tensor([reward] * G + [1.0, 0.0], dtype=torch.float32)
    groups = torch.tensor([0] * G + [1, 1])
    adv = grpo_advantages(rewards, groups)
    assert adv[:G].tolist() == [0.0] * G
    assert adv[G:].abs().min() > 0.5                      # a group with a reward spread still learns
    b = make_batch([[1, 1]] * G, [[1, 1]] * G, [[0.3, -0.2]] * G, adv=adv[:G].tolist())
    logp = (b.old_logp + 0.05).requires_grad_(True)
    obj = make_objective("interq", H_floor=0.0, kl_coef=0.0)
    loss, _ = obj.loss(logp, b.weighted(obj.prepare(b)))
    loss.backward()
    assert float(loss.detach()) == 0.0 and float(logp.grad.abs().max()) == 0.0
