"""Trajectory files: one writer and one reader for every JSON-lines file of episodes.

Two record shapes share them: an evaluation's `episodes.jsonl` (outcome and readable transcript,
`eval_record`; written with its eval.json as a pair, `write_eval_pair`, and read back checked against
it, `read_eval`) and SFT's `demos.jsonl` (the token stream SFT trains on, plus its text, `demo_record`).
`read_trajectories` turns either back into `Trajectory` objects (fields a record lacks keep their
defaults; behaviour log-probs, which neither stores, are zero).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Iterable

from agentq.agent.trajectory import Trajectory
from agentq.utils.checkpoint import CheckpointError, replace_files_together, restore_interrupted_replace
from agentq.utils.jsonl import read_jsonl
from agentq.utils.logging import counted, jsonable

#: per-episode fields a record may carry back into a Trajectory
_FIELDS = ("task_id", "split", "reward", "won", "score", "turns", "end_reason", "error", "transcript")
_TOKENS = ("input_ids", "action_mask", "seg_id")


def eval_record(t: Trajectory) -> dict:
    """An evaluation's line: the outcome, the task type and the transcript (no tokens)."""
    return {"task_id": t.task_id, "won": t.won, "score": t.score, "turns": t.turns, "end_reason": t.end_reason,
            "reward": t.reward, "error": t.error, "task_type": t.info.get("task_type"), "transcript": t.transcript}


def demo_record(tokenizer: Any) -> Callable[[Trajectory], dict]:
    """A demonstration's line: the token stream with its masks, and its text for reading."""
    def record(t: Trajectory) -> dict:
        return {"task_id": t.task_id, "split": t.split, "won": t.won, "turns": t.turns, "end_reason": t.end_reason,
                "error": t.error, "input_ids": t.input_ids, "action_mask": t.action_mask, "seg_id": t.seg_id,
                "text": tokenizer.decode(t.input_ids)}
    return record


def write_trajectories(path: str | Path, trajs: list[Trajectory], record: Callable[[Trajectory], dict]) -> None:
    """One `record(t)` per line, written whole or not at all (a temporary file renamed into place).

    Args:
        path: the JSON-lines file (its folder is created).
        trajs: the episodes, in the order to write them.
        record: `eval_record`, `demo_record(tokenizer)` or any Trajectory → JSON-able dict.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    _write_records(tmp, trajs, record)
    tmp.replace(path)


def _write_records(path: Path, trajs: list[Trajectory], record: Callable[[Trajectory], dict]) -> str:
    """`write_trajectories`' lines into `path` itself; returns the sha256 of the bytes written."""
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for t in trajs:
            line = (json.dumps(record(t)) + "\n").encode()
            digest.update(line)
            f.write(line)
    return digest.hexdigest()


#: an evaluation folder's two files, and the eval.json key that ties them (with its `episodes` count)
EVAL_JSON, EPISODES_JSONL, EPISODES_SHA256 = "eval.json", "episodes.jsonl", "episodes_sha256"


class EvalPairError(CheckpointError):
    """An evaluation folder whose eval.json does not describe the episodes.jsonl beside it (a run
    folder's file that is not what was written: the CLI prints it in one line, as a bad checkpoint)."""


def write_eval_pair(out: Path, report: dict, trajs: list[Trajectory]) -> str:
    """`out/eval.json` (`report`, plus the sha256 of the episodes under `episodes_sha256`) and
    `out/episodes.jsonl` (one `eval_record` per episode), as a pair: both are written under temporary
    names, then renamed in together (`replace_files_together`, eval.json last), so a reader finds the
    old pair or the new one, never an eval.json whose numbers are not those of the episodes beside it
    (eval.json then episodes.jsonl, a Ctrl-C between them did that). An error or Ctrl-C while writing
    leaves the old pair; a kill between the renames, no eval.json (the old pair as `.<name>.old`).

    Returns:
        The sha256 of the episodes.jsonl written.
    """
    out.mkdir(parents=True, exist_ok=True)
    recover_eval_pair(out)
    staged = [(_beside(out / name, "tmp"), out / name) for name in (EVAL_JSON, EPISODES_JSONL)]
    try:
        digest = _write_records(staged[1][0], trajs, eval_record)
        staged[0][0].write_text(json.dumps(jsonable({**report, EPISODES_SHA256: digest}), indent=2))
        replace_files_together(staged)
    finally:
        for tmp, _ in staged:           # renamed in, or left by an error: none stays
            tmp.unlink(missing_ok=True)
    return digest


