"""An evaluation folder's eval.json and episodes.jsonl as one pair: written so that a reader finds the old
pair or the new one (eval.json then episodes.jsonl, one after the other: a crash or Ctrl-C between them
left a summary beside episodes it does not count), and tied by the episodes' sha256, which `read_eval`
(and through it `agentq report`) checks."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from agentq.agent.trajectory import Trajectory
from agentq.eval.episodes import EvalPairError, read_eval
from agentq.eval.evaluate import write_eval
from agentq.eval.metrics import summarize


def _evaluation(n: int, won: int) -> tuple[dict, list[Trajectory]]:
    trajs = [Trajectory(episode_id=i, task_id=f"t{i}", split="test", turns=1) for i in range(n)]
    for t in trajs[:won]:
        t.won, t.end_reason = True, "won"
    return {"step": 1, "env": "e", "split": "test", **summarize(trajs)}, trajs


def _pair(out: Path) -> tuple[bytes, bytes]:
    return (out / "eval.json").read_bytes(), (out / "episodes.jsonl").read_bytes()


def test_eval_json_records_the_sha256_of_its_episodes(tmp_path):
    """The report's keys are unchanged, in order, with `episodes_sha256` after them (in memory too)."""
    report, trajs = _evaluation(3, 1)
    keys = list(report)
    write_eval(tmp_path, report, trajs)
    on_disk = json.loads((tmp_path / "eval.json").read_text())
    digest = hashlib.sha256((tmp_path / "episodes.jsonl").read_bytes()).hexdigest()
    assert list(on_disk) == keys + ["episodes_sha256"] and on_disk["episodes_sha256"] == digest
    assert report["episodes_sha256"] == digest and report["out_dir"] == str(tmp_path)
    assert read_eval(tmp_path) == on_disk and on_disk["episodes"] == 3 and on_disk["success_rate"] == 1 / 3
    assert sorted(os.listdir(tmp_path)) == ["episodes.jsonl", "eval.json"]          # no temporary file left


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("failing", ["eval.json.tmp written", "eval.json set aside", "episodes.jsonl set aside",
                                     "episodes.jsonl renamed in", "eval.json renamed in"])
def test_a_rewrite_that_fails_midway_leaves_the_old_pair(tmp_path, monkeypatch, failing, exc):
    """Re-evaluating into a folder and failing (disk full, Ctrl-C) at any point of the write: the old
    pair is there byte for byte, and nothing else; the next evaluation writes its pair."""
    old_report, old_trajs = _evaluation(4, 1)
    write_eval(tmp_path, old_report, old_trajs)
    old = _pair(tmp_path)
    # the first rename onto episodes.jsonl, from whatever name (the writer before this one wrote eval.json,
    # then renamed its episodes in: failing there left the new eval.json beside the old episodes)
    where = {"eval.json set aside": ("eval.json", ".eval.json.old"),
             "episodes.jsonl set aside": ("episodes.jsonl", ".episodes.jsonl.old"),
             "episodes.jsonl renamed in": (None, "episodes.jsonl"),
             "eval.json renamed in": (".eval.json.tmp", "eval.json")}.get(failing)
    real_replace, real_write = os.replace, Path.write_text
    raised = []

    def replace(src, dst):
        if where and where[0] in (None, Path(src).name) and Path(dst).name == where[1] and not raised:
            raised.append(exc)
            raise exc
        real_replace(src, dst)

    def write_text(self, *a, **kw):
        if failing == "eval.json.tmp written" and self.name == ".eval.json.tmp":
            raise exc
        return real_write(self, *a, **kw)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(Path, "write_text", write_text)
    new_report, new_trajs = _evaluation(6, 5)
    with pytest.raises(type(exc)):
        write_eval(tmp_path, new_report, new_trajs)
    assert _pair(tmp_path) == old and sorted(os.listdir(tmp_path)) == ["episodes.jsonl", "eval.json"]
    assert read_eval(tmp_path)["episodes"] == 4
    monkeypatch.undo()
    write_eval(tmp_path, new_report, new_trajs)
    assert read_eval(tmp_path)["episodes"] == 6 and len(_pair(tmp_path)[1].splitlines()) == 6


