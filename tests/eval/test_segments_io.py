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


def _batch(ref: bool, weight: bool):
    """Two hand-built rows: row 0's actions at positions 2, 3 (turn 1) and 5 (turn 2), row 1's at 1 (turn 1);
    log-probs and weights distinct per position, so a wrong position picks a wrong number."""
    import torch

    from agentq.learner.batch import PolicyBatch

    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 0], [0, 1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    seg = torch.tensor([[0, 0, 1, 1, 0, 2, 0], [0, 1, 0, 0, 0, 0, 0]])
    pos = torch.arange(7, dtype=torch.float32).expand(2, 7)
    return PolicyBatch(input_ids=torch.arange(100, 114).view(2, 7), attention_mask=torch.ones(2, 7, dtype=torch.long),
                       action_mask=mask, seg_id=seg, rollout_logp=-0.1 * pos, adv=torch.tensor([0.5, -0.5]),
                       old_logp=-0.1 * pos - 0.01, ref_logp=-0.2 * pos if ref else None,
                       token_weight=0.125 * pos * mask if weight else None)


def _trajs():
    from agentq.agent.trajectory import Trajectory

    return [Trajectory(episode_id=i, task_id=f"t{i}", split="train", reward=1.0 - i) for i in (0, 1)]


def test_segment_rows_carry_each_action_tokens_position_reference_logp_and_weight(tmp_path):
    """'Mismatch vs context position' needs each action token's position; π_ref and the weight w_t
    the loss applied were not stored either."""
    from agentq.eval.segments import segment_rows

    rows = segment_rows(3, _trajs(), _batch(ref=True, weight=True), None)
    assert [(r["row"], r["turn"]) for r in rows] == [(0, 1), (0, 2), (1, 1)]
    assert [r["position"] for r in rows] == [[2, 3], [5], [1]]
    assert [r["logp_ref"] for r in rows] == [pytest.approx([-0.4, -0.6]), pytest.approx([-1.0]), pytest.approx([-0.2])]
    assert [r["weight"] for r in rows] == [[0.25, 0.375], [0.625], [0.125]]
    assert [r["token_ids"] for r in rows] == [[102, 103], [105], [108]]
    write_segments(tmp_path, 3, rows)
    table = read_segments(tmp_path)
    assert [str(table.schema.field(c).type.value_type) for c in ("position", "logp_ref", "weight")] == [
        "int64", "float", "float"]
    assert table.column("position").to_pylist() == [[2, 3], [5], [1]]
    # no reference model: null; no weights from prepare: the loss's 1 on each action token
    rows = segment_rows(3, _trajs(), _batch(ref=False, weight=False), None)
    assert [r["logp_ref"] for r in rows] == [None] * 3
    assert [r["weight"] for r in rows] == [[1.0, 1.0], [1.0], [1.0]]


def _old_row(step):
    """A row as the first version wrote it: no position, logp_ref nor weight."""
    return {k: v for k, v in _row(step, 1, 2, 0.4, 0.9).items() if k not in ("position", "logp_ref", "weight")}


def test_files_written_before_the_per_token_columns_still_read(tmp_path):
    """A run folder's older step files lack position, logp_ref and weight: read with those null,
    alone or beside newer files (a run resumed by a newer agentq)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentq.eval.segments import FOLDER, _schema

    (tmp_path / FOLDER).mkdir()
    old = pa.Table.from_pylist([_old_row(1)], schema=pa.schema([f for f in _schema() if f.name in _old_row(1)]))
    assert old.num_columns == 27
    pq.write_table(old, tmp_path / FOLDER / "step_000001.parquet")
    write_segments(tmp_path, 2, [_row(2, 1, 2, 0.4, 0.9) | {"position": [4, 5], "logp_ref": None,
                                                             "weight": [1.0, 0.5]}])
    table = read_segments(tmp_path)
    assert table.column("step").to_pylist() == [1, 2]
    assert table.column("position").to_pylist() == [None, [4, 5]]
    assert table.column("weight").to_pylist() == [None, [1.0, 0.5]]
    assert read_segments(tmp_path, steps=[1], columns=["step", "weight"]).to_pylist() == [{"step": 1, "weight": None}]
    assert read_segments(tmp_path, steps=[1]).column_names == read_segments(tmp_path, steps=[2]).column_names


def test_segments_due_every_step_none_or_every_nth():
    from agentq.eval.segments import segments_due

    assert [s for s in range(1, 8) if segments_due(True, s)] == [1, 2, 3, 4, 5, 6, 7]
    assert [s for s in range(1, 8) if segments_due(False, s)] == []
    assert [s for s in range(1, 8) if segments_due(3, s)] == [1, 3, 6]
    assert [s for s in range(1, 8) if segments_due(1, s)] == [1, 2, 3, 4, 5, 6, 7]


def test_a_run_with_save_segments_n_writes_steps_1_and_multiples_of_n(tmp_path):
    from agentq.cli import main
    from agentq.config import ConfigError, load_config

    run = tmp_path / "run"
    assert main(["train", "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2", "env_pool=inline",
                 "env.max_new_tokens=8", "trainer.eval_every=-1", "trainer.steps=3", "trainer.save_segments=2",
                 f"trainer.out_dir={run}"]) == 0
    assert sorted(p.name for p in (run / "segments").iterdir()) == ["step_000001.parquet", "step_000002.parquet"]
    for bad in ("0", "-2", "often"):
        with pytest.raises(ConfigError, match="trainer.save_segments.*true, false or a positive integer"):
            load_config([f"trainer.save_segments={bad}"])
