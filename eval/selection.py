"""Which tasks of a held-out split an evaluation plays.

Environments list their tasks in a stable order that is usually grouped by task type (ALFWorld's
games sorted by type, ScienceWorld task by task), so "the first N" can miss whole task types.
The default therefore plays every task of the split, or, when `eval.num_tasks` is smaller, a
seeded sample stratified by task type: every type gets at least one task (when N ≥ the number
of types) and the rest follow the types' shares of the split. The chosen tasks are returned in
the environment's order, and the report says how they were chosen.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

METHODS = ("stratified", "first")


@dataclass
class TaskSelection:
    tasks: list[str]                 # the chosen task ids, in the environment's order
    method: str                      # "all" | "stratified" | "sample" (no task types) | "first"
    num_available: int               # tasks in the split
    seed: int | None
    per_type: dict[str, list[int]] = field(default_factory=dict)   # type → [chosen, in the split]
    #: chosen task id → its type (typed environments only; not in `to_dict`): an episode that errored
    #: before its env reported `info["task_type"]` still counts in its type's row of the report
    types: dict[str, str] = field(default_factory=dict)
    #: the folder the split's tasks are read from, as the env names it (`TextEnv.data_folder`; not in
    #: `to_dict`): what a stopped evaluation's fingerprint covers
    data_folder: str | None = None

    def describe(self) -> str:
        n, m = len(self.tasks), self.num_available
        if self.method == "all":
            return f"every task of the split ({m})"
        if self.method == "first":
            return f"the first {n} of {m} tasks in the environment's order"
        if self.method == "sample":
            return f"a seeded sample (seed {self.seed}) of {n} of {m} tasks (the environment has no task types)"
        covered = sum(1 for c, _ in self.per_type.values() if c > 0)
        return (f"a seeded sample (seed {self.seed}) of {n} of {m} tasks, stratified by task type "
                f"({covered} of {len(self.per_type)} types)")

    def to_dict(self) -> dict:
        return {"method": self.method, "num_tasks": len(self.tasks), "num_available": self.num_available,
                "seed": self.seed, "per_type": self.per_type, "description": self.describe()}


def allocate(counts: dict[str, int], n: int, rng: np.random.Generator) -> dict[str, int]:
    """How many tasks of each type a sample of n (≤ Σ counts) takes: one per type first (a seeded
    choice of n types when n is smaller than their number), then one at a time to the type furthest
    below its proportional share n·c_k/Σc (ties: the type's name), never more than a type has."""
    types = sorted(counts)
    if n < len(types):
        return {types[i]: 1 for i in sorted(rng.choice(len(types), size=n, replace=False))}
    alloc = {t: 1 for t in types}
    total = sum(counts.values())
    for _ in range(n - len(types)):
        open_types = [t for t in types if alloc[t] < counts[t]]
        best = max(open_types, key=lambda t: (n * counts[t] / total - alloc[t], -types.index(t)))
        alloc[best] += 1
    return alloc


def _stratified(types: list[str | None], counts: dict[str, int], n: int, rng: np.random.Generator) -> list[int]:
    """`n` task indices: `allocate`'s share of each type, drawn without replacement within the type."""
    by_type: dict[str, list[int]] = defaultdict(list)
    for i, ty in enumerate(types):
        if ty is not None:
            by_type[ty].append(i)
    chosen: list[int] = []
    for ty, k in allocate(dict(counts), n, rng).items():
        idx = by_type[ty]
        chosen += [idx[j] for j in rng.choice(len(idx), size=k, replace=False)]
    return chosen


def select_tasks(all_tasks: list[str], num_tasks: int | None, task_type: Callable[[str], str | None] | None = None,
                 seed: int = 0, method: str = "stratified") -> TaskSelection:
    """The tasks an evaluation of `num_tasks` (None: all) plays out of `all_tasks`.

    Args:
        all_tasks: the split's task ids in the environment's stable order.
        num_tasks: how many to play; None or ≥ len(all_tasks) plays all of them.
        task_type: task id → type (None: the environment has no types; a uniform seeded sample).
        seed: seeds the sample, so every evaluation of a run plays the same tasks.
        method: "stratified" (default) or "first" (the first N, as earlier agentq versions did).
    Returns:
        A TaskSelection (tasks in the environment's order, how they were chosen, per-type counts).
    """
    if method not in METHODS:
        raise ValueError(f"eval.selection={method!r}; valid: {list(METHODS)}")
    m = len(all_tasks)
    types = [task_type(t) if task_type else None for t in all_tasks]
    counts: dict[str, int] = defaultdict(int)
    for ty in types:
        if ty is not None:
            counts[ty] += 1
    if num_tasks is not None and int(num_tasks) < 0:
        raise ValueError(f"eval.num_tasks={num_tasks}; must be ≥ 0 or null (every task)")
    n = m if num_tasks is None else min(int(num_tasks), m)
    if n == m:
        chosen, how, seed_used = list(range(m)), "all", None
    elif method == "first":
        chosen, how, seed_used = list(range(n)), "first", None
    else:
        rng = np.random.default_rng(int(seed))
        seed_used = int(seed)
        if counts and all(ty is not None for ty in types):
            how = "stratified"
            chosen = _stratified(types, counts, n, rng)
        else:
            how = "sample"
            chosen = [int(i) for i in rng.choice(m, size=n, replace=False)]
    chosen = sorted(chosen)
    per_type: dict[str, list[int]] = {ty: [0, c] for ty, c in sorted(counts.items())}
    for i in chosen:
        ty = types[i]
        if ty is not None:
            per_type[ty][0] += 1
    return TaskSelection([all_tasks[i] for i in chosen], how, m, seed_used, per_type,
                         {all_tasks[i]: kind for i in chosen if (kind := types[i]) is not None})
