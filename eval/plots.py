"""PNG plots of runs (matplotlib, headless)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentq.utils.files import replaced
from agentq.utils.logging import read_metrics

if TYPE_CHECKING:        # matplotlib loads when a plot is drawn
    from matplotlib.figure import Figure


def learning_curve(metrics_path: str | Path, out_png: str | Path, sft_success: float | None = None,
                   title: str = "", split: str | None = None, sft_episodes: int | None = None) -> Path:
    """Training reward and held-out success (on `split`) against RL step (SFT level as a dashed line)."""
    return save_figure(learning_curve_figure(read_metrics(metrics_path), sft_success, title, split, sft_episodes),
                       out_png)


def save_figure(fig: Figure, out_png: str | Path, **savefig_kw: Any) -> Path:
    """Write a figure to `out_png`, replacing the file whole, and close it (pyplot keeps every open
    figure alive)."""
    import matplotlib.pyplot as plt

    out_png = Path(out_png)
    try:
        with replaced(out_png) as tmp:      # a report or a second writer never reads half a PNG
            fig.savefig(tmp, format="png", **savefig_kw)
    finally:
        plt.close(fig)
    return out_png


def _num(v: Any) -> float:
    """A metrics.jsonl value as a float to plot: null (a NaN or inf when logged), a missing key or
    anything not a number is NaN, which matplotlib leaves as a gap."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _integer_steps(ax: Any) -> None:
    """RL steps are whole numbers: no 0.25-step ticks on a short run."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def learning_curve_figure(rows: list[dict], sft_success: float | None = None, title: str = "",
                          split: str | None = None, sft_episodes: int | None = None) -> Figure:
    """The learning curve's matplotlib figure from metrics.jsonl rows (the caller saves and closes it).

    Held-out evaluations of different sizes (a pipeline's 20-task interval evaluations and its
    200-task final one) are different task sets: each size is its own line, not one line joining
    them. The SFT level (`sft_success`, on `sft_episodes` episodes) starts the line of its own size at
    step 0; of an unknown size it starts the line only when every evaluation has one size, and is
    otherwise the dashed line alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    reward = _train_lines(ax, [r for r in rows if "reward_mean" in r])
    _held_out_lines(ax, [r for r in rows if "eval/success_rate" in r], sft_success, sft_episodes, split)
    if sft_success is not None:
        ax.axhline(sft_success, color="gray", ls="--", label=f"after SFT ({100 * sft_success:.0f} %"
                   + (f" of {sft_episodes} episodes" if sft_episodes else "") + ")")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward; success rate (0–1)")
    _integer_steps(ax)
    # penalties (invalid or inadmissible actions) can push the reward below 0, a reward_scale above 1
    # (ALFWorld's, verl-agent uses 10): keep it in view
    finite = [x for x in reward if math.isfinite(x)]
    ax.set_ylim(min([-0.02] + [x - 0.02 for x in finite]), max([1.02] + [x + 0.02 for x in finite]))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


#: the markers of the per-step lines: a step whose neighbours are NaN (every episode errored) is a
#: point with no segment to either side, which a line without markers does not draw
POINT = {"marker": "o", "ms": 3}


def _train_lines(ax: Any, train: list[dict]) -> list[float]:
    """Training reward (raw and a moving average) and, where it differs, training success against RL
    step; returns the rewards (the y range follows them)."""
    steps = [r["step"] for r in train]
    reward = [_num(r["reward_mean"]) for r in train]
    success = [_num(r.get("success_rate")) for r in train]
    ax.plot(steps, reward, color="tab:blue", alpha=0.3, lw=1, **POINT,
            label="train reward (mean over the step's rollouts)")
    k = 5                     # each step samples only a few tasks: the raw curve is mostly task draw
    at = [s for s in steps if s - k + 1 >= steps[0]]        # a whole window of steps behind it
    if at:
        ax.plot(at, moving_average(steps, reward, k, at), color="tab:blue", lw=2, **POINT,
                label=f"train reward, {k}-step moving average")
    if any(abs(s - r) > 1e-9 for s, r in zip(success, reward)):   # differs unless reward = success (NaN: no)
        ax.plot(steps, success, color="tab:blue", ls=":", alpha=0.6, **POINT, label="train success")
    return reward


def moving_average(steps: list[int], values: list[float], k: int, at: list[int]) -> list[float]:
    """At each step of `at`, the mean of the finite `values` of steps s − k + 1 … s: k steps, not k rows,
    where steps have no row, and a NaN step (every episode errored) left out rather than making the k
    averages that hold it NaN; NaN where the window has no finite value."""
    by_step = dict(zip(steps, values))
    out = []
    for s in at:
        window = [v for t in range(s - k + 1, s + 1) if math.isfinite(v := by_step.get(t, math.nan))]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


def _held_out_lines(ax: Any, ev: list[dict], sft_success: float | None, sft_episodes: int | None,
                    split: str | None) -> None:
    """One line per evaluation size (`learning_curve_figure`), SFT's point at step 0 on its own size's."""
    by_size: dict[int, list[tuple[int, float]]] = {}
    for r in ev:
        by_size.setdefault(int(_num(r.get("eval/episodes")) if r.get("eval/episodes") else 0), []).append(
            (r["step"], _num(r["eval/success_rate"])))
    for i, (n, points) in enumerate(sorted(by_size.items())):
        if sft_success is not None and (n == sft_episodes if sft_episodes else len(by_size) == 1):
            points = [(0, sft_success)] + points
        ax.plot([s for s, _ in points], [v for _, v in points], "os^Dv"[i % 5] + "-", color=f"C{3 + i}",
                label=f"held-out success ({split + ', ' if split else ''}{n} episodes)" if n
                else f"held-out success{' (' + split + ')' if split else ''}")


