"""InterQ-RL retention (docs/algorithms.md): the worked example, the uniform-mismatch table, and the
known properties. Hand numbers are computed by hand; tolerances are 1e-6 unless fewer digits are known."""
import math

import pytest
import torch

from agentq.algos import interq_retention, make_objective, mismatch_metrics, prefix_retention
from agentq.algos import quantile
from agentq.algos.interq import retention_stats
from agentq.algos.objective import Prepared
from algo_batches import (EX_ACTION_MASK, EX_DELTA, EX_SEG_ID, concat_layout, example_batch, make_batch, prepared,
                          random_trajectories, split_layout)

TOL = 1e-6
A = [4, 5, 6, 10, 11, 14, 15, 16, 17]   # action positions of the worked example


def approx(x, tol=TOL):
    return pytest.approx(x, abs=tol)


# ---------------------------------------------------------------------- worked example
def test_example_k3_per_token_and_segment_quantities():
    r = interq_retention(example_batch())
    k3_tok = torch.expm1(torch.tensor([0.02, -0.03, 0.01, 0.10, -0.05, -0.20, 0.05, 0.0, 0.15],
                                      dtype=torch.float64))
    k3_tok = k3_tok - torch.tensor([0.02, -0.03, 0.01, 0.10, -0.05, -0.20, 0.05, 0.0, 0.15], dtype=torch.float64)
    assert k3_tok.tolist() == approx([0.00020134, 0.00044553, 0.00005017, 0.00517092, 0.00122942,
                                      0.01873075, 0.00127110, 0.0, 0.01183424], 1e-8)
    assert r.m[0].tolist() == approx([0.00069704, 0.00640034, 0.03183609], 1e-8)
    assert r.H[0].tolist() == approx([0.00069704, 0.00709738, 0.03893348], 1e-8)
    assert torch.exp(-r.H[0]).tolist() == approx([0.99930320, 0.99292774, 0.96181469], 1e-8)   # ρ_s
    assert float(r.Htot[0]) == approx(0.04672790, 1e-8)
    assert r.n[0].tolist() == [3, 2, 4]


def test_example_fixed_budget():
    r = interq_retention(example_batch(), budget_B=1.0, H_floor=0.0)
    assert float(r.kappa[0]) == approx(21.400491)
    assert r.d[0].tolist() == approx([0.014917, 0.151887, 0.833195])
    assert float(r.d[0].sum()) == approx(1.0, 1e-12)
    assert r.alpha[0].tolist() == approx([0.985194, 0.859085, 0.434658])


def test_example_fixed_budget_from_float32_log_probs():
    # what the trainer stores: float32 log-probs; α still matches the printed numbers to 1e-5
    r = interq_retention(example_batch(dtype=torch.float32))
    assert r.alpha[0].tolist() == approx([0.985194, 0.859085, 0.434658], 1e-5)


def test_example_capped_mode():
    r = interq_retention(example_batch(), budget_B=1.0, H_floor=1.0)
    assert float(r.kappa[0]) == approx(1.0, 1e-12)
    assert r.d[0].tolist() == approx([0.00069704, 0.00709738, 0.03893348], 1e-8)   # methods.md §4.5: d = H
    assert r.alpha[0].tolist() == approx([0.999303, 0.992928, 0.961815])


def test_example_half_budget():
    r = interq_retention(example_batch(), budget_B=0.5)
    assert r.alpha[0].tolist() == approx([0.992569, 0.926868, 0.659286])


def test_example_exclusive_prefix():
    r = interq_retention(example_batch(), prefix_inclusive=False)
    assert r.H[0].tolist() == approx([0.0, 0.00069704, 0.00709738], 1e-8)
    assert float(r.alpha[0, 0]) == 1.0
    # κ = 1 / (0.00069704 + 0.00709738), α = exp(−κ·H): hand-computed from the printed H
    kappa = 1.0 / (0.00069704 + 0.00709738)
    assert r.alpha[0].tolist() == approx([1.0, math.exp(-kappa * 0.00069704), math.exp(-kappa * 0.00709738)], 1e-5)


