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


def test_a_resume_that_moves_the_curve_says_so_and_follows_the_new_one(tmp_path, capfd):
    """trainer.steps 3 → 5 on a resume under linear decay: steps 4 and 5 run on the 5-step curve
    (p = 3/5, 4/5: 0.64e-5, 0.52e-5), and the resume names the change; the optimizer line no longer
    reports the scheduled rate as a changed setting."""
    run = tmp_path / "run"
    common = ["trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2", "env.max_new_tokens=8",
              "env_pool=inline", "trainer.eval_every=-1", "trainer.lr=1e-5", "trainer.lr_schedule=linear",
              "trainer.lr_min_ratio=0.4"]
    assert main(["train", "trainer.steps=3", *common, f"trainer.out_dir={run}"]) == 0
    capfd.readouterr()
    assert main(["train", "trainer.steps=5", f"trainer.resume={run}"]) == 0
    out = capfd.readouterr().err          # the console writes to stderr
    out = " ".join(out.split())                # rich wraps long lines
    assert "step 4 runs at lr 6.4e-06 where the run's own settings gave" in out and "trainer.steps 3 → 5" in out
    assert "the optimizer takes this config's" not in out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows if "lr" in r] == pytest.approx([1e-5, 0.8e-5, 0.6e-5, 0.64e-5, 0.52e-5], rel=1e-12)


def test_lr_change_note_by_hand(tmp_path):
    from omegaconf import OmegaConf

    from agentq.trainer.rl import lr_change_note

    saved = tmp_path / "config.yaml"
    then = {"lr": 1e-5, "steps": 10, "lr_warmup_steps": 0, "lr_schedule": "cosine", "lr_min_ratio": 0.0}
    saved.write_text(OmegaConf.to_yaml({"trainer": then}))
    assert lr_change_note(saved, OmegaConf.create(then), 6) is None          # a plain resume: nothing changed
    assert lr_change_note(tmp_path / "none.yaml", OmegaConf.create(then), 6) is None
    note = lr_change_note(saved, OmegaConf.create({**then, "steps": 20}), 6)
    # cosine: 0.5 (1 + cos(π p)); p = 5/10 → 0.5e-5 before, p = 5/20 → 0.853553e-5 now
    assert note.startswith("step 6 runs at lr 8.536e-06 where the run's own settings gave 5e-06 (trainer.steps 10 → 20)")


def test_a_warmup_longer_than_the_run_is_refused(tmp_path, capsys):
    assert main(["train", "trainer.steps=5", "trainer.lr_warmup_steps=50", f"trainer.out_dir={tmp_path / 'run'}"]) == 2
    assert "trainer.lr_warmup_steps=50 > trainer.steps=5" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
