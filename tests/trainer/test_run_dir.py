"""A run folder that holds a run is changed only once the new run has started: with
trainer.overwrite=true a bad setting or a missing path found at start-up is a one-line error, and
the earlier run's files (metrics, checkpoints, config.yaml) are still there."""
from __future__ import annotations

import json
import os
import re
import time
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
    from agentq.utils.folder_lock import LOCK_FILE, removed_if_left_empty

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


# one file or folder that only that command writes at the top of its folder (agentq.utils.run_folders.MARKERS)
WRITES = {"train": "train_summary.json", "sft": "sft_summary.json", "pipeline": "summary.json", "sweep": "table.md"}
# and a stopped `agentq eval` (it claims no run folder: `evaluate.check_not_a_run_folder`)
EVAL_WRITES = {**WRITES, "eval": "episodes.partial.jsonl"}


@pytest.mark.parametrize("theirs", sorted(EVAL_WRITES))
@pytest.mark.parametrize("mine", sorted(WRITES))
def test_a_folder_of_one_command_is_refused_to_every_other_whatever_the_settings(tmp_path, mine, theirs):
    """A pipeline wrote beside an `agentq train` run, `agentq sft` beside a pipeline, and
    trainer.overwrite=true removed what two commands' folders share (the curve, the report, metrics)."""
    from agentq.trainer.run_dir import RunDirError, claim_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / EVAL_WRITES[theirs]).write_text("{}")
    (run / "learning_curve.png").write_text("png")
    for resume, overwrite in ((False, False), (False, True), (True, False)):
        if mine == theirs:
            if resume or overwrite:         # its own kind: resumed or replaced as always
                claim_run_dir(run, resume=resume, overwrite=overwrite, kind=mine, remove=False).close()
            continue
        with pytest.raises(RunDirError) as e:
            claim_run_dir(run, resume=resume, overwrite=overwrite, kind=mine, out_key="x.out_dir")
        assert str(e.value) == (f"run folder {str(run)!r} (x.out_dir) holds an `agentq {theirs}` run ({EVAL_WRITES[theirs]}), not an "
                                f"`agentq {mine}` one: pick another x.out_dir (trainer.overwrite=true replaces only "
                                "a run of the same command)")
    assert sorted(p.name for p in run.iterdir()) == sorted([".agentq.lock", EVAL_WRITES[theirs], "learning_curve.png"])


