"""Every registered objective: weights detached and 0 off action tokens, loss backpropagates through
minibatches, and the issue-4 metrics are returned."""
import math

import pytest
import torch

from agentq.algos import make_objective, mismatch_metrics, objective_names, token_delta
from algo_batches import concat_layout, prepared, random_trajectories

ISSUE_METRICS = {   # prepare() metrics each objective must return (issue 4)
    "grpo": set(),
    "tis": {"is_weight_mean", "is_weight_max"},
    "ais": {"is_weight_mean", "is_weight_max", "ais_lambda"},
    "qurl": {"is_weight_mean", "is_weight_max"},
    "tbpo": {"is_weight_mean", "is_weight_max"},
    "interq": {"alpha_min", "alpha_median", "alpha_max", "alpha_range_width", "alpha_p10", "alpha_frac_below_half"},
}


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    trajs = random_trajectories(gen, 6, scale=0.4)
    b = concat_layout(trajs, adv=torch.randn(6, generator=gen))
    b.ref_logp = b.old_logp + 0.1 * torch.randn(b.old_logp.shape, generator=gen)
    return b, gen


def test_metric_table_covers_the_registry():
    assert set(ISSUE_METRICS) == set(objective_names())


@pytest.mark.parametrize("name", objective_names())
def test_prepare_weights_are_detached_and_masked(name):
    b, _ = _batch()
    b.old_logp.requires_grad_(True)
    b.rollout_logp.requires_grad_(True)
    b, stats = prepared(make_objective(name), b)
    assert ISSUE_METRICS[name] <= set(stats)
    assert all(isinstance(v, (float, list)) for v in stats.values())
    w = b.token_weight
    assert not w.requires_grad and w.grad_fn is None
    assert bool((w[~b.action_mask.bool()] == 0).all())
    assert bool(torch.isfinite(w).all()) and bool((w[b.action_mask.bool()] > 0).all())


@pytest.mark.parametrize("name", objective_names())
def test_loss_backpropagates_over_minibatches_and_epochs(name):
    b, gen = _batch(1)
    obj = make_objective(name)
    b = b.weighted(obj.prepare(b))
    w0 = b.token_weight.clone()
    params = torch.zeros(b.old_logp.shape, requires_grad=True)     # stand-in for the policy's parameters
    opt = torch.optim.SGD([params], lr=0.1)
    for epoch in range(2):
        for idx in torch.randperm(b.num_seqs, generator=gen).split(3):
            mb = b.index(idx)
            logp = mb.old_logp + params[idx]                        # θ = θ_old at the first minibatch
            loss, stats = obj.loss(logp, mb)
            assert loss.dim() == 0 and torch.isfinite(loss)
            assert {"pg_loss", "kl", "clip_frac", "dual_clip_frac"} <= set(stats)
            assert all(not v.requires_grad for v in stats.values())
            opt.zero_grad()
            loss.backward()
            grad = params.grad[idx][mb.action_mask.bool()]
            assert bool(torch.isfinite(params.grad).all())
            assert float(grad.abs().sum()) > 0
            assert bool((params.grad[idx][~mb.action_mask.bool()] == 0).all())
            opt.step()
    assert torch.equal(b.token_weight, w0)          # weights are never recomputed by loss()


def test_mismatch_metrics_for_every_batch():
    b, _ = _batch(2)
    mm = mismatch_metrics(b)
    assert set(mm) == {"k3", "k3_by_turn", "dlogp_abs_mean", "dlogp_abs_p99", "dlogp_abs_max"}
    assert mm["k3"] > 0 and len(mm["k3_by_turn"]) == int(b.seg_id.max())
    assert mm["dlogp_abs_mean"] <= mm["dlogp_abs_p99"] <= mm["dlogp_abs_max"]
    assert all(math.isnan(v) or v >= 0 for v in mm["k3_by_turn"])


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("name", objective_names())
def test_share_accumulation_over_micro_batches_equals_the_minibatch_loss(name, loss_agg):
    # the learner accumulates micro-batch losses weighted by their share of the objective's units
    # (action tokens, or trajectories); counted here directly from the mask
    b, _ = _batch(3)
    obj = make_objective(name, loss_agg=loss_agg)
    b = b.weighted(obj.prepare(b))
    logp = b.old_logp + 0.05 * torch.randn(b.old_logp.shape, generator=torch.Generator().manual_seed(0))
    whole = float(obj.loss(logp, b)[0])
    units = (lambda m: float(m.sum())) if loss_agg == "token_mean" else (lambda m: float((m.sum(1) > 0).sum()))
    acc = 0.0
    for idx in torch.arange(b.num_seqs).split(2):
        mb = b.index(idx)
        assert obj.agg_units(mb) == units(mb.action_mask)
        acc += float(obj.loss(logp[idx], mb)[0]) * units(mb.action_mask) / units(b.action_mask)
    assert acc == pytest.approx(whole, abs=1e-6)


