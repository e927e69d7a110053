"""ScienceWorld's 30 tasks, task selection, and the train/dev/test variation splits.

Task ids are "<task name>/<variation>", e.g. "boil/21"; they are stable across runs and machines
for a given scienceworld version. Tasks are selected with *selectors*:

* a task name ("boil", "find-animal"),
* a task number ("1-1", "10-2"),
* a topic family ("5", "5-x", "5-*": every task 5-…).

The splits are the simulator's own (`get_variations_train/dev/test`: 50/25/25 % of each task's
variations, in order). Asking the JVM takes ~2 s (one load per task), so the result is kept in
this process and on disk (`$AGENTQ_CACHE` or `~/.cache/agentq`, file
`scienceworld/splits-<version>.json`), keyed by the package version.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

SPLITS = ("train", "dev", "test")

#: The simulator's simplification flags.
SIMPLIFICATIONS = ("teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors", "noElectricalAction")
#: What the simulator means by "easy" (measured on 1.2.3: openContainers is *not* part of it).
EASY = ("noElectricalAction", "openDoors", "selfWateringFlowerPots", "teleportAction")


@dataclass(frozen=True)
class SWTask:
    num: str       # "1-1"
    name: str      # "boil"
    topic: str     # "Matter"
    title: str     # "Changes of State (Boiling)"

    @property
    def family(self) -> str:
        return self.num.split("-")[0]


def all_tasks() -> list[SWTask]:
    """The 30 tasks in the package's order (1-1 … 10-2)."""
    from scienceworld.constants import TASKS
    return [SWTask(t["task_id"], t["task_name"], t["topic"], t["task"]) for t in TASKS]


def task_by_name() -> dict[str, SWTask]:
    return {t.name: t for t in all_tasks()}


def resolve_tasks(selectors: str | Iterable[str] | None) -> list[SWTask]:
    """Tasks matching any selector (None = all 30), in the package's order.

    Raises ValueError naming the valid choices for an unknown selector.
    """
    tasks = all_tasks()
    if selectors is None:
        return tasks
    if isinstance(selectors, str):
        selectors = [s for s in selectors.split(",")]
    chosen: set[str] = set()
    for raw in selectors:
        sel = str(raw).strip()
        if not sel:
            continue
        fam = sel[:-2] if sel.endswith(("-x", "-*")) else sel
        hit = [t for t in tasks if sel in (t.name, t.num) or (fam.isdigit() and t.family == fam)]
        if not hit:
            valid = ", ".join(f"{t.num} {t.name}" for t in tasks)
            fams = sorted({t.family for t in tasks}, key=int)
            raise ValueError(f"unknown ScienceWorld task selector {raw!r}; use a task name, a task number "
                             f"or a family ({', '.join(f + '-x' for f in fams)}). Tasks: {valid}")
        chosen.update(t.name for t in hit)
    return [t for t in tasks if t.name in chosen]


def select_tasks(include: str | Iterable[str] | None = None,
                 exclude: str | Iterable[str] | None = None) -> list[SWTask]:
    """`include` minus `exclude` (both selector lists); error if nothing is left."""
    inc = resolve_tasks(include)
    exc = {t.name for t in resolve_tasks(exclude)} if exclude else set()
    out = [t for t in inc if t.name not in exc]
    if not out:
        raise ValueError(f"no ScienceWorld task left after tasks={include!r} exclude={exclude!r}")
    return out


def parse_simplifications(simplifications: str | Sequence[str] | None) -> str:
    """Normalise to the simulator's comma string (sorted flags); errors list the valid flags.

    "easy" expands to `EASY`. The simulator itself accepts "easy" only as the whole string and
    silently ignores unknown or mixed flags, so everything is validated and expanded here.
    """
    if simplifications is None:
        return ""
    items = simplifications.split(",") if isinstance(simplifications, str) else list(simplifications)
    out: list[str] = []
    for raw in items:
        s = str(raw).strip()
        if not s:
            continue
        if s.lower() == "easy":
            out.extend(x for x in EASY if x not in out)
            continue
        match = [x for x in SIMPLIFICATIONS if x.lower() == s.lower()]
        if not match:
            raise ValueError(f"unknown ScienceWorld simplification {s!r}; valid: {['easy', *SIMPLIFICATIONS]}")
        if match[0] not in out:
            out.append(match[0])
    return ",".join(sorted(out))


