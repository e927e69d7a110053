"""The learning-curve PNG: written for long and short runs, with or without held-out points."""
import json

import pytest

from agentq.eval.plots import learning_curve, learning_curve_figure
from agentq.utils.logging import read_metrics


@pytest.mark.parametrize("steps,with_eval", [(12, True), (2, False)])
def test_learning_curve_png(tmp_path, steps, with_eval):
    rows = [{"step": s, "reward_mean": (s % 3) / 2, "success_rate": (s % 3) / 2} for s in range(1, steps + 1)]
    if with_eval:
        rows += [{"step": s, "eval/success_rate": 0.5 + s / 100, "eval/episodes": 20} for s in (4, 8)]
    m = tmp_path / "metrics.jsonl"
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = learning_curve(m, tmp_path / "curve.png", sft_success=0.4 if with_eval else None, title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # what the PNG draws, from the same file: the raw reward (s % 3) / 2 = .5, 1, 0, ... per step; its
    # 5-step moving average from step 5 on: (.5 + 1 + 0 + .5 + 1) / 5 = .6, then .5, .4 repeating;
    # no success line (success = reward); held-out points at steps 4, 8 (.54, .58) after SFT's .4 at 0
    import matplotlib.pyplot as plt

    fig = learning_curve_figure(read_metrics(m), sft_success=0.4 if with_eval else None, title="t")
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in fig.axes[0].get_lines()}
    plt.close(fig)
    reward = [0.5, 1.0, 0.0] * 4
    want = {"train reward (mean over the step's rollouts)": (list(range(1, steps + 1)), reward[:steps])}
    if steps >= 5:
        want["train reward, 5-step moving average"] = (list(range(5, steps + 1)), [0.6, 0.5, 0.4] * 3)
    if with_eval:
        want["held-out success (20 episodes)"] = ([0, 4, 8], [0.4, 0.54, 0.58])
        want["after SFT (40 %)"] = ([0, 1], [0.4, 0.4])
    assert lines.keys() == want.keys()
    for label, (xs, ys) in want.items():
        assert lines[label][0] == pytest.approx(xs) and lines[label][1] == pytest.approx(ys[:len(xs)]), label


def test_learning_curve_keeps_negative_rewards_in_view_and_names_the_split():
    import matplotlib.pyplot as plt

    from agentq.eval.plots import learning_curve_figure

    # an invalid-action penalty can push a step's mean reward below 0
    rows = [{"step": 1, "reward_mean": -0.35, "success_rate": 0.0}, {"step": 2, "reward_mean": 0.6, "success_rate": 0.7},
            {"step": 2, "eval/success_rate": 0.55, "eval/episodes": 20}]
    fig = learning_curve_figure(rows, sft_success=0.5, split="dev")
    ax = fig.axes[0]
    assert ax.get_ylim()[0] <= -0.35 and ax.get_ylim()[1] >= 1.0
    assert "held-out success (dev, 20 episodes)" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)
    # a reward scale above 1 (ALFWorld's reward_scale) stays in view too
    fig = learning_curve_figure([{"step": s, "reward_mean": r, "success_rate": 0.5} for s, r in ((1, 2.5), (2, 7.5))])
    assert fig.axes[0].get_ylim()[1] >= 7.5
    plt.close(fig)


def test_rl_step_bars_are_the_phase_seconds_with_the_speedups_beside_them(tmp_path):
    import matplotlib.pyplot as plt

    from agentq.eval.plots import rl_step_figure, rl_step_plot

    def res(rollout, old_ref, update, sync):
        return {"phases_s": {"rollout": rollout, "old_ref": old_ref, "update": update, "sync": sync}}

    reports = {"1B": {"results": {"interq": res(0.8, 0.7, 1.4, 0.05), "bf16": res(1.0, 0.9, 1.45, 0.01)},
                      "speedup_bf16_over_interq": 3.36 / 2.95},
               "4B": {"results": {"interq+int8dx": res(6.0, 4.9, 11.2, 0.05)},
                      "speedup_bf16_over_interq_int8dx": 1.21}}
    fig = rl_step_figure(reports)
    ax = fig.axes[0]
    bars = [(round(p.get_y() + p.get_height() / 2), p.get_x(), p.get_width()) for p in ax.patches]
    # row 0: interq's phases end to end, in the report's order
    assert [x for y, x, _ in bars if y == 0] == pytest.approx([0, 0.8, 1.5, 2.9])
    assert [w for y, _, w in bars if y == 0] == pytest.approx([0.8, 0.7, 1.4, 0.05])
    assert [w for y, _, w in bars if y == 2] == pytest.approx([6.0, 4.9, 11.2, 0.05])
    texts = [t.get_text() for t in ax.texts]
    assert texts == [" 2.95 s  1.14×", " 3.36 s", " 22.15 s  1.21×"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1B: interq", "1B: bf16", "4B: interq+int8dx"]
    plt.close(fig)
    assert rl_step_plot(reports, tmp_path / "rl.png").read_bytes()[:4] == b"\x89PNG"


def _labelled_lines(ax):
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}