def test_sft_into_a_pipeline_folder_is_refused_in_one_line(tmp_path, capsys):
    """`agentq sft sft.out_dir=<a pipeline's folder>` wrote its run beside the pipeline's sft/ and rl/."""
    pipe = tmp_path / "pipe"
    (pipe / "rl").mkdir(parents=True)
    (pipe / "summary.json").write_text("{}")
    assert main(["sft", f"sft.out_dir={pipe}", "trainer.overwrite=true", "env_pool=inline"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"agentq: run folder '{pipe}' (sft.out_dir) holds an `agentq pipeline` run (summary.json, rl), not an `agentq sft` one: "
        "pick another sft.out_dir (trainer.overwrite=true replaces only a run of the same command)")
    assert sorted(p.name for p in pipe.iterdir()) == [".agentq.lock", "rl", "summary.json"]


def test_a_sweep_into_a_train_run_folder_is_refused_and_its_folder_is_locked(tmp_path, capsys):
    """`agentq sweep` made its folder without a lock or a look at what it held."""
    from agentq.trainer.run_dir import claim_run_dir

    run = tmp_path / "run"
    before = earlier_run(run)
    (run / "train_summary.json").write_text("{}")
    assert main(["sweep", f"sweep.out_dir={run}", "sweep.arms=[bf16]", "sweep.seeds=[0]"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"agentq: run folder '{run}' (sweep.out_dir) holds an `agentq train` run (train_summary.json, checkpoints), not an "
        "`agentq sweep` one: pick another sweep.out_dir (trainer.overwrite=true replaces only a run of the same command)")
    assert files(run) == {**before, Path("train_summary.json"): "{}"}
    sweep_dir = tmp_path / "sweep"
    lock = claim_run_dir(sweep_dir, resume=True, overwrite=False, kind="sweep")     # another sweep's process
    try:
        assert main(["sweep", f"sweep.out_dir={sweep_dir}", "sweep.arms=[bf16]", "sweep.seeds=[0]"]) == 2
        assert "is in use by another agentq process" in capsys.readouterr().err
    finally:
        lock.close()


@pytest.mark.parametrize("layout,refused_to,whose", [
    # a train run killed before its first checkpoint, evaluation or summary
    (("metrics.jsonl", "tb/events", "config.yaml"), ("pipeline", "sweep"), "`agentq train` or `agentq sft`"),
    # a pipeline or a sweep killed in its SFT stage: only its sft/ (an `agentq sft` folder)
    (("sft/config.yaml", "sft/demos.jsonl"), ("train", "sft"), "`agentq pipeline` or `agentq sweep`")])
def test_a_run_cut_short_before_its_own_markers_is_refused_to_the_others(tmp_path, layout, refused_to, whose):
    """Only what one command writes named a folder's owner: a pipeline went into a train run killed
    before its first checkpoint, and `agentq train` into a sweep killed during its SFT stage."""
    from agentq.trainer.run_dir import RunDirError, claim_run_dir

    run = tmp_path / "run"
    for name in layout:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
    for kind in ("train", "sft", "pipeline", "sweep"):
        if kind in refused_to:
            with pytest.raises(RunDirError, match=re.escape(f"holds an {whose} run (")):
                claim_run_dir(run, resume=False, overwrite=True, kind=kind, remove=False)
        else:
            claim_run_dir(run, resume=True, overwrite=False, kind=kind, remove=False).close()


def test_an_older_pipeline_folder_with_a_sweeps_eval_sft_is_still_the_pipelines(tmp_path):
    """Pipelines once wrote eval_sft/ (a sweep's marker) beside summary.json and rl/: their own markers
    make the folder theirs; a sweep is still refused it."""
    from agentq.trainer.run_dir import RunDirError, claim_run_dir

    run = tmp_path / "old"
    for name in ("eval_sft", "rl"):
        (run / name).mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    claim_run_dir(run, resume=False, overwrite=True, kind="pipeline", remove=False).close()
    with pytest.raises(RunDirError, match=re.escape("holds an `agentq pipeline` run (summary.json, rl)")):
        claim_run_dir(run, resume=True, overwrite=False, kind="sweep")


@pytest.mark.parametrize("step,error", [("remove_stale_temp_dirs", OSError("disk gone")),
                                        ("remove_run_artifacts", OSError("read-only file system")),
                                        ("recover_eval_pairs", KeyboardInterrupt())])
def test_an_error_after_the_folder_is_locked_releases_it(tmp_path, monkeypatch, step, error):
    """claim_run_dir released its lock only on its own refusals: an OSError of the clean-up or a Ctrl-C
    after the lock was taken left the folder locked until garbage collection, and the next claim in
    the same process was refused as "in use by another agentq process"."""
    from agentq.trainer import run_dir

    run = tmp_path / "run"
    earlier_run(run)                    # an earlier run, so that overwrite has files to remove

    def broken(*a, **kw):
        raise error

    monkeypatch.setattr(run_dir, step, broken)
    with pytest.raises(type(error)) as raised:      # `raised` keeps the frames (and a leaked lock) alive
        run_dir.claim_run_dir(run, resume=False, overwrite=True)
    monkeypatch.undo()
    run_dir.claim_run_dir(run, resume=True, overwrite=False).close()
    assert raised.type is type(error)


@pytest.mark.parametrize("kind,name", [("train", "config.yaml"), ("sweep", "table.md")])
def test_claiming_a_run_folder_removes_a_killed_writers_temporaries(tmp_path, kind, name):
    """A kill mid-write of config.yaml or table.md (`replaced`) left its hidden temporary for good."""
    import subprocess
    import sys

    from agentq.trainer.run_dir import claim_run_dir
    from agentq.utils.files import TEMPORARY_NAME

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()                                    # a writer that is gone
    run = tmp_path / "run"
    run.mkdir()
    (run / name).write_text("whole")
    stale = run / TEMPORARY_NAME.format(name=name, pid=child.pid, token="0123456789ab")
    stale.write_text("half")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))     # an hour old (a recent one is left)
    claim_run_dir(run, resume=True, overwrite=False, kind=kind).close()
    assert sorted(p.name for p in run.iterdir()) == [".agentq.lock", name] and (run / name).read_text() == "whole"


def test_the_resume_hint_is_only_for_the_command_that_reads_trainer_resume(tmp_path):
    """A train-kind folder named by another command's key (a pipeline's RL stage, a sweep's arm)
    advised trainer.resume, which those commands refuse."""
    from agentq.trainer.run_dir import RunDirError, claim_run_dir

    run = tmp_path / "rl"
    earlier_run(run)
    with pytest.raises(RunDirError) as raised:
        claim_run_dir(run, resume=False, overwrite=False, out_key="pipeline.out_dir")
    assert str(raised.value) == (
        f"run folder '{run}' (pipeline.out_dir) already holds a run (metrics.jsonl, checkpoints); pick "
        "another pipeline.out_dir, or replace it with trainer.overwrite=true")
    with pytest.raises(RunDirError, match=re.escape(f"continue it with trainer.resume='{run}', pick another "
                                                    "trainer.out_dir")):
        claim_run_dir(run, resume=False, overwrite=False)


