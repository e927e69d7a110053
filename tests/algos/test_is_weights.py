"""Token IS-weight baselines: TIS, AIS and QuRL's adaptive clipping (docs/algorithms.md),
against the worked examples and losses computed by hand."""
import math

import pytest
import torch

from agentq.algos import make_objective, mismatch_metrics
from agentq.algos.ais import ais_lambda
from algo_batches import make_batch, prepared

TOL = 1e-6
EX_DELTA = [0.3, -0.5, 1.2, 0.0, -2.0]   # five example δ


def _example_rows(adv=(1.0, -1.0, 1.0)):
    """The five example tokens over three rows with observation tokens and padding between them:
    row 0 (Â = +1): δ 0.3, −0.5 · row 1 (Â = −1): δ 1.2, 0 · row 2 (Â = +1): δ −2."""
    mask = [[0, 1, 0, 1], [0, 1, 1, 0], [0, 0, 1, 0]]
    seg = [[0, 1, 0, 2], [0, 1, 1, 0], [0, 0, 1, 0]]
    delta = [[4.0, 0.3, -9.0, -0.5], [3.0, 1.2, 0.0, 0.0], [0.0, 7.0, -2.0, 5.0]]   # junk off actions
    return make_batch(mask, seg, delta, adv=list(adv), dtype=torch.float64)


ACTIONS = (torch.tensor([0, 0, 1, 1, 2]), torch.tensor([1, 3, 1, 2, 2]))   # (row, position) in EX_DELTA order


# ---------------------------------------------------------------------- TIS
def test_tis_weights_example():
    b = _example_rows()
    b, stats = prepared(make_objective("tis"), b)     # C = 2
    assert b.token_weight[ACTIONS].tolist() == pytest.approx([1.349859, 0.606531, 2.0, 1.0, 0.135335], abs=TOL)
    assert float(b.token_weight.sum()) == pytest.approx(1.349859 + 0.606531 + 2.0 + 1.0 + 0.135335, abs=1e-5)
    assert stats["is_weight_max"] == pytest.approx(2.0)
    assert stats["is_weight_mean"] == pytest.approx((1.349859 + 0.606531 + 2.0 + 1.0 + 0.135335) / 5, abs=TOL)
    assert stats["is_weight_capped_frac"] == pytest.approx(1 / 5)
    stats8 = make_objective("tis", is_cap=8.0).prepare(_example_rows()).stats
    assert stats8["is_weight_max"] == pytest.approx(3.320117, abs=TOL)


def test_tis_loss_by_hand():
    b = _example_rows()
    obj = make_objective("tis", kl_coef=0.0)
    b = b.weighted(obj.prepare(b))
    logp = b.old_logp.clone().requires_grad_(True)    # R = 1: u = −Â, nothing clipped
    loss, stats = obj.loss(logp, b)
    w = [1.349859, 0.606531, 2.0, 1.0, 0.135335]
    A = [1.0, 1.0, -1.0, -1.0, 1.0]
    assert float(loss.detach()) == pytest.approx(sum(-a * x for a, x in zip(A, w)) / 5, abs=TOL)
    loss.backward()
    assert logp.grad[ACTIONS].tolist() == pytest.approx([-a * x / 5 for a, x in zip(A, w)], abs=TOL)
    assert float(logp.grad.abs().sum()) == pytest.approx(sum(x / 5 for x in w), abs=1e-5)   # 0 off actions
    assert float(stats["clip_frac"]) == 0.0


# ---------------------------------------------------------------------- AIS
def test_ais_lambda_example():
    delta = torch.tensor(EX_DELTA, dtype=torch.float64)
    w_bar = torch.exp(delta).clamp(max=5.0)
    s = ais_lambda(w_bar, torch.expm1(delta) - delta, torch.tensor([1.0, 1, -1, -1, 1], dtype=torch.float64),
                   k_ref=0.05, k_on=1e-4)
    assert s["ais_reliability"] == pytest.approx(0.577757, abs=TOL)
    assert s["ais_amplification"] == pytest.approx(2.846298, abs=TOL)
    assert s["ais_severity"] == pytest.approx(1 - math.exp(-0.482368 / 0.05), abs=TOL)
    assert s["ais_severity"] == pytest.approx(0.999935, abs=TOL)
    assert s["ais_gate"] == 1.0
    assert s["ais_lambda"] == pytest.approx(0.202972, abs=TOL)