def test_between_the_renames_a_reader_never_finds_a_mismatched_pair(tmp_path, monkeypatch):
    """The files are synced before any rename; eval.json (what readers look for) is set aside first and
    renamed in last, so after every rename `read_eval` finds the old pair, the new one, or no eval.json."""
    write_eval(tmp_path, *_evaluation(4, 1))
    events, seen = [], []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src, dst):
        real_replace(src, dst)
        events.append(("replace", Path(src).name, Path(dst).name))
        try:
            seen.append(read_eval(tmp_path)["episodes"])
        except FileNotFoundError:
            seen.append(None)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name)),
                                                 real_fsync(fd))[1])
    write_eval(tmp_path, *_evaluation(6, 5))
    assert events == [("fsync", ".eval.json.tmp"), ("fsync", ".episodes.jsonl.tmp"),
                      ("replace", "eval.json", ".eval.json.old"), ("replace", "episodes.jsonl", ".episodes.jsonl.old"),
                      ("replace", ".episodes.jsonl.tmp", "episodes.jsonl"), ("replace", ".eval.json.tmp", "eval.json"),
                      ("fsync", tmp_path.name)]
    assert seen == [None, None, None, 6] and sorted(os.listdir(tmp_path)) == ["episodes.jsonl", "eval.json"]


def test_read_eval_refuses_an_eval_json_that_does_not_describe_its_episodes(tmp_path):
    """Episodes of another evaluation beside eval.json, or an edited line: one line naming the folder,
    both counts and both hashes. An eval.json from before the sha256 was recorded, or one whose
    episodes.jsonl was deleted, is read unchecked."""
    from agentq.utils.checkpoint import CheckpointError

    assert issubclass(EvalPairError, CheckpointError)      # a run folder's bad file: one line from the CLI
    report, trajs = _evaluation(4, 1)
    write_eval(tmp_path / "a", report, trajs)
    write_eval(tmp_path / "b", *_evaluation(3, 3))
    good = (tmp_path / "a" / "episodes.jsonl").read_bytes()
    want = report["episodes_sha256"]
    for episodes in [(tmp_path / "b" / "episodes.jsonl").read_bytes(), good.replace(b'"won": false', b'"won": true', 1)]:
        (tmp_path / "a" / "episodes.jsonl").write_bytes(episodes)
        got = hashlib.sha256(episodes).hexdigest()
        with pytest.raises(EvalPairError) as e:
            read_eval(tmp_path / "a")
        assert str(e.value) == (
            f"{tmp_path / 'a'}: eval.json does not describe the episodes.jsonl beside it (eval.json: 4 episodes, "
            f"sha256 {want[:12]}; episodes.jsonl: {len(episodes.splitlines())} lines, sha256 {got[:12]}): one was "
            "replaced or edited after the evaluation; rerun it")
    legacy = {k: v for k, v in json.loads((tmp_path / "a" / "eval.json").read_text()).items() if k != "episodes_sha256"}
    (tmp_path / "a" / "eval.json").write_text(json.dumps(legacy))
    assert read_eval(tmp_path / "a") == legacy
    (tmp_path / "b" / "episodes.jsonl").unlink()
    assert read_eval(tmp_path / "b")["episodes"] == 3


class _Killed(BaseException):
    """The process dying at a rename: nothing after it runs (no undo, no cleanup)."""


def _killed_rewrite(out: Path, renames: int) -> tuple[bytes, bytes]:
    """An evaluation of 4 episodes written into `out`, then a rewrite of 6 killed after `renames` of its
    four renames (two asides, two in): no undo, no cleanup. Returns the first pair's bytes."""
    from agentq.utils import checkpoint

    write_eval(out, *_evaluation(4, 1))
    old = _pair(out)
    real, calls = os.replace, []

    def replace(src, dst):          # renames up to the kill happen; from it on nothing does
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == renames + 1:
            raise _Killed
        if len(calls) <= renames:
            real(src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint.os, "replace", replace)
        mp.setattr(Path, "unlink", lambda self, missing_ok=False: None)      # no cleanup either
        with pytest.raises(_Killed):
            write_eval(out, *_evaluation(6, 6))
    return old


