"""Run outputs: metrics.jsonl (one JSON object per step, always), TensorBoard scalars and Weights &
Biases (the `logger` list of the config), rich progress, and plain progress lines when the output is
not a terminal (a log file gets no progress bar until the end): one per training step, and one every
so often from any other loop's bar (`progress`)."""
from __future__ import annotations

import json
import math
import os
import secrets
import string
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from agentq.utils.jsonl import drop_rows_after, read_step_rows


def make_console(stderr: bool = True) -> Console:
    """rich's console. Written to a file or a pipe (no terminal, no COLUMNS), lines are not wrapped
    at rich's default 80 columns, so a printed command or path stays one line to copy, and tables and
    the final progress line get 160 columns."""
    c = Console(stderr=stderr)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(stderr=stderr, soft_wrap=True, width=160)
    return c


console = make_console()


#: on a console that is not a terminal, a bar's plain line comes when this fraction of its total more is done
PLAIN_LINE_FRACTION = 0.1
#: ... or, at the next advance, when this many seconds have passed since its last line (or its start)
PLAIN_LINE_EVERY_S = 30.0


class _PlainLinesProgress(Progress):
    """rich's Progress that, on a console that is not a terminal (nohup, `> log`, CI: rich draws the bar
    there only when it stops, an eval was minutes of silence), also prints each task's plain line
    (`plain_progress_line`) every `PLAIN_LINE_FRACTION` of its total or `PLAIN_LINE_EVERY_S`, whichever
    comes first, and when it completes."""

    def __init__(self, *columns: Any, plain_lines: bool, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.plain_lines = plain_lines and not self.console.is_terminal
        self._last_line: dict[TaskID, tuple[float, float]] = {}    # task: (completed, time) at its last line

    def add_task(self, description: str, start: bool = True, total: float | None = 100.0, completed: int = 0,
                 visible: bool = True, **fields: Any) -> TaskID:
        task_id = super().add_task(description, start, total, completed, visible, **fields)
        self._last_line[task_id] = (completed, self.get_time())
        return task_id

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._plain_line(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._plain_line(task_id)

    def _plain_line(self, task_id: TaskID) -> None:
        if not self.plain_lines:
            return
        task = self._tasks[task_id]
        said, at = self._last_line[task_id]
        now = self.get_time()
        every = max(1.0, PLAIN_LINE_FRACTION * task.total) if task.total else math.inf
        due = (task.completed - said >= every or now - at >= PLAIN_LINE_EVERY_S
               or (task.total is not None and task.completed >= task.total))
        if task.completed > said and due:       # an update of the info alone (sft's val loss) adds no line
            self._last_line[task_id] = (task.completed, now)
            self.console.print(plain_progress_line(task.description, task.completed, task.total,
                                                   str(task.fields.get("info", "")), task.elapsed or 0.0),
                               markup=False, highlight=False, soft_wrap=True)


def plain_progress_line(description: str, completed: float, total: float | None, info: str, elapsed_s: float) -> str:
    """A progress bar as one plain line, e.g. "eval dev: 30/100, won 12 (40 %), 0:01:12 elapsed".

    Args:
        description: the bar's description (rich markup, such as [bold], taken out).
        completed: how many are done; total: of how many (None: unknown).
        info: the bar's info field ("" leaves it out).
        elapsed_s: seconds since the bar started.

    Returns:
        The line.
    """
    from rich.text import Text

    done = f"{int(completed)}/{int(total)}" if total is not None else f"{int(completed)}"
    return (f"{Text.from_markup(description).plain}: {done}" + (f", {info}" if info else "")
            + f", {timedelta(seconds=int(elapsed_s))} elapsed")


def progress(transient: bool = False, plain_lines: bool = True) -> Progress:
    """rich's progress bar on `console` (each task's `info` field shown after its count).

    Args:
        transient: the bar goes when it stops (else it stays as the last line).
        plain_lines: on a console that is not a terminal, print a plain line every
            `PLAIN_LINE_FRACTION` of the total or `PLAIN_LINE_EVERY_S` (a loop that prints its own
            line per step, as training does, passes False).

    Returns:
        The Progress, to use as a context manager.
    """
    return _PlainLinesProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                               console=console, transient=transient, plain_lines=plain_lines,
                               get_time=lambda: time.monotonic())   # looked up at each call: a test's clock


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


LOGGERS = ("tensorboard", "wandb")


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics row, without step and time (lists and None left out)."""
    return {k: v for k, v in row.items() if k not in ("step", "time") and isinstance(v, (int, float))
            and not isinstance(v, bool)}


#: the run folder's W&B run id, written when the run starts, read when it is resumed
WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(out_dir: str | Path, resume: bool) -> str:
    """The W&B run id of the run in `out_dir`: on a resume the one its start saved (a folder from
    before the file existed gets a new one), else a new id, saved for a later resume."""
    path = Path(out_dir) / WANDB_ID_FILE
    if resume and path.exists() and path.read_text().strip():
        return path.read_text().strip()
    alphabet = string.ascii_lowercase + string.digits
    run_id = "".join(secrets.choice(alphabet) for _ in range(8))        # W&B's own id shape
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


def import_wandb() -> Any:
    """The wandb module; an ImportError saying how to install it (or leave it out of `logger`) without it."""
    try:
        import wandb
    except ImportError as e:
        raise ImportError("logger includes 'wandb' but wandb is not installed: pip install wandb, "
                          "or leave wandb out of logger") from e
    return wandb


def logger_names(cfg) -> list[str]:
    """The sinks `cfg.logger` names (a name or a list of them; metrics.jsonl is always written).

    Raises:
        ValueError: a name not in `LOGGERS` (nor jsonl).
    """
    names = cfg.get("logger", ["tensorboard"])
    names = [names] if isinstance(names, str) else list(names or [])
    bad = [n for n in names if n not in LOGGERS + ("jsonl",)]
    if bad:
        raise ValueError(f"logger={names}: unknown {bad}; valid: {['jsonl', *LOGGERS]}")
    return names


def check_loggers(cfg) -> list[str]:
    """`logger_names`, each sink's package importable: run before anything is written to a run folder,
    so a sink `MetricsLogger.from_config` cannot build leaves no config.yaml or tb/ behind.

    Raises:
        ValueError: an unknown name. ImportError: a named sink's package is not installed.
    """
    names = logger_names(cfg)
    if "tensorboard" in names:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as e:
            raise ImportError("logger includes 'tensorboard' but tensorboard is not installed: pip install "
                              "tensorboard, or leave tensorboard out of logger") from e
    if "wandb" in names:
        import_wandb()
    return names


class WandbSink:
    """Weights & Biases run mirroring every scalar (`logger` contains wandb; `pip install wandb`).
    mode offline writes under <run>/wandb/ without network (`wandb sync` uploads it later).

    A resumed run continues its W&B run, which ignores a step logged again ("less than the current
    step"): for the steps a resume redoes, W&B keeps the values the stopped run logged first, unlike
    metrics.jsonl and TensorBoard, which drop them and hold the redone ones (the run's record). The
    trainer says so when such a resume starts (`wandb_redo_notice`); W&B's rewind is not used."""

    def __init__(self, out_dir: str | Path, config: dict | None = None, project: str = "agentq",
                 entity: str | None = None, mode: str | None = None, name: str | None = None,
                 resume: bool = False):
        """`resume`: the run folder's run continues (`trainer.resume`), so does its W&B run (the id
        in `WANDB_ID_FILE`), instead of a second W&B run for the same training run."""
        wandb = import_wandb()
        run_id = wandb_run_id(out_dir, resume)
        # resume="allow": the W&B run continues from its last logged step (a new one if the server
        # never saw it, e.g. an offline run not yet synced); a fresh run's id is new, so no resume
        self.run = wandb.init(project=project, entity=entity, mode=mode,
                              name=name or Path(out_dir).name, id=run_id, resume="allow" if resume else None,
                              dir=str(out_dir), config=config, reinit="finish_previous")

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.run.log(scalars(row), step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Appends one JSON line per step and mirrors every scalar to TensorBoard and, if given, to
    W&B (lists go to JSONL only)."""

    def __init__(self, out_dir: str | Path, tensorboard: bool = True, wandb: dict | None = None,
                 purge_step: int | None = None):
        """`purge_step`: a resumed run's first step; TensorBoard hides the earlier run's points from
        that step on (the steps redone), as metrics.jsonl's `truncate` drops their rows."""
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(log_dir=str(Path(out_dir) / "tb"), purge_step=purge_step)
        self._wandb = WandbSink(out_dir, **wandb) if wandb is not None else None

    @classmethod
    def from_config(cls, out_dir: str | Path, cfg, purge_step: int | None = None) -> "MetricsLogger":
        """The sinks `cfg.logger` names (a name or a list of them; metrics.jsonl is always written);
        `purge_step` as in `__init__` (given: a resumed run, whose W&B run is resumed too)."""
        names = logger_names(cfg)
        wandb = None
        if "wandb" in names:
            from omegaconf import OmegaConf
            settings = OmegaConf.to_container(cfg.wandb, resolve=True)
            assert isinstance(settings, dict)
            wandb = {**settings,
                     "config": OmegaConf.to_container(cfg, resolve=True)}
            wandb["resume"] = purge_step is not None        # a resumed run continues its W&B run
        return cls(out_dir, tensorboard="tensorboard" in names, wandb=wandb, purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        row = {"step": step, "time": time.time(), **{prefix + k: jsonable(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in scalars(row).items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(step, row)

    @staticmethod
    def truncate(out_dir: str | Path, last_step: int) -> None:
        """Drop metrics.jsonl rows after `last_step` (a resumed run redoes those steps)."""
        drop_rows_after(Path(out_dir) / "metrics.jsonl", last_step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()


def counted(n: Any, noun: str, plural: str | None = None) -> str:
    """"1 step", "2 steps" (`plural`: "trajectories"): headings read "1 trajectories". `n` as it comes."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def step_line(step: int, steps: int, m: dict[str, Any]) -> str:
    """One plain progress line for a log file (no bar, no colour codes); `errored N` after the means
    (which leave those N episodes out) when N episodes errored."""
    def f(key, fmt):
        v = m.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "nan"
    return (f"step {step}/{steps}  reward {f('reward_mean', '.3f')}  success {f('success_rate', '.2f')}  "
            f"turns {f('turns_mean', '.2f')}{errored_note(m, '  ')}  k3 {f('k3', '.2e')}  loss {f('loss', '.4f')}  "
            f"step_time {f('step_time_s', '.1f')} s")


def errored_note(m: dict[str, Any], sep: str = " ") -> str:
    """`sep` + "errored N" for a step row with N > 0 errored episodes, else ""."""
    n = m.get("errored_episodes")
    return f"{sep}errored {n}" if isinstance(n, int) and n > 0 else ""


def read_metrics(path: str | Path) -> list[dict]:
    """metrics.jsonl rows; a torn last line (a kill mid-write) is dropped with a warning, another bad
    line or a row without its step is a `RunFileError` naming the file and line (`read_step_rows`)."""
    return read_step_rows(path)
