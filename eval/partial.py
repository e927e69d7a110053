"""An `agentq eval` that was stopped keeps its finished episodes, and the same command plays the rest.

Each finished episode is appended to `episodes.partial.jsonl` in the evaluation's folder, after a
first line holding the fingerprint of what decides the episodes (the resolved settings, the
checkpoint's files, the tasks, the env's data folder's files). Every episode's sampling seed comes from its episode id, so the
episodes a rerun plays are the ones the stopped run would have played, and the finished ones are
taken as they are: the result is the uninterrupted run's (the rollout backends sample a seeded turn
alike whatever shares the batch, `agentq.rollout.contract`). A fingerprint that differs (other
settings, a rewritten checkpoint) starts over, saying so. The file goes once eval.json and
episodes.jsonl are written.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from agentq.agent.trajectory import Trajectory
from agentq.utils.jsonl import read_jsonl
from agentq.utils.logging import console, counted

from .episodes import eval_record

#: the file beside eval.json
PARTIAL = "episodes.partial.jsonl"
#: the files of a checkpoint besides its `*.safetensors` that decide what it computes
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja")
#: the Trajectory fields a partial line carries beyond `eval_record`'s (what the report's means read)
_EXTRA = ("episode_id", "split", "invalid_actions", "inadmissible_actions", "admissible_turns")


def fingerprint(settings: dict[str, Any], checkpoint: str, tasks: list[str], data_dir: str | None = None) -> str:
    """What decides an evaluation's episodes: its settings (the resolved config, output keys left out by
    the caller), the checkpoint's model files (names, sizes, modification times: not what an evaluation
    writes beside them), the tasks in order, and the files of the env's data folder `data_dir`
    (`env.kwargs.data_dir`, where `$ALFWORLD_DATA` / `$WEBSHOP_DATA` are written): a folder changed in
    place under the same path holds other games."""
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in Path(checkpoint).iterdir()
                   if p.is_file() and (p.suffix == ".safetensors" or p.name in MODEL_FILES))
    what = {"settings": settings, "checkpoint": str(Path(checkpoint).resolve()), "files": files, "tasks": tasks}
    data = data_files(data_dir)
    if data:            # only then: the fingerprint of an evaluation without a data folder is as it was before
        what["data"] = data
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def data_files(data_dir: str | None) -> list[tuple[str, int, int]]:
    """(path under `data_dir`, size, modification time) of each file of a data folder, sorted; [] for
    None or a path that is no folder (the env says what is wrong with it). Linked folders are walked
    as the env reads through them (each real folder once: a link loop ends); a link to nothing is
    listed with size and time -1."""
    if not data_dir or not Path(data_dir).is_dir():
        return []
    root = Path(data_dir)
    out, seen = [], set()
    for folder, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:            # reached again through a link: its files are listed already
            dirs[:] = []
            continue
        seen.add(real)
        for name in names:
            path = Path(folder) / name
            try:
                st = path.stat()
                size, mtime = st.st_size, st.st_mtime_ns
            except OSError:         # a dangling link: nothing the env can read, but its presence counts
                size = mtime = -1
            out.append((str(path.relative_to(root)), size, mtime))
    return sorted(out)


class PartialEpisodes:
    """The finished episodes of one evaluation in `folder` (`done`, by episode id) and the file they
    are appended to as more finish."""

    def __init__(self, folder: Path, key: str, resume: str = "the same command plays the rest"):
        self.path, self.key, self.resume = Path(folder) / PARTIAL, key, resume
        self.done: dict[int, Trajectory] = self._read()
        self._file: Any = None

    def _read(self) -> dict[int, Trajectory]:
        """The episodes a stopped run of these settings finished; another run's file is removed."""
        if not self.path.is_file():
            return {}
        rows = list(read_jsonl(self.path))
        if not rows or rows[0].get("fingerprint") != self.key:
            console.print(f"{self.path}: a stopped evaluation of other settings, another checkpoint or other env "
                          "code; starting over", style="yellow", markup=False, highlight=False)
            self.path.unlink()
            return {}
        # an errored episode is played again (its env or rollout worker died: no outcome of the policy;
        # a stop by a worker given up on leaves them), a later line of an episode id over an earlier one
        done = {int(r["episode_id"]): _trajectory(r) for r in rows[1:] if r.get("end_reason") != "error"}
        console.print(f"{counted(len(done), 'episode')} of a stopped evaluation taken from {self.path}; "
                      "playing the rest", markup=False, highlight=False, soft_wrap=True)
        return done

    def append(self, t: Trajectory) -> None:
        """Add a finished episode (flushed to the disk: a kill loses at most the line being written,
        which `read_jsonl` skips as a torn line)."""
        if self._file is None:
            fresh = not self.path.is_file()
            if not fresh:       # a line a kill cut short goes: the next one starts on a line of its own
                data = self.path.read_bytes()
                os.truncate(self.path, data.rfind(b"\n") + 1)
            self._file = self.path.open("a", encoding="utf-8")
            if fresh:
                self._file.write(json.dumps({"fingerprint": self.key}) + "\n")
        record = {**eval_record(t), **{k: getattr(t, k) for k in _EXTRA}}
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """The evaluation's pair is written: the partial file has served."""
        self.close()
        self.path.unlink(missing_ok=True)

    def kept_text(self) -> str:
        """What a stop leaves, for its last line ("" when nothing finished)."""
        rows = read_jsonl(self.path)[1:] if self.path.is_file() else []
        n = len({r["episode_id"] for r in rows if r.get("end_reason") != "error"})
        return f"{counted(n, 'finished episode')} kept in {self.path}: {self.resume}" if n > 0 else ""


def _trajectory(r: dict) -> Trajectory:
    """A partial line back as the Trajectory the report reads (no tokens: an evaluation writes none)."""
    t = Trajectory(episode_id=int(r["episode_id"]), task_id=r["task_id"], split=r.get("split", ""),
                   reward=r["reward"], won=r["won"], score=r["score"], turns=r["turns"], end_reason=r["end_reason"],
                   error=r.get("error"), invalid_actions=r.get("invalid_actions", 0),
                   inadmissible_actions=r.get("inadmissible_actions", 0), admissible_turns=r.get("admissible_turns", 0),
                   transcript=r.get("transcript", []))
    if r.get("task_type") is not None:
        t.info["task_type"] = r["task_type"]
    return t


__all__ = ["PARTIAL", "PartialEpisodes", "fingerprint"]
