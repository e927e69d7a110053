"""`agentq train`'s last words: an unnamed run's folder is runs/<env>-<algo>-<time>, so the command
says where it went, its final checkpoint (what `agentq eval` takes) and the held-out result; and the
settings it refuses say so in one line, before anything is written."""
from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("overrides, said", [
    (["rollout.temperature=0"], "agentq: rollout.temperature=0: RL needs a sampling temperature > 0"),
    (["rollout.top_k=5"], "agentq: rollout.top_k=5, rollout.top_p=1.0: RL training supports temperature-only"),
    (["trainer.old_logp=bypass"], "agentq: trainer.old_logp=bypass is exact only when"),     # fp32 on the CPU
    (["algo=flashrl_tis", "algo.objective_params.is_cap=-1"], "agentq: algo=flashrl_tis: objective 'tis': is_cap=-1"),
    (["algo.dual_clip=0.5"], "agentq: algo=interq: objective 'interq': dual_clip=0.5; valid: > 1"),
    (["algo.objective=foo"], "agentq: algo=interq: unknown objective 'foo'"),
])
def test_refused_algo_and_sampling_settings_are_one_line_before_the_run_folder(overrides, said, tmp_path, capsys):
    """These refusals were ValueErrors: a traceback and exit 1 (the objective's after the run folder was
    made); a config error is one line naming the key, exit 2, and nothing written."""
    run = tmp_path / "run"
    assert main(["train", *overrides, "trainer.steps=1", "env_pool=inline", f"trainer.out_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not run.exists()


def test_a_bad_placement_value_is_one_line(tmp_path, capsys):
    assert main(["train", "placement=split", "placement.learner_ranks=0", "trainer.steps=1", "env_pool=inline",
                 f"trainer.out_dir={tmp_path / 'run'}"]) == 2
    assert "agentq: placement.learner_ranks=0: must be ≥ 1" in capsys.readouterr().err
