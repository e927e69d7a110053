"""`agentq train` with a learning-rate schedule: each RL step's rate, as metrics.jsonl logs it, is
trainer.lr × the schedule's factor at that step (hand numbers: linear decay toward 0.4 over 3 steps)."""
from __future__ import annotations

import json

import pytest

from agentq.cli import main


def test_each_step_runs_at_the_scheduled_rate(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "trainer.steps=3", "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2",
                 "env.max_new_tokens=8", "env_pool=inline", "trainer.eval_every=-1", "trainer.lr=1e-5",
                 "trainer.lr_schedule=linear", "trainer.lr_min_ratio=0.4", f"trainer.out_dir={run}"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "lr" in r]
    # p = (step − 1) / 3: 1 − 0.6 p
    assert lrs == pytest.approx([1e-5, 0.8e-5, 0.6e-5], rel=1e-12)


def test_a_bad_schedule_is_one_line(tmp_path, capsys):
    assert main(["train", "trainer.lr_schedule=step", f"trainer.out_dir={tmp_path / 'run'}"]) == 2
    assert "trainer.lr_schedule" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