@pytest.mark.parametrize("renames", [1, 2, 3])
def test_a_kill_between_the_renames_leaves_the_old_pair_to_read(tmp_path, monkeypatch, renames):
    """A rewrite killed after `renames` of its four renames (two asides, two in) left no eval.json:
    the evaluation was lost to every reader. Claiming the run folder (a resume) puts the old pair
    back, byte for byte, and removes what the kill left; so does the next write there."""
    from agentq.trainer.run_dir import claim_run_dir

    run, out = tmp_path, tmp_path / "eval" / "step_000001"
    old = _killed_rewrite(out, renames)
    assert not (out / "eval.json").exists()                 # what readers look for is gone
    with pytest.raises(FileNotFoundError):                       # a reader changes nothing (a write may be under way)
        read_eval(out)
    left = sorted(os.listdir(out))
    claim_run_dir(run, resume=True, overwrite=False).close()
    assert read_eval(out)["episodes"] == 4 and _pair(out) == old, left
    assert sorted(os.listdir(out)) == ["episodes.jsonl", "eval.json"]
    write_eval(out, *_evaluation(6, 6))
    assert read_eval(out)["episodes"] == 6 and sorted(os.listdir(out)) == ["episodes.jsonl", "eval.json"]


def test_asides_left_beside_a_complete_pair_are_removed(tmp_path):
    """A kill after the last rename in leaves the old files set aside beside the new pair: stale."""
    from agentq.eval.episodes import recover_eval_pairs

    write_eval(tmp_path / "eval" / "step_000002", *_evaluation(3, 1))
    (tmp_path / "eval" / "step_000002" / ".eval.json.old").write_text("{}")
    (tmp_path / "eval" / "step_000002" / ".episodes.jsonl.old").write_text("")
    assert recover_eval_pairs([tmp_path / "eval" / "step_000002"]) == []     # nothing put back, asides removed
    assert read_eval(tmp_path / "eval" / "step_000002")["episodes"] == 3
    assert sorted(os.listdir(tmp_path / "eval" / "step_000002")) == ["episodes.jsonl", "eval.json"]


def test_a_kill_after_new_episodes_came_in_where_the_old_pair_had_none_leaves_the_old_eval_json_alone(tmp_path):
    """An evaluation whose episodes.jsonl was deleted (read unchecked) rewritten and killed after the new
    episodes came in: only eval.json was set aside, so the episodes.jsonl there is the new one. Put
    beside the old eval.json it made a mismatched pair (EvalPairError at a resume); it is removed."""
    from agentq.eval.episodes import recover_eval_pair
    from agentq.utils import checkpoint

    out = tmp_path / "eval" / "step_000001"
    write_eval(out, *_evaluation(4, 1))
    (out / "episodes.jsonl").unlink()
    old_json = (out / "eval.json").read_bytes()
    real, calls = os.replace, []

    def replace(src, dst):          # the kill after the second rename (eval.json aside, episodes in)
        calls.append(1)
        if len(calls) == 3:
            raise _Killed
        if len(calls) < 3:
            real(src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint.os, "replace", replace)
        mp.setattr(Path, "unlink", lambda self, missing_ok=False: None)
        with pytest.raises(_Killed):
            write_eval(out, *_evaluation(6, 6))
    assert sorted(os.listdir(out)) == [".eval.json.old", ".eval.json.tmp", "episodes.jsonl"]
    assert recover_eval_pair(out) is True
    assert sorted(os.listdir(out)) == ["eval.json"] and (out / "eval.json").read_bytes() == old_json
    assert read_eval(out)["episodes"] == 4


@pytest.mark.parametrize("renames", [1, 2, 3])
def test_agentq_eval_puts_its_output_folders_pair_back_before_anything_else(tiny_model_dir, tmp_path, monkeypatch,
                                                                           renames):
    """`agentq eval` is the writer of its output folder: a pair a kill cut short there is put back when
    the command starts (readers, `agentq report`, found no eval.json until its next write), then replaced."""
    from agentq import build
    from agentq.cli import main

    out = tmp_path / "ev"
    old = _killed_rewrite(out, renames)
    assert not (out / "eval.json").exists()
    real, seen = build.device_and_dtype, []

    def first_step(cfg):            # what `evaluate` did first before: the folder as the start left it
        seen.append(_pair(out) if (out / "eval.json").exists() else sorted(os.listdir(out)))
        return real(cfg)

    monkeypatch.setattr(build, "device_and_dtype", first_step)
    assert main(["eval", f"checkpoint={tiny_model_dir}", f"eval.out_dir={out}", "eval.num_tasks=1", "env_pool=inline",
                 "env.max_steps=2", "env.max_new_tokens=8"]) == 0
    assert seen == [old]
    # and the lock file of the folder's writer (`evaluate.OutputLock`), released
    assert read_eval(out)["episodes"] == 1 and sorted(os.listdir(out)) == [".agentq.lock", "episodes.jsonl", "eval.json"]