def test_token_delta_is_zero_off_action_tokens():
    b, _ = _batch(4)                                  # rollout NaN, old 50 off action tokens
    d = token_delta(b)
    assert d.dtype == torch.float64 and bool(torch.isfinite(d).all())
    assert bool((d[~b.action_mask.bool()] == 0).all())
    assert torch.equal(d[b.action_mask.bool()], (b.old_logp.double() - b.rollout_logp.double())[b.action_mask.bool()])


@pytest.mark.parametrize("name, params, message", [
    ("grpo", {"dual_clip": 0.5}, "'grpo'.*dual_clip=0.5; valid: > 1"),   # c = 0.5 zeroed every A < 0 gradient
    ("grpo", {"dual_clip": 1.0}, "dual_clip=1.0; valid: > 1"),
    ("interq", {"dual_clip": float("nan")}, "dual_clip=nan"),
    ("tis", {"is_cap": -1.0}, "'tis'.*is_cap=-1.0; valid: > 0"),         # flipped the gradient's sign
    ("tis", {"is_cap": 0.0}, "is_cap=0.0; valid: > 0"),
    ("ais", {"is_cap": 0.0}, "'ais'.*is_cap=0.0; valid: > 0"),
    ("ais", {"k_ref": 0.0}, "'ais'.*k_ref=0.0; valid: > 0"),
    ("qurl", {"is_cap": -2.0}, "'qurl'.*is_cap=-2.0; valid: > 0"),
    ("interq", {"k3_max": -1.0}, "'interq'.*k3_max=-1.0; valid: ≥ 0 or None"),
    ("interq", {"token_tis_cap": -1.0}, "token_tis_cap=-1.0; valid: > 0 or None"),
])
def test_out_of_range_parameters_raise_with_the_range(name, params, message):
    with pytest.raises(ValueError, match=message):
        make_objective(name, **params)


@pytest.mark.parametrize("name, params, message", [
    # reached the first step's float() after a whole rollout, a traceback
    ("ais", {"k_on": "abc"}, "objective 'ais': k_on='abc' is not a number; valid: ≥ 0, finite"),
    ("ais", {"k_on": float("nan")}, "objective 'ais': k_on=nan; valid: ≥ 0, finite"),     # the gate never opened
    # bool('flase') is True: the misspelt False meant True
    ("interq", {"prefix_inclusive": "flase"}, "objective 'interq': prefix_inclusive='flase'; valid: true or false"),
    ("interq", {"renorm_retention": 1}, "objective 'interq': renorm_retention=1; valid: true or false"),
    ("interq", {"budget_B": float("inf")}, "objective 'interq': budget_B=inf; valid: ≥ 0, finite"),   # α = NaN
    ("interq", {"budget_scope": "episode"}, "objective 'interq': budget_scope='episode'; valid: ['trajectory', 'segment']"),
    ("tis", {"is_cap": True}, "objective 'tis': is_cap=True is not a number; valid: > 0"),
    # `k3_max=none` is the string 'none' in an override: YAML's null is `null`
    ("interq", {"k3_max": "none"},
     "objective 'interq': k3_max='none' is not a number; valid: ≥ 0 or None (null in an override)"),
])
def test_parameters_of_the_wrong_type_or_not_finite_raise_naming_the_key(name, params, message):
    with pytest.raises(ValueError) as e:
        make_objective(name, **params)
    assert str(e.value) == message


def test_every_parameter_of_every_objective_has_a_check():
    """k_on and interq's booleans had none: their values went unchecked to the first step."""
    from agentq.algos import Bound, Choice, Flag
    from agentq.algos.objective import _objective_class

    for name in objective_names():
        cls = _objective_class(name)
        assert set(cls.bounds) == set(cls.defaults), name
        for key, check in cls.bounds.items():
            assert isinstance(check, (Bound, Choice, Flag)), (name, key)
            check.check(name, key, cls.defaults[key])          # the default passes its own check


