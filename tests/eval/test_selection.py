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


def test_real_split_sample_matches_hand_shares_and_is_the_same_in_a_fresh_process(tmp_path):
    """Two checkpoints evaluated separately (other processes, other hash seeds) must play the same tasks,
    or the paired test pairs nothing. ALFWorld's gen_unseen (6 types × 25, no download): 10 tasks are one
    per type, then the 4 left go to the types furthest below 10/6 = 1.67 each, ties by name: the first four."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("alfworld")
    from agentq.config import load_config
    from agentq.eval.evaluate import choose_eval_tasks

    over = ["env=alfworld", f"env.kwargs.cache_dir={tmp_path}", "seed=7"]
    sel = choose_eval_tasks(load_config(over), "gen_unseen", 10)
    assert sel.method == "stratified" and sel.num_available == 150
    assert sel.per_type == {"look_at_obj_in_light": [2, 25], "pick_and_place_simple": [2, 25],
                            "pick_clean_then_place_in_recep": [2, 25], "pick_cool_then_place_in_recep": [2, 25],
                            "pick_heat_then_place_in_recep": [1, 25], "pick_two_obj_and_place": [1, 25]}
    assert sorted(sel.types.values()) == sorted(t.split("/")[0] for t in sel.tasks)
    code = ("import json, sys; from agentq.config import load_config; from agentq.eval.evaluate import choose_eval_tasks; "
            f"print(json.dumps(choose_eval_tasks(load_config({over!r}), 'gen_unseen', 10).tasks))")
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert json.loads(out.stdout.strip().splitlines()[-1]) == sel.tasks
    # another seed draws other tasks with the same shares
    other = choose_eval_tasks(load_config([*over[:2], "seed=8"]), "gen_unseen", 10)
    assert other.per_type == sel.per_type and other.tasks != sel.tasks
