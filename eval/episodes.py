"""Trajectory files: one writer and one reader for every JSON-lines file of episodes.

Two record shapes share them: an evaluation's `episodes.jsonl` (outcome and readable transcript,
`eval_record`) and SFT's `demos.jsonl` (the token stream SFT trains on, plus its text, `demo_record`).
`read_trajectories` turns either back into `Trajectory` objects (fields a record lacks keep their
defaults; behaviour log-probs, which neither stores, are zero).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from agentq.agent.trajectory import Trajectory
from agentq.utils.jsonl import read_jsonl

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
    with tmp.open("w") as f:
        for t in trajs:
            f.write(json.dumps(record(t)) + "\n")
    tmp.replace(path)


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