def test_an_objective_with_an_unchecked_parameter_is_refused_where_it_is_defined():
    from agentq.algos import GRPO

    with pytest.raises(TypeError) as e:
        class Unchecked(GRPO):
            defaults = {"scale": 0.5, "on": True}
    assert str(e.value) == ("test_an_objective_with_an_unchecked_parameter_is_refused_where_it_is_defined.<locals>."
                            "Unchecked: parameter(s) ['on', 'scale'] of its defaults have no check in its bounds "
                            "(a Bound, Flag or Choice each: docs/algorithms.md)")


def test_range_edges_that_are_valid():
    """Values on the valid side of each bound are accepted as given, and used as given."""
    from algo_batches import make_batch

    assert make_objective("grpo", dual_clip=1.0001).dual_clip == 1.0001
    # c = ∞: no dual clip. Â = −1, r = 20: u = max(20, 0.8) = 20 stays (c = 10 would cap it at 10)
    b = make_batch([[1]], [[1]], [[0.0]], adv=[-1.0], dtype=torch.float64)
    loss, stats = make_objective("grpo", dual_clip=float("inf"), kl_coef=0.0).loss(b.old_logp + math.log(20.0), b)
    assert float(loss) == pytest.approx(20.0, rel=1e-12) and float(stats["dual_clip_frac"]) == 0.0
    # C = 1e-3: w = min(e^δ, C) = 1e-3 for δ = 0.3 and δ = −0.5 alike (e^−0.5 = 0.61 > C)
    b = make_batch([[1, 1]], [[1, 1]], [[0.3, -0.5]], dtype=torch.float64)
    assert make_objective("tis", is_cap=1e-3).prepare(b).token_weight.tolist() == [pytest.approx([1e-3, 1e-3])]
    obj = make_objective("interq", k3_max=None, token_tis_cap=None)
    assert obj.params["k3_max"] is None and obj.params["token_tis_cap"] is None
    obj = make_objective("interq", k3_max=0.0, budget_B=0.0, H_floor=0.0)
    assert (obj.params["k3_max"], obj.params["budget_B"], obj.params["H_floor"]) == (0.0, 0.0, 0.0)
    # k3_max = 0 clamps every token's k3 to 0: m = H = 0, so α = 1 however large δ is
    b = make_batch([[1, 1, 1]], [[1, 2, 2]], [[2.0, -3.0, 1.0]], dtype=torch.float64)
    assert make_objective("interq", k3_max=0.0).prepare(b).token_weight.tolist() == [[1.0, 1.0, 1.0]]
    # the default k3_max = 10 clamps none of k3 = e^δ − 1 − δ (4.39, 2.05, 0.72): H_1 = k3(2),
    # H_2 = H_1 + k3(−3) + k3(1), H_tot = H_1 + H_2 = 11.5 > H_floor = 1, so κ = B / H_tot and
    # α_s = e^(−H_s / H_tot) = 0.684, 0.538
    k3 = [math.expm1(x) - x for x in (2.0, -3.0, 1.0)]
    H = [k3[0], sum(k3)]
    a = [math.exp(-h / sum(H)) for h in H]
    assert make_objective("interq").prepare(b).token_weight.tolist() == [pytest.approx([a[0], a[1], a[1]])]


def test_registry_and_parameter_errors():
    assert objective_names() == ["ais", "grpo", "interq", "qurl", "tbpo", "tis"]
    with pytest.raises(ValueError, match="unknown objective"):
        make_objective("ppo")
    with pytest.raises(ValueError, match="valid: .*is_cap"):
        make_objective("tis", C=2.0)
    obj = make_objective("tis", is_cap=8.0, clip_eps=0.3)
    assert obj.params == {"is_cap": 8.0} and obj.clip_eps == 0.3


def _install_objective_plugin(root, name: str, value: str, source: str) -> None:
    """A package on sys.path with its dist-info, as pip would install one declaring
    `[project.entry-points."agentq.objectives"] <name> = "<value>"`."""
    (root / "my_objectives.py").write_text(source)
    info = root / "my_objectives-0.1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-objectives\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[agentq.objectives]\n{name} = {value}\n")