def test_ais_weights_example_through_the_objective():
    b = _example_rows()
    assert mismatch_metrics(b)["k3"] == pytest.approx(0.482368, abs=TOL)   # methods.md §3.3: K3 of the example
    b, stats = prepared(make_objective("ais"), b)     # C = 5, k_ref = 0.05, k_on = 1e-4
    assert stats["ais_lambda"] == pytest.approx(0.202972, abs=TOL)
    assert b.token_weight[ACTIONS].tolist() == pytest.approx([1.071012, 0.920137, 1.470919, 1.0, 0.824497], abs=TOL)
    assert bool((b.token_weight[~b.action_mask.bool()] == 0).all())
    assert stats["is_weight_max"] == pytest.approx(1.470919, abs=TOL)


def test_ais_gate_and_degenerate_advantages():
    b = make_batch([[1, 1, 1]], [[1, 1, 1]], [[0.001, -0.002, 0.0]])   # K3 ≈ 2.5e-6 < k_on
    b, stats = prepared(make_objective("ais"), b)
    assert stats["ais_gate"] == 0.0 and stats["ais_lambda"] == 0.0
    assert b.token_weight.tolist() == [[1.0, 1.0, 1.0]]
    b = _example_rows(adv=(0.0, 0.0, 0.0))             # all Â = 0: no amplification, λ = Sev · Rel
    b, stats = prepared(make_objective("ais"), b)
    assert stats["ais_amplification"] == 1.0
    assert stats["ais_lambda"] == pytest.approx(0.999935 * 0.577757, abs=1e-5)


# ---------------------------------------------------------------------- QuRL
def _qurl_batch():
    """(Â, r_pb = π_old/μ, R = π_θ/π_old) per action token; row 0 Â = +1, row 1 Â = −1."""
    r_pb = torch.tensor([[0.5, 2.0, 4.0], [1.0, 0.5, 1.0]], dtype=torch.float64)
    R = torch.tensor([[2.0, 1.0, 0.25], [30.0, 0.7, 1.0]], dtype=torch.float64)
    mask = [[1, 1, 1], [1, 1, 0]]
    b = make_batch(mask, [[1, 1, 2], [1, 1, 0]], torch.log(r_pb), adv=[1.0, -1.0], dtype=torch.float64)
    return b, b.old_logp + torch.log(R)


def test_qurl_upper_bound_worked_numbers():
    """QuRL's range: r = min(1, C/r_pb), bound (1+ε)/r; ε = 0.2, C = 2: r_pb 0.5 → 1.2, 1 → 1.2, 3 → 1.8.
    The bound only widens, and only on truncated tokens (r_pb > C)."""
    from agentq.algos.qurl import acr_clip_high

    r_pb = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    assert (1 + acr_clip_high(torch.log(r_pb), 0.2, 2.0)).tolist() == pytest.approx([1.2, 1.2, 1.8], abs=1e-12)
    many = torch.logspace(-3, 3, 61, dtype=torch.float64)
    hi = 1 + acr_clip_high(torch.log(many), 0.2, 2.0)
    assert bool((hi >= 1.2 - 1e-12).all())                              # never narrower than PPO's
    assert float((hi[many <= 2.0] - 1.2).abs().max()) < 1e-12           # plain 1+ε wherever r_pb ≤ C
    assert float((hi[many > 2.0] - 1.2 * many[many > 2.0] / 2.0).abs().max()) < 1e-9


