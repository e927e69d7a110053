"""A run folder that holds a run is changed only once the new run has started: with
trainer.overwrite=true a bad setting or a missing path found at start-up is a one-line error, and
the earlier run's files (metrics, checkpoints, config.yaml) are still there."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentq.cli import main


def earlier_run(folder):
    (folder / "checkpoints" / "step_000004").mkdir(parents=True)
    (folder / "checkpoints" / "step_000004" / "model.safetensors").write_text("weights")
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 4, "reward_mean": 0.5}) + "\n")
    (folder / "config.yaml").write_text("seed: 7\n")
    return {p.relative_to(folder): p.read_text() for p in folder.rglob("*") if p.is_file()}


def files(folder):
    return {p.relative_to(folder): p.read_text() for p in folder.rglob("*") if p.is_file() and p.name != ".agentq.lock"}


def test_overwrite_with_a_missing_model_path_keeps_the_earlier_run(tmp_path, capsys):
    run = tmp_path / "run"
    before = earlier_run(run)
    assert main(["train", f"trainer.out_dir={run}", "trainer.overwrite=true", "model=hf",
                 f"model.path={tmp_path / 'nope'}", "env_pool=inline"]) == 2
    assert "is not an HF checkpoint folder (no config.json)" in capsys.readouterr().err
    assert files(run) == before


def test_sft_overwrite_with_a_missing_demos_file_keeps_the_earlier_run(tmp_path, capsys):
    out = tmp_path / "sft"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "model.safetensors").write_text("weights")
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "sft/train_loss": 1.0}) + "\n")
    before = files(out)
    assert main(["sft", f"sft.out_dir={out}", "trainer.overwrite=true", f"sft.demos={tmp_path / 'nope.jsonl'}",
                 "env_pool=inline"]) == 2
    err = capsys.readouterr().err
    assert f"sft.demos='{tmp_path / 'nope.jsonl'}': no such file" in " ".join(err.split()) and "Traceback" not in err
    assert files(out) == before


@pytest.mark.parametrize("cmd,key", [("train", "trainer.out_dir"), ("sft", "sft.out_dir"),
                                     ("pipeline", "pipeline.out_dir"), ("sweep", "sweep.out_dir")])
def test_an_output_folder_that_cannot_be_made_is_a_one_line_error(tmp_path, capsys, cmd, key):
    (tmp_path / "a-file").write_text("x")
    bad = tmp_path / "a-file" / "run"
    assert main([cmd, f"{key}={bad}", "env_pool=inline"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"agentq: {key}: cannot create the run folder '{bad}' (NotADirectoryError: Not a directory)" in said


@pytest.mark.parametrize("cmd,key", [("train", "trainer.out_dir"), ("sft", "sft.out_dir"),
                                     ("pipeline", "pipeline.out_dir"), ("sweep", "sweep.out_dir")])
def test_a_refused_model_path_leaves_no_folder_it_made(tmp_path, capsys, cmd, key):
    """The run folder (and here its parent) was made and locked before model.path was refused, and
    stayed behind empty; a folder that was there before stays."""
    args = [cmd, "model=hf", f"model.path={tmp_path / 'nope'}", "env_pool=inline"]
    assert main([*args, f"{key}={tmp_path / 'new' / 'run'}"]) == 2
    assert "is not an HF checkpoint folder (no config.json)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    assert main([*args, f"{key}={tmp_path / 'mine'}"]) == 2
    assert (tmp_path / "mine").is_dir()


def test_only_empty_folders_the_block_made_are_removed(tmp_path):
    from agentq.trainer.run_dir import LOCK_FILE, removed_if_left_empty

    with pytest.raises(RuntimeError), removed_if_left_empty(tmp_path / "a" / "b"):
        (tmp_path / "a" / "b").mkdir(parents=True)
        (tmp_path / "a" / "b" / LOCK_FILE).write_text("1")
        raise RuntimeError("refused")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), removed_if_left_empty(tmp_path / "a" / "b"):
        (tmp_path / "a" / "b").mkdir(parents=True)
        (tmp_path / "a" / "demos.jsonl").write_text("{}")      # something was written: kept
        raise RuntimeError("refused")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["demos.jsonl"]
    with removed_if_left_empty(tmp_path / "c"):                # no error: nothing removed
        (tmp_path / "c").mkdir()
    assert (tmp_path / "c").is_dir()


def test_unnamed_run_folders_are_one_folder_whatever_the_env_name(monkeypatch):
    """A plugin's `env.name=wordle_env:WordEnv` named runs/wordle_env:WordEnv-interq-<time>, and a Gymnasium
    id's "/" nested folders; the name is made one folder name as `agentq eval`'s output folders are."""
    from omegaconf import OmegaConf

    from agentq.trainer import run_dir
    from agentq.trainer.rl import run_dir_for

    monkeypatch.setattr(run_dir.time, "strftime", lambda fmt: "20250102-030405")
    cfg = OmegaConf.create({"trainer": {"resume": None, "out_dir": None}, "env": {"name": "wordle_env:WordEnv"},
                            "algo": {"name": "interq"}})
    assert run_dir_for(cfg) == Path("runs") / "wordle_env_WordEnv-interq-20250102-030405"
    # sft-, pipeline- and sweep- folders are named by the same function
    assert run_dir.new_run_dir("sweep-gymreg:words/Word-v0") == Path("runs") / "sweep-gymreg_words_Word-v0-20250102-030405"
    assert run_dir.new_run_dir("sft-textworld_express") == Path("runs") / "sft-textworld_express-20250102-030405"