def test_an_objective_of_another_package_is_found_through_its_entry_point(tmp_path, monkeypatch):
    """An objective could only be added inside agentq (a module in agentq/algos/ imported by its
    __init__); `algo.objective=<plugin's>` was "unknown objective". Entry points of group
    agentq.objectives are imported when named, registered under the entry point's name."""
    from agentq.algos import GRPO
    from agentq.algos import objective as registry

    _install_objective_plugin(tmp_path, "halfkl", "my_objectives:HalfKL", (
        "from agentq.algos import GRPO, Bound\n\n"
        "class HalfKL(GRPO):\n"
        "    defaults = {'scale': 0.5}\n"
        "    bounds = {'scale': Bound(0.0)}\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))     # this test's registrations only
    assert "halfkl" in objective_names() and "my_objectives" not in __import__("sys").modules
    assert registry.objective_defaults("halfkl") == {"scale": 0.5}
    obj = make_objective("halfkl", scale=2.0, kl_coef=0.1)
    assert isinstance(obj, GRPO) and obj.name == "halfkl" and obj.params == {"scale": 2.0} and obj.kl_coef == 0.1
    with pytest.raises(ValueError, match=r"group 'agentq.objectives': docs/algorithms.md\)$"):
        make_objective("nosuch")


@pytest.mark.parametrize("source, named", [
    ("raise ImportError('needs scipy')\n", "does not import: ImportError: needs scipy"),
    ("HalfKL = 3\n", "is a int, not a GRPO subclass"),
])
def test_a_broken_objective_plugin_is_one_line_naming_it(tmp_path, monkeypatch, source, named):
    from agentq.algos import objective as registry

    _install_objective_plugin(tmp_path, "halfkl", "my_objectives:HalfKL", source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.delitem(__import__("sys").modules, "my_objectives", raising=False)
    with pytest.raises(ValueError, match=rf"^objective plugin 'halfkl' \(my_objectives:HalfKL\) {named}$"):
        make_objective("halfkl")


def test_an_objective_of_ones_own_reads_pi_old_through_the_public_helper():
    """`policy_token_loss` overrides needed the private `_old_logp` for π_old; `require_old_logp` is
    the exported name. A sequence-level ratio (GSPO-like) built on it, against hand numbers: one row,
    δ_seq = mean(logp − old) = (0.2 − 0.1) / 2 = 0.05, Â = 1, so u = −e^0.05 on both tokens (unclipped
    at ε = 0.2), and the loss, their token mean, −1.05127."""
    from agentq.algos import GRPO, require_old_logp
    from algo_batches import make_batch

    class SeqRatio(GRPO):
        defaults: dict = {}
        bounds: dict = {}

        def policy_token_loss(self, logp, mb):
            d = (logp - require_old_logp(mb)) * mb.action_mask
            ratio = torch.exp(d.sum(dim=1, keepdim=True) / mb.action_mask.sum(dim=1, keepdim=True)).expand_as(logp)
            u = -mb.adv.view(-1, 1) * ratio
            none = torch.zeros_like(logp, dtype=torch.bool)
            return u, none, none, ratio

    b = make_batch([[0, 1, 1]], [[0, 1, 1]], [[0.0, 0.0, 0.0]], dtype=torch.float64)
    loss, stats = SeqRatio(kl_coef=0.0).loss(b.old_logp + torch.tensor([[9.0, 0.2, -0.1]], dtype=torch.float64), b)
    assert float(loss) == pytest.approx(-math.exp(0.05), rel=1e-12)
    assert float(stats["ratio_mean"]) == pytest.approx(math.exp(0.05), rel=1e-12)
    b.old_logp = None
    with pytest.raises(ValueError, match=r"needs mb.old_logp \(π_old log-probs\): fill them before the update"):
        SeqRatio(kl_coef=0.0).loss(torch.zeros(1, 3, dtype=torch.float64), b)


def test_a_run_whose_ais_gate_never_opened_is_said_to_be_plain_grpo():
    """A review's AIS runs sat at K3 ~1e-6 against the gate's k_on 1e-4: every step was GRPO's, and
    the runs matched GRPO to four digits without a word. The run's end says so (`idle_correction_note`)."""
    from agentq.algos import idle_correction_note, make_objective

    ais = make_objective("ais")
    rows = [{"step": 1, "k3": 7.2e-7, "ais_gate": 0.0}, {"step": 2, "k3": 1.04e-5, "ais_gate": 0.0},
            {"step": 2, "eval/success_rate": 0.5}]
    assert idle_correction_note(ais, rows) == (
        "objective 'ais': ais_gate was 0 at all 2 step(s) (K3 at most 1.04e-05; its parameters: is_cap 5, k_ref 0.05, "
        "k_on 0.0001): its correction never engaged, and these steps were plain GRPO's")
    assert idle_correction_note(ais, [*rows, {"step": 3, "k3": 3e-4, "ais_gate": 1.0}]) is None
    assert idle_correction_note(ais, []) is None
    assert idle_correction_note(make_objective("grpo"), rows) is None         # nothing to engage