def test_a_resume_of_another_commands_folder_names_the_one_to_give(tmp_path, capsys):
    """trainer.resume=<a pipeline folder>, <an SFT folder> or <run>/checkpoints said "no checkpoints/step_*
    in that run folder (a run saves one every trainer.save_every steps ...)", as though to wait for one."""
    run = tmp_path / "run"
    earlier_run(run)
    pipe = tmp_path / "pipe"
    (pipe / "rl" / "checkpoints" / "step_000002").mkdir(parents=True)
    (pipe / "summary.json").write_text("{}")
    sft = tmp_path / "sft"
    (sft / "checkpoint").mkdir(parents=True)
    (sft / "sft_summary.json").write_text("{}")
    pruned = run / "checkpoints" / "step_000002"        # a step folder keep_checkpoints emptied
    pruned.mkdir()
    for resume, said in [
        (pipe, f"is an `agentq pipeline` folder (summary.json, rl), not an `agentq train` run; continue its RL stage "
               f"with trainer.resume='{pipe / 'rl'}'"),
        (sft, f"is an `agentq sft` folder (sft_summary.json, checkpoint), not an `agentq train` run: agentq train "
              f"does not resume an SFT run; RL from its checkpoint is model.path='{sft / 'checkpoint'}'"),
        (run / "checkpoints", f"is a run's checkpoints folder; trainer.resume takes the run folder above it "
                              f"('{run}') and continues from its latest checkpoint"),
        (pruned, f"is a checkpoint; trainer.resume takes its run folder ('{run}') and continues from its latest "
                 "checkpoint"),
    ]:
        assert main(["train", f"trainer.resume={resume}", "trainer.steps=1", "env_pool=inline"]) == 2
        assert capsys.readouterr().err.strip() == f"agentq: trainer.resume='{resume}' {said}"
    assert not (pipe / ".agentq.lock").exists() and not (sft / ".agentq.lock").exists()


def test_resuming_a_run_another_process_runs_says_it_is_in_use(tmp_path, capsys):
    """`trainer.resume` of a run still running, before its first checkpoint, said "no checkpoints/step_*
    in that run folder", as though there were nothing to wait for; past it, the lock's refusal told a
    resume to "pick another trainer.out_dir". Both now say the folder is in use, and to wait."""
    from agentq.config import ConfigError
    from agentq.trainer.run_dir import RunDirError, check_resume_dir, claim_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 7\n")            # a run started: no step, no checkpoint yet
    in_use = (f"run folder '{run}' is in use by another agentq process (pid {os.getpid()}); wait for it to finish "
              "(or stop it), then resume it")
    held = claim_run_dir(run, resume=False, overwrite=False)          # the running process's lock
    try:
        assert main(["train", f"trainer.resume={run}", "trainer.steps=1", "env_pool=inline"]) == 2
        assert capsys.readouterr().err.strip() == f"agentq: {in_use}"
        (run / "checkpoints" / "step_000001").mkdir(parents=True)  # its first checkpoint: the lock refuses
        with pytest.raises(RunDirError) as refused:
            claim_run_dir(run, resume=True, overwrite=False)
        assert str(refused.value) == in_use
        (run / "checkpoints" / "step_000001").rmdir()
    finally:
        held.close()
    # the process gone: nothing to resume from, said as before
    with pytest.raises(ConfigError) as none:
        check_resume_dir(run)
    assert str(none.value) == (f"trainer.resume='{run}': no checkpoints/step_* in that run folder (a run saves one "
                               "every trainer.save_every steps and at its end)")
    assert not isinstance(none.value, RunDirError)


def test_config_yaml_is_replaced_whole(tmp_path, disk_full_at):
    """config.yaml was rewritten in place at every start and resume: a kill or a full disk mid-write
    left it empty or cut short, and the resume then read a damaged file."""
    from agentq.config import load_config
    from agentq.trainer.run_dir import write_run_config

    write_run_config(tmp_path, load_config([]))
    before = (tmp_path / "config.yaml").read_text()
    cut = disk_full_at("config.yaml")
    with pytest.raises(OSError, match="No space left"):
        write_run_config(tmp_path, load_config(["trainer.steps=7"]))
    assert cut and (tmp_path / "config.yaml").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]        # no temporary file left


