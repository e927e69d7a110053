"""Held-out task selection: every task by default, else a seeded sample stratified by task type."""
from __future__ import annotations

import numpy as np
import pytest

from agentq.eval.selection import allocate, select_tasks

# 16 tasks sorted by type, as ALFWorld lists them: "the first 8" would be all "a"
TASKS = [f"a/{i}" for i in range(10)] + [f"b/{i}" for i in range(5)] + ["c/0"]


def _type(t: str) -> str:
    return t.split("/")[0]


def test_allocation_by_hand():
    # one each, then to the type furthest below n·c/Σc = a 5, b 2.5, c 0.5: a, a, a, b, a
    assert allocate({"a": 10, "b": 5, "c": 1}, 8, np.random.default_rng(0)) == {"a": 5, "b": 2, "c": 1}
    assert allocate({"a": 10, "b": 5, "c": 1}, 3, np.random.default_rng(0)) == {"a": 1, "b": 1, "c": 1}
    assert allocate({"a": 10, "b": 5, "c": 1}, 16, np.random.default_rng(0)) == {"a": 10, "b": 5, "c": 1}
    two = allocate({"a": 10, "b": 5, "c": 1}, 2, np.random.default_rng(0))
    assert sum(two.values()) == 2 and set(two.values()) == {1}


def test_stratified_sample_is_seeded_ordered_and_covers_types():
    sel = select_tasks(TASKS, 8, _type, seed=3)
    assert sel.method == "stratified" and len(sel.tasks) == 8 == len(set(sel.tasks))
    assert [_type(t) for t in sel.tasks].count("a") == 5 and "c/0" in sel.tasks
    assert sel.tasks == sorted(sel.tasks, key=TASKS.index)                  # the environment's order
    assert sel.per_type == {"a": [5, 10], "b": [2, 5], "c": [1, 1]}
    assert select_tasks(TASKS, 8, _type, seed=3).tasks == sel.tasks           # same seed, same tasks
    assert any(select_tasks(TASKS, 8, _type, seed=s).tasks != sel.tasks for s in range(4, 10))
    assert "stratified by task type (3 of 3 types)" in sel.describe()


def test_all_first_and_untyped():
    assert select_tasks(TASKS, None, _type).method == "all"
    full = select_tasks(TASKS, 99, _type)
    assert full.tasks == TASKS and full.describe() == "every task of the split (16)"
    first = select_tasks(TASKS, 4, _type, method="first")
    assert first.tasks == TASKS[:4] and first.per_type["b"] == [0, 5]
    untyped = select_tasks(TASKS, 4, None, seed=0)
    assert untyped.method == "sample" and len(set(untyped.tasks)) == 4 and untyped.per_type == {}
    with pytest.raises(ValueError, match="eval.selection='random'; valid"):
        select_tasks(TASKS, 4, _type, method="random")
    with pytest.raises(ValueError, match="eval.num_tasks=-1"):
        select_tasks(TASKS, -1, _type)
