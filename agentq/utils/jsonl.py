"""JSON-lines files that survive a kill mid-write: appends are whole lines, and a reader drops a
torn last line (the one write that was cut short) with a warning instead of failing."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Iterable

from .files import write_text_replacing


def append_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append rows, one JSON object per line, in one write (a partial write can only tear the tail)."""
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    if text:
        with open(path, "a") as f:
            f.write(text)


def read_jsonl(path: str | Path) -> list[dict]:
    """All rows of a JSON-lines file. A last line that does not parse (a write cut short by a kill)
    is dropped with a warning; a bad line anywhere else is an error naming the file and line."""
    lines = Path(path).read_text().splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if all(not rest.strip() for rest in lines[i:]):
                warnings.warn(f"{path}: dropped a torn last line {i} ({line[:60]!r}…): {e.msg}", stacklevel=2)
                break
            raise ValueError(f"{path}: line {i} is not JSON ({e.msg}): {line[:80]!r}") from None
    return rows


def drop_rows_after(path: str | Path, last_step: int) -> None:
    """Rewrite a JSON-lines file of rows with a "step" without those after `last_step` (a resumed
    run redoes those steps), through a temporary file renamed into place; no file, nothing to do."""
    path = Path(path)
    if not path.exists():
        return
    keep = [row for row in read_jsonl(path) if row["step"] <= last_step]
    write_text_replacing(path, "".join(json.dumps(row, default=str) + "\n" for row in keep))