def simplifications_for(task: SWTask, simplifications: str) -> str:
    """The flags passed for `task`: electrical tasks keep their electrical actions (as "easy" does)."""
    if "noElectricalAction" in simplifications and ("power-component" in task.name or "conductivity" in task.name):
        return ",".join(s for s in simplifications.split(",") if s != "noElectricalAction")
    return simplifications


def task_id(name: str, variation: int) -> str:
    return f"{name}/{int(variation)}"


def parse_task_id(tid: str) -> tuple[str, int]:
    name, _, var = tid.rpartition("/")
    if not name or not var.isdigit():
        raise ValueError(f"malformed ScienceWorld task id {tid!r}; expected '<task name>/<variation>', e.g. 'boil/21'")
    return name, int(var)


# ---------------------------------------------------------------------- splits
_SPLITS: dict[str, dict] | None = None
_SPLITS_LOCK = threading.Lock()


def cache_dir() -> Path:
    root = os.environ.get("AGENTQ_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "agentq")
    return Path(root) / "scienceworld"


def _version() -> str:
    from scienceworld.version import __version__
    return __version__


def splits_cache_path() -> Path:
    return cache_dir() / f"splits-{_version()}.json"


def _valid(data: dict) -> bool:
    names = [t.name for t in all_tasks()]
    return (isinstance(data, dict) and data.get("version") == _version()
            and all(n in data.get("tasks", {}) and all(s in data["tasks"][n] for s in SPLITS) for n in names))


def compute_splits(call) -> dict:
    """Ask the simulator for every task's variations per split.

    `call(fn)` runs `fn(gateway)` on a ScienceWorld JVM (see `JVMHost.call`).
    """
    def work(gw):
        sim = gw.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        out = {}
        for t in all_tasks():
            err = sim.load(t.name, 0, "", False)
            if err:
                raise RuntimeError(f"ScienceWorld could not load task {t.name!r}: {err}")
            out[t.name] = {"max_variations": int(sim.getTaskMaxVariations(t.name)),
                           "train": _ints(sim.getVariationsTrain()),
                           "dev": _ints(sim.getVariationsDev()),
                           "test": _ints(sim.getVariationsTest())}
        gw.detach(sim)
        return out
    return {"version": _version(), "tasks": call(work)}


def _ints(jlist) -> list[int]:
    # One round trip ("[1, 2, 3]") instead of one per element.
    text = str(jlist.toString()).strip("[] ")
    return [int(x) for x in text.split(",")] if text else []


def load_splits(call=None) -> dict:
    """{task name: {"max_variations", "train", "dev", "test"}}, from memory, disk or the JVM.

    `call` is needed only when nothing is cached (see `compute_splits`).
    """
    global _SPLITS
    with _SPLITS_LOCK:
        if _SPLITS is not None:
            return _SPLITS["tasks"]
        path = splits_cache_path()
        try:
            data = json.loads(path.read_text())
            if _valid(data):
                _SPLITS = data
                return data["tasks"]
        except (OSError, ValueError):
            pass
        if call is None:
            raise RuntimeError("ScienceWorld splits are not cached and no JVM was given to compute them")
        data = compute_splits(call)
        _SPLITS = data
        try:   # atomic write: concurrent workers may race; any complete file is correct
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
                json.dump(data, f)
            os.replace(f.name, path)
        except OSError:
            pass
        return data["tasks"]


def clear_split_cache(disk: bool = False) -> None:
    """Forget the in-process splits (and the disk file with `disk=True`); for tests."""
    global _SPLITS
    with _SPLITS_LOCK:
        _SPLITS = None
        if disk:
            try:
                splits_cache_path().unlink()
            except FileNotFoundError:
                pass


def split_task_ids(splits: dict, tasks: Sequence[SWTask], split: str,
                   variations_per_task: int | None = None) -> list[str]:
    """Task ids of `split` for `tasks`, task by task in the package's order, variations ascending."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {list(SPLITS)}")
    out: list[str] = []
    for t in tasks:
        variations = splits[t.name][split]
        if variations_per_task is not None:
            variations = variations[: int(variations_per_task)]
        out.extend(task_id(t.name, v) for v in variations)
    return out
