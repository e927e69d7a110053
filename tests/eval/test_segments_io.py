"""The segment history's files: atomic per-step writes, one-table reads, truncation on resume."""
from __future__ import annotations

import pytest

from agentq.eval.segments import read_segments, segment_steps, step_metrics, truncate_segments, write_segments


def _row(step, turn, tokens, k3_sum, alpha):
    return {"step": step, "row": 0, "episode_id": step, "task_id": "t", "group_id": 0, "turn": turn,
            "tokens": tokens, "delta_sum": 0.0, "k3_sum": k3_sum, "m": k3_sum, "H": 0.0, "alpha": alpha, "d": 0.0,
            "reward": 1.0, "advantage": 0.5, "won": True, "task_type": None, "end_reason": "won",
            "observation": "o", "assistant": "a", "action": "a", "feedback": "f", "token_ids": [1] * tokens,
            "token_text": None, "logp_behaviour": [0.0] * tokens, "logp_old": [0.0] * tokens, "delta": [0.0] * tokens}


def test_write_read_truncate_and_derived_metrics(tmp_path):
    for step in (1, 2, 3):
        write_segments(tmp_path, step, [_row(step, 1, 2, 0.4, 0.9), _row(step, 2, 3, 0.3, 0.5)])
    assert segment_steps(tmp_path) == [1, 2, 3] and not list((tmp_path / "segments").glob("*.tmp"))
    table = read_segments(tmp_path, columns=["step", "turn", "alpha"])
    assert table.num_rows == 6 and table.column_names == ["step", "turn", "alpha"]
    # k3 = (0.4 + 0.3) / 5 tokens; by turn 0.4/2, 0.3/3; α median of two segments = their mean;
    # token mean (0.9·2 + 0.5·3) / 5
    m = step_metrics(read_segments(tmp_path, steps=[2]).to_pylist())
    assert m["k3"] == pytest.approx(0.14) and m["k3_by_turn"] == pytest.approx([0.2, 0.1])
    assert (m["alpha_min"], m["alpha_max"]) == (0.5, 0.9) and m["alpha_median"] == pytest.approx(0.7)
    assert m["alpha_token_mean"] == pytest.approx(0.66)
    truncate_segments(tmp_path, 1)
    assert segment_steps(tmp_path) == [1]
    with pytest.raises(FileNotFoundError, match="no step_\\*.parquet"):
        read_segments(tmp_path / "elsewhere")