@pytest.mark.parametrize("text,why", [
    ("", "empty"),
    ("- a\n- b\n", "a list, not a mapping of settings"),
    ("42\n", "a single value, not a mapping of settings"),
    ("env:\n  name: x\nmodel: {\n", "not YAML: "),
    ("\xff\xfe", "not UTF-8 text"),
    ("seed: 0\n", "it lacks env, model, rollout, algo, trainer, env_pool, device, dtype, agent, eval"),
], ids=["empty", "list", "scalar", "garbled", "binary", "no-sections"])
def test_a_damaged_config_yaml_is_named_with_what_to_do(tmp_path, text, why):
    from agentq.config import ConfigError
    from agentq.trainer.run_dir import read_run_config

    assert read_run_config(tmp_path / "config.yaml") is None            # none: the caller decides
    (tmp_path / "config.yaml").write_bytes(text.encode("latin-1") if text == "\xff\xfe" else text.encode())
    with pytest.raises(ConfigError) as e:
        read_run_config(tmp_path / "config.yaml")
    assert str(e.value).startswith(f"run folder {str(tmp_path)!r}: config.yaml is damaged ({why}")
    assert "agentq config <the command line that started the run> > " in str(e.value) and "\n" not in str(e.value)


def test_a_pipelines_rl_stage_is_told_the_rl_stages_settings(tmp_path):
    """The RL stage of a pipeline ran the pipeline's settings with env.eval_split and trainer.out_dir of
    its own: the hint to write a lost config.yaml back said only 'agentq config <the command line that
    started the run>', i.e. the pipeline's, which gives other settings."""
    from agentq.trainer.run_dir import restore_config_hint

    (tmp_path / "pipe" / "sft").mkdir(parents=True)
    assert "the command line that started the run" in restore_config_hint(tmp_path / "pipe" / "rl")  # sft/ + rl/ runs
    (tmp_path / "pipe" / "eval_sft_dev").mkdir()                  # what only a pipeline writes beside them
    hint = restore_config_hint(tmp_path / "pipe" / "rl")
    assert (f"agentq config pipeline <the pipeline's overrides> env.eval_split=<its first pipeline.eval_splits> "
            f"trainer.out_dir={tmp_path / 'pipe' / 'rl'} > {tmp_path / 'pipe' / 'rl' / 'config.yaml'}") in hint
    assert "the command line that started the run" in restore_config_hint(tmp_path / "rl")   # a run named rl


def test_a_config_yaml_cut_in_its_last_section_is_named_cut_short(tmp_path):
    """A config.yaml cut after every section had begun (in sft: or pipeline:) parsed as a smaller run and
    resumed under it. It now ends with a marker line that its first line announces, so a cut anywhere is
    named; a file written before the marker existed (no first line) is read as before."""
    from agentq.config import ConfigError, load_config
    from agentq.trainer.run_dir import CONFIG_FOOTER, CONFIG_HEADER, read_run_config, write_run_config

    path = write_run_config(tmp_path, load_config([]))
    text = path.read_text()
    assert text.startswith(CONFIG_HEADER + "\n") and text.endswith(CONFIG_FOOTER + "\n")
    assert read_run_config(path) == load_config([])                       # whole: read as it was written
    lines = text.splitlines(True)
    last_section = max(i for i, line in enumerate(lines) if line[:1].isalpha())
    for cut in (len(lines) - 1, last_section + 1, last_section):
        path.write_text("".join(lines[:cut]))
        with pytest.raises(ConfigError, match=r"config.yaml is damaged \(cut short: its last line, the end marker"):
            read_run_config(path)
    for tail in ("\n\n", "  \n", "\r\n\r\n"):                              # blank lines after the marker: whole
        path.write_text(text.rstrip("\n") + tail)
        assert read_run_config(path) == load_config([])
    old = "".join(lines[1:-1])                                           # a file from before the marker lines
    path.write_text("".join(old.splitlines(True)[:-1]))
    assert read_run_config(path) is not None


@pytest.mark.parametrize("kind", ["train", "sft"])
def test_overwrite_removes_the_earlier_runs_wandb_files(tmp_path, kind):
    """trainer.overwrite=true left wandb/ and wandb_run_id: a resume of the new run then continued the
    replaced run's W&B run (the id in that file). Both go with the run's other files; the rest stays."""
    from agentq.trainer.run_dir import ARTIFACTS, claim_run_dir, remove_run_artifacts
    from agentq.utils.logging import WANDB_ID_FILE

    run = tmp_path / "run"
    (run / "wandb" / "offline-run-1").mkdir(parents=True)
    (run / WANDB_ID_FILE).write_text("oldid123\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "notes.txt").write_text("mine\n")
    with pytest.raises(Exception, match="already holds a run"):
        claim_run_dir(run, resume=False, overwrite=False, kind=kind).close()
    claim_run_dir(run, resume=False, overwrite=True, kind=kind, remove=False).close()
    removed = remove_run_artifacts(run, ARTIFACTS[kind])
    assert {"wandb", WANDB_ID_FILE} <= set(removed)
    assert not (run / "wandb").exists() and not (run / WANDB_ID_FILE).exists()
    assert (run / "notes.txt").exists()