def test_qurl_loss_by_hand():
    b, logp = _qurl_batch()
    obj = make_objective("qurl", kl_coef=0.0)          # ε = 0.2, C = 2, c = 10
    b, stats = prepared(obj, b)
    # upper bound (1 + ε) · max(1, r_pb / C) per token: r_pb .5, 2, 4 | 1, .5
    assert (1 + b.extra["clip_high"][0]).tolist() == pytest.approx([1.2, 1.2, 2.4], abs=TOL)
    assert b.token_weight.flatten().tolist() == pytest.approx([0.5, 2.0, 2.0, 1.0, 0.5, 0.0], abs=TOL)
    assert stats["acr_upper_bound_mean"] == pytest.approx((1.2 + 1.2 + 2.4 + 1.2 + 1.2) / 5, abs=TOL)
    lp = logp.clone().requires_grad_(True)
    loss, stats = obj.loss(lp, b)
    # Â=+1: r_pb .5, R 2 → clipped at 1.2: u = max(−2, −1.2) = −1.2, w .5 → −.6
    #       r_pb 2, R 1 → inside [.8, 1.2]: u = −1, w 2 → −2
    #       r_pb 4 (truncated), R .25 → bound 2.4; clip gives .8: u = max(−.25, −.8) = −.25 (not clipped), w 2 → −.5
    # Â=−1: r_pb 1, R 30 → u = 30 → dual cap 10, w 1 → 10;  r_pb .5, R .7 → u = max(.7, .8) = .8, w .5 → .4
    assert float(loss.detach()) == pytest.approx((-0.6 - 2.0 - 0.5 + 10.0 + 0.4) / 5, abs=TOL)
    assert float(stats["clip_frac"]) == pytest.approx(2 / 5)
    assert float(stats["dual_clip_frac"]) == pytest.approx(1 / 5)
    loss.backward()
    # gradient only where unclipped: w · (−Â·R) / N
    assert lp.grad.flatten().tolist() == pytest.approx([0.0, 2.0 * -1.0 / 5, 2.0 * -0.25 / 5, 0.0, 0.0, 0.0], abs=TOL)


def test_qurl_widened_bound_lets_a_truncated_token_move_further():
    """Â = +1, r_pb = 3 (truncated, C = 2), R = 1.5: PPO would clip at 1.2 (no gradient); QuRL's bound
    1.8 keeps the token's gradient, w · (−Â·R) = 2 · (−1.5)."""
    b = make_batch([[1]], [[1]], torch.log(torch.tensor([[3.0]], dtype=torch.float64)), adv=[1.0],
                   dtype=torch.float64)
    lp = (b.old_logp + math.log(1.5)).clone().requires_grad_(True)
    obj = make_objective("qurl", kl_coef=0.0)
    b = b.weighted(obj.prepare(b))
    loss, stats = obj.loss(lp, b)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(2.0 * -1.5, abs=TOL) and float(stats["clip_frac"]) == 0.0
    assert float(lp.grad[0, 0]) == pytest.approx(2.0 * -1.5, abs=TOL)


def test_qurl_equals_grpo_when_rollout_matches():
    # r_pb = 1 everywhere: QuRL's bound is the plain 1 + ε and the weight is 1, i.e. GRPO
    b, logp = _qurl_batch()
    b.old_logp = b.rollout_logp.clone()
    q, g = make_objective("qurl"), make_objective("grpo")
    b = b.weighted(q.prepare(b))
    b2 = b.index(torch.arange(2))
    b2 = b2.weighted(g.prepare(b2))
    assert float(q.loss(logp, b)[0]) == pytest.approx(float(g.loss(logp, b2)[0]), abs=1e-6)


# ---------------------------------------------------------------------- bad behaviour log-probs
@pytest.mark.parametrize("bad, delta", [(float("-inf"), 20.0), (float("inf"), -20.0)])
def test_infinite_behaviour_logp_is_clamped_to_20_nats(bad, delta):
    """δ = clamp(log π_old − log μ, ±20) (methods.md §1.1): an engine log-prob of ∓inf on an action
    token is the clamp's bound, so every objective's weights and loss stay finite: TIS w = min(e^±20,
    C), AIS's w̄ likewise, InterQ-RL's k3 = k3_max = 10, TBPO's sequence weight at most its cap."""
    b = _example_rows()
    b.rollout_logp[0, 1] = bad                                       # row 0's first action token
    k3_20 = math.expm1(delta) - delta
    assert mismatch_metrics(b)["dlogp_abs_max"] == 20.0
    w_tis = make_objective("tis").prepare(b).token_weight[0, 1]
    assert float(w_tis) == pytest.approx(min(math.exp(delta), 2.0), rel=1e-6)
    from agentq.algos import interq_retention
    r = interq_retention(b, k3_max=10.0)
    assert float(r.m[0, 0]) == pytest.approx(min(k3_20, 10.0), rel=1e-12)
    for name in ("grpo", "tis", "ais", "qurl", "tbpo", "interq"):
        obj = make_objective(name)
        bw = b.weighted(obj.prepare(b))
        assert bool(torch.isfinite(bw.token_weight).all()), name
        lp = (bw.old_logp + 0.01).requires_grad_(True)
        loss, _ = obj.loss(lp, bw)
        loss.backward()
        assert bool(torch.isfinite(loss.detach())) and bool(torch.isfinite(lp.grad).all()), name
