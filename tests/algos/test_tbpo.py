"""TBPO (docs/algorithms.md, band algebra [DESIGN] as in agentq/algos/tbpo.py), against hand numbers."""
import math

import pytest
import torch

from agentq.algos import make_objective
from algo_batches import make_batch, prepared

TOL = 1e-7

# five sequences (rows): advantage, log π_θ − log π_old per action token, δ = old − rollout per action token
SEQS = [
    (+1.0, [0.001, 0.0], [0.1, 0.3]),            # r = e^.0005 > 1 + 4e-4: clipped, no gradient
    (-1.0, [-0.001, 0.0, 0.0003], [0.0, 0.0, 0.0]),  # r = e^−.000233 inside [1 − 3e-4, 1 + 7e-4]: gradient
    (-0.5, [0.002], [1.0]),                      # r = e^.002 > 1 + 7e-4: band top (dual clip), no gradient
    (+0.5, [-0.01], [-0.2]),                     # r = e^−.01 < 1: positive, unclipped, gradient
    (-1.0, [-0.001], [0.0]),                     # r = e^−.001 < 1 − 3e-4: clipped, no gradient
]


def _batch():
    L = 5   # P A O A A / P A A A - …: each row's action tokens follow one prompt token, one observation inside
    mask, seg, delta, dlogp = [], [], [], []
    for _, lr, d in SEQS:
        m, s, dd, ll = [0], [0], [0.0], [0.0]
        for j, (x, y) in enumerate(zip(lr, d)):
            if j == 1:                               # an observation token between the 1st and 2nd action
                m, s, dd, ll = m + [0], s + [0], dd + [2.0], ll + [3.0]
            m, s, dd, ll = m + [1], s + [1 + (j >= 1)], dd + [y], ll + [x]
        pad = L - len(m)
        mask.append(m + [0] * pad), seg.append(s + [0] * pad), delta.append(dd + [0.0] * pad)
        dlogp.append(ll + [0.0] * pad)
    b = make_batch(mask, seg, delta, adv=[a for a, _, _ in SEQS], dtype=torch.float64)
    return b, b.old_logp + torch.tensor(dlogp, dtype=torch.float64)


def _hand():
    r = [math.exp(sum(lr) / len(lr)) for _, lr, _ in SEQS]
    w = [min(math.exp(sum(d) / len(d)), 2.0) for _, _, d in SEQS]
    u = [-1.0 * (1 + 4e-4),                         # −A·(1 + ε⁺)
         1.0 * r[1],                                # −A·r (inside the band)
         0.5 * (1 + 7e-4),                          # −A·(1 + ε⁻_hi)
         -0.5 * r[3],                               # −A·r
         1.0 * (1 - 3e-4)]                          # −A·(1 − ε⁻_lo)
    return r, w, u


def test_tbpo_weights_and_seq_mean_loss_by_hand():
    b, logp = _batch()
    obj = make_objective("tbpo", kl_coef=0.0, loss_agg="seq_mean")
    b, stats = prepared(obj, b)
    r, w, u = _hand()
    assert w == pytest.approx([math.exp(0.2), 1.0, 2.0, math.exp(-0.2), 1.0])
    assert b.extra["seq_weight"].tolist() == pytest.approx(w, abs=1e-6)
    assert stats["is_weight_max"] == pytest.approx(2.0) and stats["is_weight_mean"] == pytest.approx(sum(w) / 5)
    lp = logp.clone().requires_grad_(True)
    loss, stats = obj.loss(lp, b)
    assert float(loss.detach()) == pytest.approx(sum(x * y for x, y in zip(w, u)) / 5, abs=TOL)
    assert float(stats["clip_frac"]) == pytest.approx(2 / 5)        # rows 0 and 4
    assert float(stats["dual_clip_frac"]) == pytest.approx(1 / 5)   # row 2
    assert float(stats["ratio_mean"]) == pytest.approx(sum(r) / 5, abs=TOL)
    loss.backward()
    # ∂(w_i·u_i)/∂logp_t = w_i·(−A_i)·r_i / n_i inside the band, 0 outside; ÷ 5 sequences
    g = lp.grad
    act = b.action_mask.bool()
    assert bool((g[0] == 0).all()) and bool((g[2] == 0).all()) and bool((g[4] == 0).all())
    assert g[1][act[1]].tolist() == pytest.approx([w[1] * 1.0 * r[1] / 3 / 5] * 3, abs=TOL)
    assert g[3][act[3]].tolist() == pytest.approx([w[3] * -0.5 * r[3] / 1 / 5], abs=TOL)
    assert bool((g[~act] == 0).all())


def test_tbpo_token_mean_aggregation():
    b, logp = _batch()
    obj = make_objective("tbpo", kl_coef=0.0)                      # loss_agg = token_mean
    b = b.weighted(obj.prepare(b))
    r, w, u = _hand()
    n = [2, 3, 1, 1, 1]
    assert float(obj.loss(logp, b)[0]) == pytest.approx(sum(k * x * y for k, x, y in zip(n, w, u)) / 8, abs=TOL)


def test_tbpo_minibatch_rows_and_empty_rows():
    b, logp = _batch()
    obj = make_objective("tbpo", kl_coef=0.0, loss_agg="seq_mean")
    b = b.weighted(obj.prepare(b))
    r, w, u = _hand()
    mb = b.index(torch.tensor([3, 1]))
    assert float(obj.loss(logp[[3, 1]], mb)[0]) == pytest.approx((w[3] * u[3] + w[1] * u[1]) / 2, abs=TOL)
    mb.action_mask[0] = 0                           # a row without action tokens does not count
    assert float(obj.loss(logp[[3, 1]], mb)[0]) == pytest.approx(w[1] * u[1], abs=TOL)


def test_tbpo_seq_mean_over_a_trajectory_split_over_rows():
    """Rows 1 (3 tokens) and 3 (1 token) one trajectory, row 0 another: the trajectory's token-weighted
    mean of its rows' w·u, then the mean over the two trajectories."""
    b, logp = _batch()
    obj = make_objective("tbpo", kl_coef=0.0, loss_agg="seq_mean")
    b = b.weighted(obj.prepare(b))
    r, w, u = _hand()
    mb = b.index(torch.tensor([0, 1, 3]))
    mb.traj_id = torch.tensor([4, 8, 8])
    want = (w[0] * u[0] + (3 * w[1] * u[1] + 1 * w[3] * u[3]) / 4) / 2
    assert float(obj.loss(logp[[0, 1, 3]], mb)[0]) == pytest.approx(want, abs=TOL)
    assert obj.agg_units(mb) == pytest.approx(2.0)


def test_tbpo_rejects_unknown_aggregation():
    with pytest.raises(ValueError, match="loss_agg"):
        make_objective("tbpo", loss_agg="sum")


@pytest.mark.parametrize("key, bad, valid", [
    ("seq_clip_ratio_high", -1e-4, "≥ 0"), ("neg_seq_clip_ratio_low", -1e-4, "≥ 0"),
    ("neg_seq_clip_ratio_high", -1e-4, "≥ 0"), ("seq_tis_imp_ratio_cap", 0.0, "> 0")])
def test_tbpo_rejects_out_of_range_bands_and_cap(key, bad, valid):
    with pytest.raises(ValueError, match=f"'tbpo'.*{key}={bad}; valid: {valid}"):
        make_objective("tbpo", **{key: bad})
    make_objective("tbpo", seq_clip_ratio_high=0.0, neg_seq_clip_ratio_low=0.0, neg_seq_clip_ratio_high=0.0)
