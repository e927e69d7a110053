"""Run outputs: metrics.jsonl (one JSON object per step), TensorBoard scalars, rich progress."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agentq.utils.jsonl import read_jsonl

console = Console(stderr=True)


def progress(transient: bool = False) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console, transient=transient)


def jsonable(v: Any):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if hasattr(v, "item"):
        return jsonable(v.item())
    return v


class MetricsLogger:
    """Appends one JSON line per step and mirrors every scalar to TensorBoard (lists go to JSONL only)."""

    def __init__(self, out_dir: str | Path, tensorboard: bool = True):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(log_dir=str(Path(out_dir) / "tb"))

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        row = {"step": step, "time": time.time(), **{prefix + k: jsonable(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k in ("step", "time"):
                    continue
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    @staticmethod
    def truncate(out_dir: str | Path, last_step: int) -> None:
        """Drop metrics.jsonl rows after `last_step` (a resumed run redoes those steps)."""
        path = Path(out_dir) / "metrics.jsonl"
        if not path.exists():
            return
        keep = [row for row in read_jsonl(path) if row["step"] <= last_step]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in keep))
        tmp.replace(path)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict]:
    """metrics.jsonl rows; a torn last line (a kill mid-write) is dropped with a warning."""
    return read_jsonl(path)