def mismatch_figure(rows: list[dict]) -> Figure:
    """K3 (rollout ‖ learner mismatch per action token) and InterQ-RL's α median / p10 / min against RL
    step, from metrics.jsonl rows (the caller saves and closes the figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "reward_mean" in r]
    steps = [r["step"] for r in train]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=110)
    k3 = [_num(r.get("k3")) for r in train]
    if any(math.isfinite(v) for v in k3):
        ax1.plot(steps, k3, "-", **POINT)
        if all(v > 0 for v in k3 if math.isfinite(v)):
            ax1.set_yscale("log")
    ax1.set_title("K3 per action token", fontsize=10)
    ax1.set_ylabel("K3 (nats per action token)")
    for key, style in (("alpha_median", "-"), ("alpha_p10", "--"), ("alpha_min", ":")):
        vals = [_num(r.get(key)) for r in train]
        if any(math.isfinite(v) for v in vals):
            ax2.plot(steps, vals, style, **POINT, label=key)
    ax2.set_title("InterQ-RL retention α", fontsize=10)
    ax2.set_ylabel("α of a turn (0–1)")
    ax2.set_ylim(-0.02, 1.02)
    if ax2.lines:
        ax2.legend(fontsize=8)
    else:                     # an objective without α (GRPO, TIS, ...): say so instead of empty axes
        ax2.text(0.5, 0.5, "no α: the objective is not InterQ-RL", ha="center", va="center",
                 transform=ax2.transAxes, fontsize=9, color="gray")
    for ax in (ax1, ax2):
        ax.set_xlabel("RL step")
        _integer_steps(ax)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_run_plots(run_dir: str | Path, split: str | None = None) -> list[Path]:
    """`learning_curve.png` and `mismatch.png` in an RL run folder (what `agentq train` leaves)."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [save_figure(learning_curve_figure(rows, split=split, title=run_dir.name), run_dir / "learning_curve.png"),
            save_figure(mismatch_figure(rows), run_dir / "mismatch.png")]


def sweep_curves(curves: dict[str, dict[str, dict]], out_png: str | Path, title: str = "") -> Path:
    """`agentq sweep`'s plot: held-out success against RL step, one line per arm (mean over its seeds,
    each seed's points as faint dots). curves: arm → seed → {"steps": [...], "success": [...]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    colors = plt.get_cmap("tab10")
    for i, (arm, by_seed) in enumerate(curves.items()):
        runs = list(by_seed.values())
        steps = runs[0]["steps"]
        same = [r["success"] for r in runs if r["steps"] == steps]     # seeds evaluated at the same steps
        mean = [sum(v) / len(v) for v in zip(*same)]
        ax.plot(steps, mean, "o-", color=colors(i % 10), lw=2, ms=4,
                label=f"{arm} (mean of {len(same)} seed{'s' if len(same) > 1 else ''})")
        for r in runs:
            ax.plot(r["steps"], r["success"], ".", color=colors(i % 10), alpha=0.35)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success rate (0–1)")
    _integer_steps(ax)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(loc="best", fontsize=7, ncol=2)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out_png)


def rl_step_figure(reports: dict[str, dict]) -> Figure:
    """`bench_rl_step` reports side by side (the caller saves and closes the figure): per report
    label, one horizontal bar per algo entry, stacked by phase in the report's order (rollout,
    old_ref, update, sync; seconds), with the step's seconds and its speed-up over the bf16
    entry it was compared with (the report's `speedup_bf16_over_<entry>`) beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(label, entry, res, rep) for label, rep in reports.items() for entry, res in rep["results"].items()]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.4), dpi=120)
    colors = plt.get_cmap("tab10")
    phases = list(rows[0][2]["phases_s"]) if rows else []
    for y, (label, entry, res, rep) in enumerate(rows):
        left = 0.0
        for i, phase in enumerate(phases):
            sec = res["phases_s"][phase]
            ax.barh(y, sec, left=left, color=colors(i), label=phase if y == 0 else None)
            left += sec
        speedup = rep.get("speedup_bf16_over_" + entry.replace("+", "_"))
        ax.text(left, y, f" {left:.2f} s" + (f"  {speedup:.2f}×" if speedup else ""), va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{label}: {entry}" for label, entry, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per RL step (× = bf16 step ÷ this step)")
    ax.set_xlim(0, 1.18 * max((sum(r[2]["phases_s"].values()) for r in rows), default=1.0))
    ax.grid(axis="x", alpha=0.3)
    if phases:
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, ncol=len(phases), frameon=False)
    fig.tight_layout()
    return fig


def rl_step_plot(reports: dict[str, dict], out_png: str | Path) -> Path:
    """`rl_step_figure` written to `out_png`."""
    return save_figure(rl_step_figure(reports), out_png, bbox_inches="tight")    # the legend sits above the axes
