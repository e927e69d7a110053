"""PNG plots of runs (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

from agentq.utils.logging import read_metrics


def learning_curve(metrics_path: str | Path, out_png: str | Path, sft_success: float | None = None,
                   title: str = "", split: str | None = None) -> Path:
    """Training reward and held-out success (on `split`) against RL step (SFT level as a dashed line)."""
    import matplotlib.pyplot as plt

    fig = learning_curve_figure(read_metrics(metrics_path), sft_success, title, split)
    out_png = Path(out_png)
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def learning_curve_figure(rows: list[dict], sft_success: float | None = None, title: str = "",
                          split: str | None = None):
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
    # penalties (invalid or inadmissible actions) can push the reward below 0: keep it in view
    ax.set_ylim(min([-0.02] + [x - 0.02 for x in reward]), 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


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
    out_png = Path(out_png)
    fig.savefig(out_png)
    plt.close(fig)
    return out_png
