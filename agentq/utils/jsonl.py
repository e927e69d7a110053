"""JSON-lines files that survive a kill mid-write: appends are whole lines, and a reader drops a
torn last line (the one write that was cut short) with a warning instead of failing."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Iterable

from .errors import RunFileError
from .files import write_text_replacing


def append_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append rows, one JSON object per line, in one write (a partial write can only tear the tail)."""
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    if text:
        with open(path, "a") as f:
            f.write(text)


def read_jsonl(path: str | Path) -> list[dict]:
    """All rows of a JSON-lines file. A last line that does not parse (a write cut short by a kill)
    is dropped with a warning; a bad line anywhere else is an error naming the file and line.

    Raises:
        RunFileError: a line before the last that is not JSON, or any that is no JSON object.
    """
    return [row for _, row in numbered_rows(path)]


def numbered_rows(path: str | Path) -> list[tuple[int, dict]]:
    """`read_jsonl`'s rows, each with its line number in the file (blank lines are skipped)."""
    lines = Path(path).read_text().splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if all(not rest.strip() for rest in lines[i:]):
                warnings.warn(f"{path}: dropped a torn last line {i} ({line[:60]!r}…): {e.msg}", stacklevel=3)
                break
            raise RunFileError(f"{path}: line {i} is not JSON ({e.msg}): {line[:80]!r}") from None
        if not isinstance(row, dict):
            raise RunFileError(f"{path}: line {i} is not a JSON object: {line[:80]!r}")
        rows.append((i, row))
    return rows


def read_step_rows(path: str | Path) -> list[dict]:
    """`read_jsonl`'s rows of a file whose every row has a "step" number (metrics.jsonl, errors.jsonl).

    Raises:
        RunFileError: a line that `read_jsonl` refuses, or a row without a "step" number.
    """
    rows = numbered_rows(path)
    for i, row in rows:
        if not isinstance(row.get("step"), (int, float)) or isinstance(row["step"], bool):
            raise RunFileError(f"{path}: line {i} has no \"step\" number ({json.dumps(row)[:80]!r}); every row agentq "
                               "writes has one, so the file was edited or damaged: mend or remove that line")
    return [row for _, row in rows]


def drop_rows_after(path: str | Path, last_step: int) -> None:
    """Rewrite a JSON-lines file of rows with a "step" without those after `last_step` (a resumed
    run redoes those steps), through a temporary file renamed into place; no file, nothing to do.

    Raises:
        RunFileError: a line that `read_step_rows` refuses.
    """
    path = Path(path)
    if not path.exists():
        return
    keep = [row for row in read_step_rows(path) if row["step"] <= last_step]
    write_text_replacing(path, "".join(json.dumps(row, default=str) + "\n" for row in keep))