def test_example_per_token_weights_and_batch_k3():
    b = example_batch()
    b = b.weighted(make_objective("interq", H_floor=0.0).prepare(b))   # fixed budget (the default is capped)
    w = [0.0] * 18
    for pos in (4, 5, 6):
        w[pos] = 0.985194
    for pos in (10, 11):
        w[pos] = 0.859085
    for pos in (14, 15, 16, 17):
        w[pos] = 0.434658
    assert b.token_weight[0].tolist() == approx(w)
    assert not b.token_weight.requires_grad
    mm = mismatch_metrics(b)
    assert mm["k3"] == approx(0.00432594, 1e-8)
    delta = (b.old_logp - b.rollout_logp).double()[0, A]
    assert float(delta.mean()) == approx(0.00555556)
    assert mm["k3_by_turn"] == approx([0.00069704 / 3, 0.00640034 / 2, 0.03183609 / 4], 1e-8)


def test_example_stats():
    b = example_batch()
    b, stats = prepared(make_objective("interq", H_floor=0.0), b)
    assert stats["alpha_min"] == approx(0.434658)
    assert stats["alpha_median"] == approx(0.859085)
    assert stats["alpha_max"] == approx(0.985194)
    assert stats["alpha_range_width"] == approx(0.985194 - 0.434658)
    assert stats["alpha_p10"] == approx(0.434658 + 0.2 * (0.859085 - 0.434658))   # linear interpolation
    assert stats["alpha_frac_below_half"] == approx(4 / 9)


# ---------------------------------------------------------------------- uniform-mismatch table
UNIFORM_TABLE = {   # S: (α_1 … α_S as printed, median)
    1: ([0.368], 0.368),
    2: ([0.717, 0.513], 0.615),
    3: ([0.846, 0.717, 0.607], 0.717),
    5: ([0.936, 0.875, 0.819, 0.766, 0.717], 0.819),
    10: ([0.982] + [None] * 8 + [0.834], 0.905),
    16: ([0.993] + [None] * 14 + [0.889], 0.939),
}


@pytest.mark.parametrize("S", range(1, 17))
def test_uniform_mismatch_table(S):
    # equal m_s → H_s = s·m, Htot = m·S(S+1)/2, d_s = 2s / (S(S+1)) whatever m is
    for m_level in (1e-4, 0.3):
        m = torch.full((1, S), m_level, dtype=torch.float64)
        out = prefix_retention(m, torch.ones(1, S, dtype=torch.bool), torch.tensor([1.0], dtype=torch.float64), 0.0)
        alpha = out["alpha"][0]
        expected = [math.exp(-2 * s / (S * (S + 1))) for s in range(1, S + 1)]
        assert alpha.tolist() == approx(expected, 1e-12)
        if S in UNIFORM_TABLE:
            printed, median = UNIFORM_TABLE[S]
            for a, p in zip(alpha.tolist(), printed):
                if p is not None:
                    assert round(a, 3) == p
            assert round(quantile(alpha, 0.5), 3) == median   # even S: mean of the two middle values


def test_uniform_table_medians_through_objective_stats():
    # the same table through a real batch: S equal segments of one token with the same δ
    for S, (_, median) in UNIFORM_TABLE.items():
        b = make_batch([1] * S, list(range(1, S + 1)), [0.1] * S)
        b, stats = prepared(make_objective("interq", H_floor=0.0), b)
        assert round(stats["alpha_median"], 3) == median


# ---------------------------------------------------------------------- properties
def _random_concat(seed, n_traj=6, **kw):
    gen = torch.Generator().manual_seed(seed)
    trajs = random_trajectories(gen, n_traj, **kw)
    return trajs, concat_layout(trajs)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("B", [1.0, 0.5, 2.0])
def test_bounds_monotone_and_budget(seed, B):
    trajs, b = _random_concat(seed)
    r = interq_retention(b, budget_B=B)
    for i, segs in enumerate(trajs):
        S = len(segs)
        assert int(r.num_segments[i]) == S or not segs[-1][1]   # trailing empty turn leaves no seg_id
        a = r.alpha[i, :int(r.num_segments[i])]
        assert bool((a >= math.exp(-B) - 1e-12).all()) and bool((a <= 1.0).all())
        assert bool((a[1:] <= a[:-1] + 1e-15).all())                       # non-increasing in s
        if float(r.Htot[i]) > 0:
            assert float(r.d[i].sum()) == approx(B, 1e-9)                  # Σ d_s = B
    # token weights: α of the token's segment on action tokens, 0 elsewhere
    b = b.weighted(make_objective("interq", budget_B=B).prepare(b))
    assert bool((b.token_weight[~b.action_mask.bool()] == 0).all())
    assert bool((b.token_weight[b.action_mask.bool()] >= math.exp(-B) - 1e-6).all())