def test_evaluations_of_different_sizes_are_separate_lines_and_sft_starts_its_own():
    """A pipeline evaluates 20 tasks every 8 steps and 200 at the end, after SFT on those 200. One line
    joined SFT's 59 % (200 tasks) to 80 % (20 other tasks) at step 8, then to 65 % (200) at 32: it
    read as +21 points at step 8, while on those 20 tasks SFT had 85 %."""
    import matplotlib.pyplot as plt

    rows = [{"step": s, "reward_mean": 0.2, "success_rate": 0.2} for s in range(1, 33)]
    rows += [{"step": 8, "eval/success_rate": 0.8, "eval/episodes": 20},
             {"step": 16, "eval/success_rate": 0.75, "eval/episodes": 20},
             {"step": 32, "eval/success_rate": 0.65, "eval/episodes": 200}]
    fig = learning_curve_figure(rows, sft_success=0.59, split="dev", sft_episodes=200)
    lines = _labelled_lines(fig.axes[0])
    plt.close(fig)
    assert lines["held-out success (dev, 20 episodes)"] == ([8, 16], [0.8, 0.75])
    assert lines["held-out success (dev, 200 episodes)"] == ([0, 32], [0.59, 0.65])
    assert lines["after SFT (59 % of 200 episodes)"][1] == [0.59, 0.59]
    # SFT's size unknown (pipeline.py's call): it is the dashed line only, joined to no evaluation
    fig = learning_curve_figure(rows, sft_success=0.59, split="dev")
    lines = _labelled_lines(fig.axes[0])
    plt.close(fig)
    assert lines["held-out success (dev, 20 episodes)"] == ([8, 16], [0.8, 0.75])
    assert lines["held-out success (dev, 200 episodes)"] == ([32], [0.65])
    assert "after SFT (59 %)" in lines


def test_null_metrics_are_gaps_not_a_traceback(tmp_path):
    """metrics.jsonl writes a NaN or inf as null: a step's null reward_mean ended learning_curve_figure
    (and `agentq train`'s last act, write_run_plots, and `agentq report`) in a TypeError."""
    import math

    import matplotlib.pyplot as plt

    from agentq.eval.plots import mismatch_figure, write_run_plots

    rows = [{"step": 1, "reward_mean": None, "success_rate": None, "k3": None, "alpha_median": None},
            {"step": 2, "reward_mean": 0.5, "success_rate": 1.0, "k3": 2e-5, "alpha_median": 0.9},
            {"step": 2, "eval/success_rate": None, "eval/episodes": 4}]
    fig = learning_curve_figure(rows)
    lines = _labelled_lines(fig.axes[0])
    assert math.isnan(lines["train reward (mean over the step's rollouts)"][1][0])
    assert lines["train reward (mean over the step's rollouts)"][1][1] == 0.5
    assert lines["train success"][1][1] == 1.0
    assert fig.axes[0].get_ylim() == pytest.approx((-0.02, 1.02))
    plt.close(fig)
    fig = mismatch_figure(rows)
    k3 = fig.axes[0].get_lines()[0].get_ydata()
    assert math.isnan(k3[0]) and k3[1] == 2e-5 and fig.axes[0].get_yscale() == "log"
    plt.close(fig)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [p.name for p in write_run_plots(tmp_path)] == ["learning_curve.png", "mismatch.png"]


