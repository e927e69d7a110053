"""The run folder is safe to resume from and hard to mix up: the trainer state is never unpickled
(a crafted file cannot run code), a folder holding another run is refused unless resumed or
overwritten (which then removes all of it), one process at a time holds it, stale temporary
checkpoints are removed (a checkpoint a kill left only set aside is put back), a torn last
metrics line does not block a resume, and lost episodes' errors are written down."""
import json
import os
import pickle
import re
import shutil
import warnings

import pytest

from agentq.cli import main
from agentq.config import load_config
from agentq.trainer.run_dir import RunDirError, claim_run_dir, write_lost_episodes, write_run_config
from agentq.utils.checkpoint import CheckpointError, TrainerState, load_trainer_state, save_trainer_state
from agentq.utils.logging import MetricsLogger, read_metrics


class RunsShell:
    """Unpickling this runs `touch <marker>`: what a hostile trainer_state.pt can do to torch.load."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def crafted_checkpoint(run, marker, with_json: bool):
    ckpt = run / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    with open(ckpt / "trainer_state.pt", "wb") as f:
        pickle.dump({"optimizer": RunsShell(marker), "step": 1}, f)
    if with_json:
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": 1}))
    # a run's config.yaml, so that a resume gets as far as the trainer state (without one it is refused first)
    write_run_config(run, load_config(["env_pool=inline"]))
    return ckpt


@pytest.mark.parametrize("with_json", [True, False], ids=["crafted", "old-format"])
def test_resume_never_unpickles_the_trainer_state(tmp_path, with_json, capsys):
    run, marker = tmp_path / "run", tmp_path / "code-ran"
    crafted_checkpoint(run, marker, with_json)
    assert main(["train", f"trainer.resume={run}", "trainer.steps=2", "env_pool=inline"]) == 2
    assert ("never unpickled" if with_json else "older agentq") in capsys.readouterr().err
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="never unpickled" if with_json else "older agentq"):
        load_trainer_state(run / "checkpoints" / "step_000001")
    assert not marker.exists()


def test_trainer_state_round_trip(tmp_path):
    import numpy as np
    import torch

    rng = np.random.default_rng(5)
    rng.random(3)
    gen = torch.Generator().manual_seed(3)
    save_trainer_state(tmp_path, TrainerState(tensors={"torch_gen": gen.get_state(), "opt": {"step": torch.tensor(2.0)}},
                                              meta={"step": 7, "np_rng": rng.bit_generator.state}))
    back = load_trainer_state(tmp_path)
    again = np.random.default_rng()
    again.bit_generator.state = back.meta["np_rng"]
    assert again.random() == rng.random() and back.meta["step"] == 7
    assert torch.equal(back.tensors["torch_gen"], gen.get_state()) and float(back.tensors["opt"]["step"]) == 2.0


def test_a_folder_holding_a_run_is_refused_unless_resumed_or_overwritten(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000004").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 4}\n')
    (run / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="already holds a run .*trainer.overwrite=true"):
        claim_run_dir(run, resume=False, overwrite=False)
    claim_run_dir(run, resume=True, overwrite=False).close()           # a resume may
    claim_run_dir(run, resume=False, overwrite=True).close()           # overwrite removes the old run's files only
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    assert (run / "notes.txt").read_text() == "mine"


def test_cli_refuses_to_mix_two_runs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    from conftest import run_cli

    p = run_cli(["train", f"trainer.out_dir={run}", "trainer.steps=1"], timeout=300)
    assert p.returncode == 2 and "already holds a run" in p.stderr and "Traceback" not in p.stderr
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_one_process_per_run_folder(tmp_path):
    lock = claim_run_dir(tmp_path / "run", resume=False, overwrite=False)
    with pytest.raises(RunDirError, match=f"in use by another agentq process \\(pid {os.getpid()}\\)"):
        claim_run_dir(tmp_path / "run", resume=True, overwrite=False)
    lock.close()
    claim_run_dir(tmp_path / "run", resume=True, overwrite=False).close()


def test_stale_temporary_checkpoints_are_removed_at_start(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    for name in ("step_000002", ".step_000004.tmpab12cd", ".step_000002.old"):
        (ckpts / name).mkdir(parents=True)
        (ckpts / name / "model.safetensors").write_text("x")
    claim_run_dir(tmp_path / "run", resume=True, overwrite=False).close()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000002"]


def test_overwrite_removes_every_file_of_the_old_run(tmp_path):
    run = tmp_path / "run"
    for name in ("segments/step_000003.parquet", "tb/events.out.tfevents.1", "eval/step_000003/eval.json",
                 "checkpoints/step_000003/model.safetensors"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
    for name in ("metrics.jsonl", "errors.jsonl", "train_summary.json", "learning_curve.png", "mismatch.png",
                 "report.html", "notes.txt"):
        (run / name).write_text("x")
    claim_run_dir(run, resume=False, overwrite=True).close()
    # the old run's later segments would otherwise be read as this run's (read_segments, agentq report)
    assert sorted(p.name for p in run.iterdir()) == [".agentq.lock", "notes.txt"]


def test_a_checkpoint_left_only_as_old_by_a_kill_mid_commit_is_restored(tmp_path):
    # killed between _commit's two renames: step 2 exists only as .step_000002.old (the new copy as .tmp*)
    ckpts = tmp_path / "run" / "checkpoints"
    for name, text in (("step_000001", "1"), (".step_000002.old", "2"), (".step_000002.tmpab12", "2 again")):
        (ckpts / name).mkdir(parents=True)
        (ckpts / name / "model.safetensors").write_text(text)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 2}\n')
    claim_run_dir(tmp_path / "run", resume=True, overwrite=False).close()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000002"]
    assert (ckpts / "step_000002" / "model.safetensors").read_text() == "2"


def test_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    rows = [{"step": 1, "reward_mean": 0.5}, {"step": 2, "reward_mean": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')
    with pytest.warns(UserWarning, match="torn last line 3"):
        assert read_metrics(tmp_path / "metrics.jsonl") == rows
    with pytest.warns(UserWarning, match="torn last line"):
        MetricsLogger.truncate(tmp_path, 2)                  # what a resume does first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_metrics(tmp_path / "metrics.jsonl") == rows
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl: line 2 is not JSON"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_lost_episodes_are_written_with_their_error(tmp_path):
    from agentq.agent.trajectory import Trajectory

    trajs = [Trajectory(1, "coin/1", "train", end_reason="won"),
             Trajectory(2, "coin/2", "train", end_reason="error", error="env worker 1 died (exit code -9); restarted")]
    assert write_lost_episodes(tmp_path, 5, trajs) == 1
    (row,) = [json.loads(x) for x in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert row == {"step": 5, "episode_id": 2, "task_id": "coin/2", "split": "train",
                   "error": "env worker 1 died (exit code -9); restarted"}


def test_a_pipeline_folder_given_as_trainer_out_dir_points_the_resume_at_its_rl_stage(tmp_path):
    """`trainer.out_dir=runs/pipeC` suggested `trainer.resume='runs/pipeC'`, which then failed with "no
    checkpoints/step_*": a pipeline's RL run is its rl/. A pipeline's folder is refused to `agentq
    train` whatever the settings (trainer.overwrite removed the curve and report the two share)."""
    pipe = tmp_path / "pipeC"
    (pipe / "rl" / "checkpoints" / "step_000002").mkdir(parents=True)
    (pipe / "sft").mkdir()
    for name in ("summary.json", "learning_curve.png", "report.html"):
        (pipe / name).write_text("x")
    for resume, overwrite in ((False, False), (False, True), (True, False)):
        with pytest.raises(RunDirError) as e:
            claim_run_dir(pipe, resume=resume, overwrite=overwrite)
        assert str(e.value) == (f"run folder {str(pipe)!r} (trainer.out_dir) holds an `agentq pipeline` run (summary.json, rl), not "
                                "an `agentq train` one: pick another trainer.out_dir (trainer.overwrite=true replaces "
                                f"only a run of the same command); continue its RL stage with "
                                f"trainer.resume={str(pipe / 'rl')!r}")
    assert sorted(p.name for p in pipe.iterdir()) == [".agentq.lock", "learning_curve.png", "report.html", "rl", "sft",
                                                      "summary.json"]
    (pipe / "metrics.jsonl").write_text("{}\n")       # a run folder: its own resume, as before
    for name in ("summary.json", "rl", "sft"):
        shutil.rmtree(pipe / name) if (pipe / name).is_dir() else (pipe / name).unlink()
    with pytest.raises(RunDirError, match=re.escape(f"; continue it with trainer.resume={str(pipe)!r}, pick another")):
        claim_run_dir(pipe, resume=False, overwrite=False)