def _inverse_k3_positive(k):
    """δ > 0 with exp(δ) − 1 − δ = k (bisection, vectorised)."""
    lo, hi = torch.zeros_like(k), torch.full_like(k, 20.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        big = torch.expm1(mid) - mid > k
        hi, lo = torch.where(big, mid, hi), torch.where(big, lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("c", [0.1, 3.0, 40.0])
def test_fixed_mode_invariant_to_scaling_all_k3(c):
    gen = torch.Generator().manual_seed(1)
    trajs, b = _random_concat(5, n_traj=5)
    mask = b.action_mask.bool()
    k3_target = torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 0.05
    delta = torch.where(mask, _inverse_k3_positive(k3_target), torch.zeros_like(k3_target))
    delta_c = torch.where(mask, _inverse_k3_positive(c * k3_target), torch.zeros_like(k3_target))
    b1 = make_batch(b.action_mask, b.seg_id, delta, dtype=torch.float64)
    b2 = make_batch(b.action_mask, b.seg_id, delta_c, dtype=torch.float64)
    r1, r2 = interq_retention(b1), interq_retention(b2)
    assert torch.allclose(r2.m, c * r1.m, rtol=1e-9, atol=1e-15)
    assert torch.allclose(r1.alpha, r2.alpha, rtol=0, atol=1e-9)
    # capped mode is *not* invariant (it encodes the level): sanity check the test can fail
    r1c, r2c = interq_retention(b1, H_floor=1.0), interq_retention(b2, H_floor=1.0)
    assert not torch.allclose(r1c.alpha, r2c.alpha, atol=1e-6)


def test_all_zero_delta_gives_alpha_one():
    trajs, b = _random_concat(3)
    b.old_logp = torch.where(b.action_mask.bool(), b.rollout_logp, b.old_logp)   # bit-identical log-probs
    r = interq_retention(b)
    assert bool((r.Htot == 0).all())
    assert bool((r.alpha == 1.0).all())
    b = b.weighted(make_objective("interq").prepare(b))
    assert torch.equal(b.token_weight, b.action_mask.float())
    # capped mode too (κ finite, H = 0)
    assert bool((interq_retention(b, H_floor=1.0).alpha == 1.0).all())


@pytest.mark.parametrize("seed", range(5))
def test_inserting_observation_tokens_leaves_alpha_unchanged(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    trajs = random_trajectories(gen, 5)
    more_obs = [[(obs + int(torch.randint(1, 9, (1,), generator=gen)), d) for obs, d in segs] for segs in trajs]
    no_obs = [[(0, d) for _, d in segs] for segs in trajs]
    rs = [interq_retention(concat_layout(t, prompt_len=p)) for t, p in ((trajs, 3), (more_obs, 11), (no_obs, 1))]
    for r in rs[1:]:
        assert torch.allclose(r.alpha, rs[0].alpha, rtol=0, atol=1e-14)
        assert torch.allclose(r.retention[r.retention > 0], rs[0].retention[rs[0].retention > 0], rtol=0, atol=1e-14)


@pytest.mark.parametrize("seed", range(5))
def test_row_split_and_concatenated_layouts_agree(seed):
    gen = torch.Generator().manual_seed(200 + seed)
    trajs = random_trajectories(gen, 6)
    cat, split = concat_layout(trajs), split_layout(trajs)
    for kw in ({}, {"H_floor": 1.0}, {"prefix_inclusive": False}, {"budget_scope": "segment", "budget_B": 0.2}):
        rc, rs = interq_retention(cat, **kw), interq_retention(split, **kw)
        # trajectories whose last turn is empty have one segment fewer visible in both layouts
        assert torch.allclose(rc.alpha, rs.alpha, rtol=0, atol=1e-12)
        # per-token weights: the same multiset of (trajectory, segment, α) in both layouts
        row = 0
        for i, segs in enumerate(trajs):
            for s, (_, d) in enumerate(segs, start=1):
                if not d:
                    continue
                tok_split = rs.retention[row][split.action_mask[row].bool()]
                tok_cat = rc.retention[i][cat.seg_id[i] == s]
                assert torch.allclose(tok_split, tok_cat, rtol=0, atol=1e-12)
                row += 1


@pytest.mark.parametrize("seed", range(3))
def test_alpha_of_a_trajectory_does_not_depend_on_the_rest_of_the_batch(seed):
    # trajectories of different lengths batched together: each one's α equals its α alone, and
    # columns beyond its last segment carry no displacement
    gen = torch.Generator().manual_seed(300 + seed)
    trajs = random_trajectories(gen, 6, max_seg=8)
    for kw in ({}, {"H_floor": 1.0}, {"budget_scope": "segment", "budget_B": 0.3}):
        r = interq_retention(concat_layout(trajs), **kw)
        for i, segs in enumerate(trajs):
            alone = interq_retention(concat_layout([segs]), **kw)
            S = alone.alpha.shape[1]
            assert torch.allclose(r.alpha[i, :S], alone.alpha[0], rtol=0, atol=1e-12)
            assert bool((r.d[i, S:] == 0).all()) and bool((r.alpha[i, S:] == 1).all())
            assert float(r.Htot[i]) == approx(float(alone.Htot[0]), 1e-15)


def test_capped_mode_small_mismatch_gives_rho():
    b = example_batch()     # Htot = 0.047 < H_floor = 1: κ = 1, α = ρ exactly
    r = interq_retention(b, H_floor=1.0)
    assert torch.allclose(r.alpha, torch.exp(-r.H), rtol=0, atol=1e-15)
    # large mismatch in capped mode: κ = B / Htot < 1, Σ d = B again
    big = make_batch(EX_ACTION_MASK, [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 2, 2, 0, 0, 3, 3, 3, 3], [3.0 * x for x in
                     [0, 0, 0, 0, 0.2, -0.3, 0.1, 0, 0, 0, 1.0, -0.5, 0, 0, -2.0, 0.5, 0.0, 1.5]])
    r = interq_retention(big, H_floor=1.0)
    assert float(r.Htot[0]) > 1.0
    assert float(r.d[0].sum()) == approx(1.0, 1e-12)


def test_zero_budget_gives_alpha_one_in_both_modes():
    # B = 0: κ = 0, d = 0, α = 1 whatever the mismatch (fixed and capped, either scope)
    for kw in ({"H_floor": 0.0}, {"H_floor": 1.0}, {"H_floor": 0.0, "budget_scope": "segment"}):
        r = interq_retention(example_batch(), budget_B=0.0, **kw)
        assert bool((r.alpha == 1.0).all()) and bool((r.d == 0.0).all())
    b, _ = prepared(make_objective("interq", budget_B=0.0, H_floor=0.0), example_batch())
    assert torch.equal(b.token_weight, b.action_mask.float())


def test_single_segment_fixed_mode_is_e_to_minus_B():
    for delta in (1e-4, 0.5):
        b = make_batch([0, 1, 1], [0, 1, 1], [0, delta, -delta])
        assert float(interq_retention(b).alpha[0, 0]) == approx(math.exp(-1.0), 1e-12)
        assert float(interq_retention(b, budget_B=0.5).alpha[0, 0]) == approx(math.exp(-0.5), 1e-12)


def test_budget_scope_segment():
    b = example_batch()
    r = interq_retention(b, budget_B=0.25, budget_scope="segment")   # B_i = 0.25 · 3
    assert float(r.d[0].sum()) == approx(0.75, 1e-12)
    assert r.alpha[0].tolist() == approx(torch.exp(-0.75 * r.H[0] / r.Htot[0]).tolist(), 1e-12)


def test_budget_scope_segment_keeps_the_capped_mode():
    """segment scope scales the floor with the budget (F_i = H_floor·S_i): H_floor = budget_B is still
    κ ≤ 1 and α_s ≥ ρ_s (the worked example, S = 3, Htot = 0.04672790)."""
    rho = [0.999303, 0.992928, 0.961815]
    # b = H_floor = 1: B_i = F_i = 3 > Htot, κ = 1, α = ρ (before the fix κ = 3 and α = ρ³)
    r = interq_retention(example_batch(), budget_B=1.0, H_floor=1.0, budget_scope="segment")
    assert float(r.kappa[0]) == approx(1.0, 1e-12)
    assert r.alpha[0].tolist() == approx(rho)
    # b = H_floor = 0.02: F_i = 0.06 > Htot still, κ = 1 (the trajectory's floor scales, not just b)
    r = interq_retention(example_batch(), budget_B=0.02, H_floor=0.02, budget_scope="segment")
    assert r.alpha[0].tolist() == approx(rho)
    # b = H_floor = 0.01: F_i = 0.03 < Htot, the fixed budget 0.03: κ = 0.03 / 0.0467279 = 0.642015,
    # d = κ·H = (0.000448, 0.004557, 0.024996), α = e^−d
    r = interq_retention(example_batch(), budget_B=0.01, H_floor=0.01, budget_scope="segment")
    assert float(r.kappa[0]) == approx(0.642015)
    assert r.d[0].tolist() == approx([0.000448, 0.004557, 0.024996])
    assert float(r.d[0].sum()) == approx(0.03, 1e-12)
    assert r.alpha[0].tolist() == approx([0.999553, 0.995454, 0.975314])
    # the objective's defaults (budget_B = H_floor = 1) in segment scope: w_t = ρ_seg(t)
    b, _ = prepared(make_objective("interq", budget_scope="segment"), example_batch())
    assert b.token_weight[0, A].tolist() == approx([rho[0]] * 3 + [rho[1]] * 2 + [rho[2]] * 4)


def test_k3_max_clamps_outlier_tokens():
    b = make_batch([1, 1, 1], [1, 2, 2], [0.1, 5.0, 0.0], dtype=torch.float64)   # k3(5) = 142.41 → 10
    r = interq_retention(b, k3_max=10.0)
    k3_01 = math.expm1(0.1) - 0.1
    assert r.m[0].tolist() == approx([k3_01, 10.0], 1e-9)
    r_none = interq_retention(b, k3_max=None)
    assert float(r_none.m[0, 1]) == approx(142.413159)


def test_empty_segments_keep_their_place():
    # turn 2 produced no tokens: H_2 = H_1 and it counts in Htot
    b = make_batch([1, 0, 1], [1, 0, 3], [0.1, 0.0, 0.2], dtype=torch.float64)
    r = interq_retention(b)
    m1, m3 = math.expm1(0.1) - 0.1, math.expm1(0.2) - 0.2
    H = [m1, m1, m1 + m3]
    assert r.H[0].tolist() == approx(H, 1e-12)
    assert r.alpha[0].tolist() == approx([math.exp(-h / sum(H)) for h in H], 1e-12)
    assert r.n[0].tolist() == [1, 0, 1]
    # trailing empty turn: declared through extra["num_segments"]
    b.extra["num_segments"] = torch.tensor([4])
    r = interq_retention(b)
    H4 = H + [m1 + m3]
    assert r.alpha[0].tolist() == approx([math.exp(-h / sum(H4)) for h in H4], 1e-12)
    # stats count only segments that carry a loss
    stats = retention_stats(r, b.action_mask)
    assert stats["alpha_max"] == approx(math.exp(-H4[0] / sum(H4)), 1e-12)


def test_action_token_without_segment_is_rejected():
    with pytest.raises(ValueError, match="seg_id"):
        interq_retention(make_batch([1, 1], [1, 0], [0.1, 0.1]))


# ---------------------------------------------------------------------- the objective
def test_options_token_tis_cap_and_renorm():
    b = example_batch()
    obj = make_objective("interq", token_tis_cap=1.05, renorm_retention=True)
    b, stats = prepared(obj, b)
    alpha = b.extra["retention"][0, A].double()
    delta = torch.tensor([0.02, -0.03, 0.01, 0.10, -0.05, -0.20, 0.05, 0.0, 0.15], dtype=torch.float64)
    tis = torch.exp(delta).clamp(max=1.05)
    assert b.token_weight[0, A].double().tolist() == approx((alpha * tis).tolist())
    assert stats["is_weight_max"] == approx(1.05)
    w = obj.token_weights(b)[0, A].double()      # ÷ token-mean of α over the minibatch
    assert w.tolist() == approx((alpha * tis / alpha.mean()).tolist(), 1e-6)


def _example_and_aligned_row():
    """Row 0: the worked example; row 1: 3 action tokens with δ = 0. Fixed budget (H_floor = 0): α of
    row 0's tokens 0.985194 ×3, 0.859085 ×2, 0.434658 ×4; row 1's 1 (Htot = 0)."""
    L = len(EX_ACTION_MASK)
    m1 = [0] * 4 + [1] * 3 + [0] * (L - 7)
    return make_batch([EX_ACTION_MASK, m1], [EX_SEG_ID, m1], [EX_DELTA, [0.0] * L], adv=[0.7, -1.2],
                      dtype=torch.float64)


def test_renorm_divides_by_the_minibatch_mean_in_every_micro_batch():
    """renorm_retention: w_t = α_t / (minibatch token-mean of α) in each micro-batch, from the
    minibatch's mean that `minibatch_extra` carries per row: Σα = 2.955582 + 1.718170 + 1.738632 + 3
    = 9.412384 over 12 tokens, mean 0.784365; row 1's weight 1 / 0.784365 = 1.274916. Before the fix
    a micro-batch of row 1 alone divided by its own mean, 1."""
    obj = make_objective("interq", H_floor=0.0, renorm_retention=True, kl_coef=0.0)
    b, _ = prepared(obj, _example_and_aligned_row())
    extra = obj.minibatch_extra(b)
    assert extra["retention_token_mean"].tolist() == approx([0.784365] * 2)
    mb = b.weighted(Prepared(b.token_weight, extra))
    alpha0 = [0.985194] * 3 + [0.859085] * 2 + [0.434658] * 4
    w_row1 = obj.token_weights(mb.index(torch.tensor([1])))[0, 4:7]
    assert w_row1.tolist() == approx([1.274916] * 3)
    w_row0 = obj.token_weights(mb.index(torch.tensor([0])))[0, A]
    assert w_row0.tolist() == approx([a / 0.784365 for a in alpha0])
    # a loss on the whole minibatch computes the same mean itself
    assert torch.allclose(obj.token_weights(b), obj.token_weights(mb))
    # accumulated over one-row micro-batches (share = tokens / 12), loss and gradient are the minibatch's
    logp = (b.old_logp + 0.01 * torch.arange(b.old_logp.numel()).view_as(b.old_logp).sin()).requires_grad_(True)
    whole, _ = obj.loss(logp, b)
    g_whole, = torch.autograd.grad(whole, logp)
    acc = sum(obj.loss(logp[[i]], mb.index(torch.tensor([i])))[0] * obj.agg_units(mb.index(torch.tensor([i]))) / 12
              for i in range(2))
    g_acc, = torch.autograd.grad(acc, logp)
    assert float(acc.detach()) == approx(float(whole.detach()), 1e-9)
    assert torch.allclose(g_acc, g_whole, atol=1e-9, rtol=0)


def test_retention_multiplies_the_clipped_token_loss():
    """∂L/∂logp_t = α_t · ∂u_t/∂logp_t / N: α scales each token's clipped GRPO gradient."""
    b = example_batch(adv=[-0.7])
    grpo, interq = make_objective("grpo", kl_coef=0.0), make_objective("interq", kl_coef=0.0)
    b2 = b.index(torch.tensor([0]))                       # a copy: each objective fills its own weights
    b = b.weighted(grpo.prepare(b))
    b2 = b2.weighted(interq.prepare(b2))
    shift = torch.tensor([0.0] * 4 + [0.3, -0.1, 0.05] + [0.0] * 3 + [0.5, -0.4] + [0.0] * 2 + [0.1, 3.0, -0.3, 0.0])
    grads = []
    for obj, batch in ((grpo, b), (interq, b2)):
        logp = (batch.old_logp.detach() + shift).requires_grad_(True)
        loss, stats = obj.loss(logp, batch)
        loss.backward()
        grads.append(logp.grad[0])
        assert "clip_frac" in stats and "dual_clip_frac" in stats
    alpha = b2.extra["retention"][0]
    assert torch.allclose(grads[1], alpha * grads[0], atol=1e-7)
    assert float(grads[1].abs().sum()) > 0


def test_alpha_is_computed_once_before_the_minibatch_split():
    gen = torch.Generator().manual_seed(7)
    trajs = random_trajectories(gen, 4)
    split = split_layout(trajs)
    obj = make_objective("interq")
    split = split.weighted(obj.prepare(split))
    full = split.token_weight.clone()
    perm = torch.randperm(split.num_seqs, generator=gen)
    for half in (perm[: len(perm) // 2], perm[len(perm) // 2:]):
        mb = split.index(half)
        assert torch.equal(mb.token_weight, full[half])
        logp = mb.old_logp.clone().requires_grad_(True)
        loss, _ = obj.loss(logp, mb)
        loss.backward()
        assert torch.isfinite(logp.grad).all()


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="budget_scope"):
        make_objective("interq", budget_scope="episode")
    with pytest.raises(ValueError, match="valid"):
        make_objective("interq", budget=1.0)
    for key, bad, valid in (("budget_B", -0.1, "≥ 0"), ("H_floor", -1.0, "≥ 0"), ("k3_max", -1.0, "≥ 0 or None"),
                            ("token_tis_cap", 0.0, "> 0 or None")):
        with pytest.raises(ValueError, match=f"'interq'.*{key}={bad}; valid: {valid}"):
            make_objective("interq", **{key: bad})
    for ok in ({"k3_max": None}, {"k3_max": 0.0}, {"token_tis_cap": None}, {"budget_B": 0.0, "H_floor": 0.0}):
        make_objective("interq", **ok)


def test_default_floor_follows_a_changed_budget_so_alpha_never_falls_below_rho():
    """`H_floor` null (the preset's value) is the floor B: with B = 2 the worked example (Htot 0.0467)
    gets κ = 1, α = ρ, not κ = B / 1 = 2 (α = ρ², 0.998607 0.985906 0.925088) as a fixed floor of 1
    gave; with B = 0.02 < Htot, the fixed budget's κ = 0.02 / 0.0467279 = 0.428010."""
    rho = [0.99930320, 0.99292774, 0.96181469]
    two = prepared(make_objective("interq", budget_B=2.0), example_batch())[0]
    assert [float(two.token_weight[0, t]) for t in (4, 10, 14)] == approx(rho, 1e-7)     # float32 weights
    assert interq_retention(example_batch(), budget_B=2.0, H_floor=None).alpha[0].tolist() == approx(rho, 1e-8)
    small = interq_retention(example_batch(), budget_B=0.02, H_floor=None)
    assert float(small.kappa[0]) == approx(0.02 / 0.04672790, 1e-6)
    assert small.alpha[0].tolist() == approx([math.exp(-0.02 / 0.04672790 * h)
                                              for h in (0.00069704, 0.00709738, 0.03893348)], 1e-6)
    fixed_floor = interq_retention(example_batch(), budget_B=2.0, H_floor=1.0)    # asked for: ρ² (a mixed mode)
    assert fixed_floor.alpha[0].tolist() == approx([r * r for r in rho], 1e-8)


def test_a_nan_log_prob_makes_its_whole_trajectory_nan_and_leaves_the_others():
    """A NaN δ on the third segment: every α of that trajectory NaN (before, segments 1-2 got exactly 1
    and segment 3 NaN: a partial correction); the other row's α are the worked example's."""
    b = make_batch([EX_ACTION_MASK, EX_ACTION_MASK], [EX_SEG_ID, EX_SEG_ID], [EX_DELTA, EX_DELTA],
                   dtype=torch.float64)
    b.old_logp[1, 15] = float("nan")
    for floor in (0.0, 1.0):
        r = interq_retention(b, budget_B=1.0, H_floor=floor)
        assert bool(r.alpha[1].isnan().all())
        assert bool(r.retention[1][b.action_mask[1].bool()].isnan().all())
        clean = interq_retention(example_batch(), budget_B=1.0, H_floor=floor)
        assert r.alpha[0].tolist() == approx(clean.alpha[0].tolist(), 1e-15)


def test_a_seg_id_on_an_observation_token_adds_no_segment():
    """Segments are counted on action tokens: seg_id 5 on observation token 8 leaves the worked
    example's fixed-budget α (0.985194, 0.859085, 0.434658); counted, it made S = 5 with two empty
    trailing segments in Htot (α 0.994421, 0.944628, 0.731630)."""
    seg = list(EX_SEG_ID)
    seg[8] = 5
    r = interq_retention(make_batch(EX_ACTION_MASK, seg, EX_DELTA, dtype=torch.float64), budget_B=1.0, H_floor=0.0)
    assert r.alpha[0].tolist() == approx([0.985194, 0.859085, 0.434658])
    assert int(r.num_segments[0]) == 3
