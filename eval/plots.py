"""PNG plots of runs (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentq.utils.logging import read_metrics

if TYPE_CHECKING:        # matplotlib loads when a plot is drawn
    from matplotlib.figure import Figure


def learning_curve(metrics_path: str | Path, out_png: str | Path, sft_success: float | None = None,
                   title: str = "", split: str | None = None) -> Path:
    """Training reward and held-out success (on `split`) against RL step (SFT level as a dashed line)."""
    return save_figure(learning_curve_figure(read_metrics(metrics_path), sft_success, title, split), out_png)


def save_figure(fig: Figure, out_png: str | Path, **savefig_kw: Any) -> Path:
    """Write a figure to `out_png` and close it (pyplot keeps every open figure alive)."""
    import matplotlib.pyplot as plt

    out_png = Path(out_png)
    fig.savefig(out_png, **savefig_kw)
    plt.close(fig)
    return out_png


def learning_curve_figure(rows: list[dict], sft_success: float | None = None, title: str = "",
                          split: str | None = None) -> Figure:
    """The learning curve's matplotlib figure from metrics.jsonl rows (the caller saves and closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "reward_mean" in r]
    ev = [r for r in rows if "eval/success_rate" in r]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    steps = [r["step"] for r in train]
    reward = [r["reward_mean"] for r in train]
    ax.plot(steps, reward, color="tab:blue", alpha=0.3, lw=1, label="train reward (mean over the step's rollouts)")
    k = 5                     # each step samples only a few tasks: the raw curve is mostly task draw
    if len(reward) >= k:
        avg = [sum(reward[i - k + 1: i + 1]) / k for i in range(k - 1, len(reward))]
        ax.plot(steps[k - 1:], avg, color="tab:blue", lw=2, label=f"train reward, {k}-step moving average")
    if any(abs(r["success_rate"] - r["reward_mean"]) > 1e-9 for r in train):   # differs unless reward = success
        ax.plot(steps, [r["success_rate"] for r in train], color="tab:blue", ls=":", alpha=0.6, label="train success")
    if ev:
        ev_steps = [r["step"] for r in ev]
        succ = [r["eval/success_rate"] for r in ev]
        sizes = sorted({int(r.get("eval/episodes", 0)) for r in ev})
        if sft_success is not None:
            ev_steps, succ = [0] + ev_steps, [sft_success] + succ
        ax.plot(ev_steps, succ, "o-", color="tab:red",
                label=f"held-out success ({split + ', ' if split else ''}"
                      + " / ".join(str(n) for n in sizes if n) + " episodes)")
    if sft_success is not None:
        ax.axhline(sft_success, color="gray", ls="--", label=f"after SFT ({100 * sft_success:.0f} %)")
    ax.set_xlabel("RL step")
    # penalties (invalid or inadmissible actions) can push the reward below 0, a reward_scale above 1
    # (ALFWorld's, verl-agent uses 10): keep it in view
    ax.set_ylim(min([-0.02] + [x - 0.02 for x in reward]), max([1.02] + [x + 0.02 for x in reward]))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def mismatch_figure(rows: list[dict]) -> Figure:
    """K3 (rollout ‖ learner mismatch per action token) and InterQ-RL's α median / p10 / min against RL
    step, from metrics.jsonl rows (the caller saves and closes the figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "reward_mean" in r]
    steps = [r["step"] for r in train]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=110)
    k3 = [r.get("k3") for r in train]
    if any(v is not None for v in k3):
        ax1.plot(steps, [v if v is not None else float("nan") for v in k3], "o-", ms=3)
        if all(v is None or v > 0 for v in k3):
            ax1.set_yscale("log")
    ax1.set_title("K3 per action token", fontsize=10)
    ax1.set_xlabel("RL step")
    for key, style in (("alpha_median", "-"), ("alpha_p10", "--"), ("alpha_min", ":")):
        vals = [r.get(key) for r in train]
        if any(v is not None for v in vals):
            ax2.plot(steps, [v if v is not None else float("nan") for v in vals], style, label=key)
    ax2.set_title("InterQ-RL retention α", fontsize=10)
    ax2.set_xlabel("RL step")
    ax2.set_ylim(-0.02, 1.02)
    if ax2.lines:
        ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
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
        ax.plot(steps, mean, "o-", color=colors(i % 10), lw=2, ms=4, label=f"{arm} ({len(runs)} seeds)")
        for r in runs:
            ax.plot(r["steps"], r["success"], ".", color=colors(i % 10), alpha=0.35)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out success")
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
