"""The learning-curve PNG: written for long and short runs, with or without held-out points."""
import json

import pytest

from agentq.eval.plots import learning_curve


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
