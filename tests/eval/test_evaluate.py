"""`agentq eval`'s output folder: without a checkpoint a new runs/eval-<env>-<split>-<time> (never the
model's own folder, which may be a shared cache or the user's checkpoint), created before anything
is played, so a path that cannot be made fails at once with the setting named."""
from __future__ import annotations

import json
import shutil

import pytest

from agentq.cli import main

SMALL = ["eval.num_tasks=1", "env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8"]


def test_eval_without_checkpoint_writes_a_new_runs_folder_not_the_models(tiny_model_dir, tmp_path, monkeypatch,
                                                                         capsys):
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", f"model.path={model}", *SMALL]) == 0
    (out,) = (tmp_path / "runs").glob("eval-textworld_express-test-*")
    assert f"eval.json and episodes.jsonl in {out.relative_to(tmp_path)}" in capsys.readouterr().err   # said where
    report = json.loads((out / "eval.json").read_text())
    assert (report["checkpoint"], report["split"], report["episodes"]) == (str(model), "test", 1)
    assert not list(model.glob("eval-*"))


def test_an_output_folder_that_cannot_be_made_fails_before_playing(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from agentq.eval import evaluate

    played = []
    monkeypatch.setattr(evaluate, "evaluate_policy", lambda *a, **k: played.append(1))
    (tmp_path / "a-file").write_text("x")
    bad = tmp_path / "a-file" / "eval"
    assert main(["eval", f"checkpoint={tiny_model_dir}", f"eval.out_dir={bad}", *SMALL]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"eval.out_dir: cannot create the evaluation's output folder '{bad}' (NotADirectoryError: Not a directory)" in said
    assert played == []


def test_the_trainers_evaluations_play_each_task_eval_repeats_times(tmp_path):
    """The trainer's final evaluation is `agentq eval`'s (`evaluate_policy`), eval.repeats included:
    the pipeline compares it with `agentq eval`'s reports, so both must hold tasks × repeats episodes."""
    run = tmp_path / "run"
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", "trainer.tasks_per_step=2", "trainer.group_size=2",
                 "env.max_steps=2", "env_pool=inline", "trainer.eval_every=0", "trainer.eval_num_tasks=2",
                 "eval.repeats=2"]) == 0
    report = json.loads((run / "eval" / "step_000001" / "eval.json").read_text())
    assert report["episodes"] == 4


def test_a_checkpoint_that_is_not_one_is_a_one_line_error(tmp_path, capsys):
    assert main(["eval", f"checkpoint={tmp_path / 'nowhere'}", *SMALL]) == 2
    assert "is not an HF checkpoint folder (no config.json)" in capsys.readouterr().err


def test_a_run_folder_given_as_checkpoint_names_its_last_checkpoint(tiny_model_dir, tmp_path, capsys):
    for step in ("step_000002", "step_000010"):
        shutil.copytree(tiny_model_dir, tmp_path / "run" / "checkpoints" / step)
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", *SMALL]) == 2
    said = capsys.readouterr().err
    assert f"a run folder? its last checkpoint is checkpoint={tmp_path / 'run' / 'checkpoints' / 'step_000010'}" in said


def test_an_unknown_split_is_a_one_line_error_and_leaves_no_folder(tiny_model_dir, tmp_path, capsys):
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    assert main(["eval", f"checkpoint={ckpt}", "split=nope", *SMALL]) == 2
    assert "split='nope'" in capsys.readouterr().err
    assert not list(ckpt.glob("eval-*"))       # was an empty eval-textworld_express-nope/ in the checkpoint


def test_unreadable_weights_leave_no_folder_in_the_checkpoint(tiny_model_dir, tmp_path, capsys):
    """The output folder was made before the weights were checked: a truncated checkpoint kept an empty
    eval-<env>-<split>/."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["eval", f"checkpoint={ckpt}", *SMALL]) == 2
    assert "is damaged or truncated" in capsys.readouterr().err
    assert not list(ckpt.glob("eval-*"))


def test_turns_of_won_episodes_with_none_won_reads_as_such():
    from agentq.eval.evaluate import turns_text

    assert turns_text(float("nan")) == turns_text(None) == "– (none won)" and turns_text(2.0) == "2.00"


def test_an_evaluation_inside_training_plays_the_episodes_agentq_eval_plays(tmp_path):
    """At temperature > 0 the episodes depend on their sampling seeds: the trainer's evaluation and
    `agentq eval` of the same checkpoint (same split, tasks, repeats, seed) must seed them alike, so
    their per-episode results are equal (the pipeline pairs them; a user re-checks one with the other)."""
    common = ["env_pool=inline", "env.max_steps=3", "env.max_new_tokens=12", "eval.temperature=1.0",
              "eval.repeats=2", "seed=3"]
    run = tmp_path / "run"
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", "trainer.tasks_per_step=2",
                 "trainer.group_size=2", "trainer.eval_every=0", "trainer.eval_num_tasks=3",
                 "trainer.save_segments=false", *common]) == 0
    ckpt = run / "checkpoints" / "step_000001"
    assert main(["eval", f"checkpoint={ckpt}", "eval.num_tasks=3", f"eval.out_dir={tmp_path / 'ev'}", *common]) == 0

    def episodes(folder):
        return [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
    inside, alone = episodes(run / "eval" / "step_000001"), episodes(tmp_path / "ev")
    assert len(inside) == len(alone) == 6
    assert inside == alone
    # the two repeats of a task sampled differently: the seeds matter, and were the same in both
    assert any(a["transcript"] != b["transcript"] for a, b in zip(inside[::2], inside[1::2]))


@pytest.mark.parametrize("layout", ["checkpoints/step_000002", "checkpoint"])     # an RL run's, an SFT run's
def test_a_checkpoint_evaluated_under_other_task_settings_than_its_run_says_so(tiny_model_dir, tmp_path, capsys,
                                                                               layout):
    """`agentq eval` composes conf/ and the command line, not the checkpoint's run: a checkpoint of the
    sweep's mapreader runs evaluated without env= played the default coin game, silently."""
    from omegaconf import OmegaConf

    from agentq.config import load_config

    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / layout)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["env=textworld_express_mapreader"]), resolve=True))
    assert main(["eval", f"checkpoint={ckpt}", *SMALL, f"eval.out_dir={tmp_path / 'e1'}"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert (f"warning: this checkpoint's run ({run / 'config.yaml'}) trained with other settings than this "
            "evaluation's: env.kwargs.games: trained ['mapreader'], now ['coin']. agentq eval reads conf/ and the "
            "command line, not the run's config") in said
    # the run's own env (and a step cap or turn length of one's choosing): nothing to say
    assert main(["eval", f"checkpoint={ckpt}", "env=textworld_express_mapreader", *SMALL,
                 f"eval.out_dir={tmp_path / 'e2'}"]) == 0
    assert "warning" not in capsys.readouterr().err
