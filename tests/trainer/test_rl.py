"""`agentq train`'s last words: an unnamed run's folder is runs/<env>-<algo>-<time>, so the command
says where it went, its final checkpoint (what `agentq eval` takes) and the held-out result."""
from __future__ import annotations

from agentq.cli import main


def test_train_says_where_the_run_went_and_how_it_ended(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "trainer.steps=1", "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2",
                 "env.max_new_tokens=8", "env_pool=inline", "trainer.eval_num_tasks=2"]) == 0
    (run,) = (tmp_path / "runs").glob("textworld_express-interq-*")
    said = capsys.readouterr().err
    rel = run.relative_to(tmp_path)
    assert f"run folder {rel}; final checkpoint {rel / 'checkpoints' / 'step_000001'}; held-out test: success " in said
    assert f"of 2 episodes ({rel / 'eval' / 'step_000001'}); HTML report: agentq report {rel}" in said