def recover_eval_pair(folder: str | Path) -> bool:
    """Put back the pair a kill between `write_eval_pair`'s renames set aside (the folder then has no
    eval.json: the old pair waits as `.<name>.old`), and remove what such a kill left (temporary
    files, stale asides). Only by the folder's writer, while nobody writes there: before a write, when
    `agentq eval` starts on its output folder, and on the evaluations of a run or pipeline folder when
    it is claimed (`recover_eval_pairs`); never from a reader, which could undo a write under way.
    Returns whether a pair was put back."""
    folder = Path(folder)
    eval_json, episodes = folder / EVAL_JSON, folder / EPISODES_JSONL
    if (not eval_json.exists() and _beside(eval_json, "old").exists() and not _beside(episodes, "old").exists()
            and not _beside(episodes, "tmp").exists() and episodes.exists()):
        # the old pair had no episodes.jsonl (deleted, as `read_eval` allows), so none was set aside, and the
        # kill came after the new one was renamed in: it belongs to the eval.json that never came
        episodes.unlink()
    for path in (eval_json, episodes):
        _beside(path, "tmp").unlink(missing_ok=True)
    return bool(restore_interrupted_replace([eval_json, episodes]))


def _beside(path: Path, suffix: str) -> Path:
    """The hidden sibling `write_eval_pair` / `replace_files_together` give `path`: .<name>.tmp / .old."""
    return path.with_name(f".{path.name}.{suffix}")


def recover_eval_pairs(folders: Iterable[Path]) -> list[Path]:
    """`recover_eval_pair` in each of `folders` that a cut-short write left files in (a run's
    eval/step_*, under its lock; a pipeline's eval_sft_* / eval_rl_*). Returns the folders whose pair
    was put back."""
    left = [f for f in folders if any(f.glob(f".{EVAL_JSON}.*")) or any(f.glob(f".{EPISODES_JSONL}.*"))]
    return [folder for folder in left if recover_eval_pair(folder)]


def read_eval(folder: str | Path) -> dict:
    """An evaluation folder's eval.json, checked against the episodes.jsonl beside it: its `episodes`
    count against the lines and its `episodes_sha256` against the file. An eval.json from before the
    sha256 was recorded, or whose episodes.jsonl was deleted (`rl.recorded_step` allows it), is read
    unchecked.

    Raises:
        FileNotFoundError: no eval.json in `folder`.
        EvalPairError: the two do not match, in one line naming the folder and both counts; or eval.json
        is damaged (not a JSON object: a write cut short, an edit).
    """
    folder = Path(folder)
    try:
        report = json.loads((folder / EVAL_JSON).read_text())
        why = None if isinstance(report, dict) else f"a JSON {type(report).__name__}, not an object"
    except ValueError as e:         # JSONDecodeError, UnicodeDecodeError
        why = f"not JSON: {e}"
    if why:
        raise EvalPairError(f"{folder}: eval.json is damaged ({why}); the evaluation's record is lost: remove the "
                            "folder and evaluate again")
    episodes = folder / EPISODES_JSONL
    if EPISODES_SHA256 not in report or not episodes.is_file():
        return report
    data = episodes.read_bytes()
    n, digest = data.count(b"\n"), hashlib.sha256(data).hexdigest()
    if (n, digest) != (report.get("episodes"), report[EPISODES_SHA256]):
        raise EvalPairError(f"{folder}: eval.json does not describe the episodes.jsonl beside it (eval.json: "
                            f"{counted(report.get('episodes'), 'episode')}, sha256 {report[EPISODES_SHA256][:12]}; "
                            f"episodes.jsonl: {counted(n, 'line')}, sha256 {digest[:12]}): one was replaced or edited "
                            "after the evaluation; rerun it")
    return report


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """The episodes of a file `write_trajectories` wrote, numbered by line (episode_id 0, 1, …).

    Returns:
        Trajectories with the fields the records carry; `rollout_logp` is zero on every token.
    """
    out = []
    for i, d in enumerate(read_jsonl(path)):
        t = Trajectory(episode_id=i, task_id=d["task_id"], split=d.get("split", ""),
                       **{k: d[k] for k in _FIELDS[2:] if k in d})
        for k in _TOKENS:
            setattr(t, k, d.get(k, []))
        t.rollout_logp = [0.0] * len(t.input_ids)
        if d.get("task_type") is not None:
            t.info["task_type"] = d["task_type"]
        out.append(t)
    return out