def test_axes_name_their_units_and_count_whole_steps(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    import agentq.eval.plots as plots

    rows = [{"step": s, "reward_mean": 0.5, "success_rate": 0.5, "k3": 1e-5} for s in (1, 2)]
    fig = learning_curve_figure(rows)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("RL step", "reward; success rate (0–1)")
    # two steps: ticks at whole steps (matplotlib's default put them at 1.0, 1.2, ..., 2.0)
    assert all(float(t).is_integer() for t in ax.get_xticks())
    plt.close(fig)
    fig = plots.mismatch_figure(rows)      # no α logged (not InterQ-RL): said on the empty axes
    k3_ax, alpha_ax = fig.axes
    assert k3_ax.get_ylabel() == "K3 (nats per action token)" and alpha_ax.get_ylabel() == "α of a turn (0–1)"
    assert [t.get_text() for t in alpha_ax.texts] == ["no α: the objective is not InterQ-RL"]
    plt.close(fig)
    captured = {}
    real_save = plots.save_figure

    def keep(fig, out_png, **kw):
        ax = fig.axes[0]
        captured.update(labels=[t.get_text() for t in ax.get_legend().get_texts()], ylabel=ax.get_ylabel(),
                        integer=all(float(t).is_integer() for t in ax.get_xticks()))
        return real_save(fig, out_png, **kw)

    monkeypatch.setattr(plots, "save_figure", keep)
    # the mean line of an arm averages its seeds evaluated at the first seed's steps: the label counts those
    plots.sweep_curves({"bf16": {"0": {"steps": [0, 1, 2], "success": [0.1, 0.2, 0.3]}},
                        "interq": {"0": {"steps": [0, 1, 2], "success": [0.1, 0.3, 0.3]},
                                   "1": {"steps": [0, 1, 2], "success": [0.1, 0.1, 0.5]},
                                   "2": {"steps": [0, 2], "success": [0.1, 0.5]}}}, tmp_path / "c.png")
    assert captured == {"labels": ["bf16 (mean of 1 seed)", "interq (mean of 2 seeds)"],
                        "ylabel": "held-out success rate (0–1)", "integer": True}


def test_a_lone_step_between_nan_steps_has_a_marker_and_the_average_is_over_steps():
    """A step whose every episode errored logs a NaN reward: the step between two such was a line of one
    point, drawn as nothing. The 5-step moving average averaged 5 rows (a missing step widened it) and a
    NaN made the 5 averages holding it NaN."""
    import matplotlib.pyplot as plt

    from agentq.eval.plots import mismatch_figure

    reward = {1: 0.1, 2: 0.2, 3: 0.3, 5: None, 6: 0.6, 7: None, 8: 0.8, 9: 0.9}      # no row for step 4
    rows = [{"step": s, "reward_mean": r, "success_rate": None if r is None else 0.0, "k3": 1e-5,
             "alpha_median": None if r is None else 0.9, "alpha_p10": 0.5, "alpha_min": 0.1} for s, r in reward.items()]
    fig = learning_curve_figure(rows)
    ax = fig.axes[0]
    by_label = {ln.get_label(): ln for ln in ax.get_lines()}
    avg = by_label["train reward, 5-step moving average"]
    assert list(avg.get_xdata()) == [5, 6, 7, 8, 9]
    # steps 1–5: .1 .2 .3 (4 none, 5 NaN); 2–6: .2 .3 .6; 3–7: .3 .6; 4–8: .6 .8; 5–9: .6 .8 .9
    assert list(avg.get_ydata()) == pytest.approx([0.2, 1.1 / 3, 0.45, 0.7, 2.3 / 3])
    markers = {label: (ln.get_marker(), ln.get_markersize()) for label, ln in by_label.items()}
    assert markers == {"train reward (mean over the step's rollouts)": ("o", 3), "train success": ("o", 3),
                       "train reward, 5-step moving average": ("o", 3)}
    plt.close(fig)
    fig = mismatch_figure(rows)
    assert [(ln.get_label(), ln.get_marker(), ln.get_markersize()) for ln in fig.axes[1].get_lines()] == [
        ("alpha_median", "o", 3), ("alpha_p10", "o", 3), ("alpha_min", "o", 3)]
    assert [(ln.get_marker(), ln.get_markersize()) for ln in fig.axes[0].get_lines()] == [("o", 3)]
    plt.close(fig)
