"""Env pools: the same results in-process, in subprocess workers and in Ray actors; a killed worker
is restarted and the episodes it was running are reported as errors, those of its slots outside
the failing call too."""
import os
import signal
import time

import pytest

from agentq.pool import EnvSpec, make_pool
from conftest import one_task_env

SPEC = EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 10,
                                     "game_params": {"coin": "numLocations=2"}})


def play(pool):
    rs = pool.reset([(i, {"seed": i, "options": {"task_id": f"coin/{i}"}}) for i in range(4)])
    st = pool.step([(i, "look around") for i in range(4)])
    return [r.info["task_id"] for r in rs], [r.obs for r in st]


@pytest.mark.parametrize("kind", ["process", "ray"])
def test_pool_matches_inline_and_survives_a_dead_worker(kind):
    inline = make_pool("inline", SPEC, 4)
    want = play(inline)
    inline.close()
    pool = make_pool(kind, SPEC, 4, num_workers=2)
    try:
        assert play(pool) == want
        if kind == "process":
            os.kill(pool.worker_pid(1), signal.SIGKILL)
        else:
            import ray
            ray.kill(pool.actor(1))
        time.sleep(0.5)
        res = pool.step([(i, "look around") for i in range(4)])
        assert [r.ok for r in res] == [True, False, True, False]
        assert "died" in res[1].error and pool.restarts == 1
        again = pool.reset([(1, {"options": {"task_id": "coin/9"}}), (3, {"options": {"task_id": "coin/8"}})])
        assert [r.ok for r in again] == [True, True] and again[0].info["task_id"] == "coin/9"
    finally:
        pool.close()


@pytest.mark.parametrize("kind", ["process", "ray"])
def test_a_restart_ends_the_episodes_of_the_workers_other_slots(kind):
    pool = make_pool(kind, SPEC, 3, num_workers=1)          # slots 0, 1, 2 in one worker
    try:
        assert all(r.ok for r in pool.reset([(i, {"seed": i, "options": {"task_id": f"coin/{i}"}}) for i in (0, 1)]))
        if kind == "process":
            os.kill(pool.worker_pid(0), signal.SIGKILL)
        else:
            import ray
            ray.kill(pool.actor(0))
        time.sleep(0.5)
        (r0,) = pool.step([(0, "look around")])       # the call that finds the worker dead
        assert not r0.ok and "died" in r0.error and pool.restarts == 1
        # slot 1's episode was under way in that worker (slot 2 had none): its env is a fresh one now
        (r1,) = pool.step([(1, "look around")])
        assert not r1.ok and r1.error.startswith(
            f"env {'worker' if kind == 'process' else 'actor'} 0 restarted while this episode ran; "
            "its call for slot(s) [0]: died")
        assert pool.step([(1, "look around")])[0].error == r1.error      # until the slot is reset
        again = pool.reset([(1, {"seed": 1, "options": {"task_id": "coin/1"}}), (2, {"options": {"task_id": "coin/2"}})])
        assert [r.ok for r in again] == [True, True]
        assert all(r.ok for r in pool.step([(1, "look around"), (2, "look around")]))
    finally:
        pool.close()


def test_env_exception_is_reported_and_env_rebuilt():
    pool = make_pool("inline", SPEC, 1)
    (r,) = pool.reset([(0, {"options": {"task_id": "coin/does-not-exist"}})])
    assert not r.ok and "UnknownTaskError" in r.error
    (r,) = pool.reset([(0, {"options": {"task_id": "coin/2"}})])
    assert r.ok


def test_unknown_pool_type():
    with pytest.raises(ValueError, match="valid: \\['inline', 'process', 'ray'\\]"):
        make_pool("threads", SPEC, 2)


OFF_CONTRACT = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("ObsOnlyReset", ("train",)) + """
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=options)[0]


class FourTupleStep(ObsOnlyReset):
    def reset(self, *, seed=None, options=None):
        return TextEnv.reset(self, seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, info
"""


@pytest.mark.parametrize("cls, said", [
    ("ObsOnlyReset", "ObsOnlyReset.reset must return (obs, info) as Gymnasium's Env.reset does, got str"),
    ("FourTupleStep", "FourTupleStep.step must return (obs, reward, terminated, truncated, info) as Gymnasium's "
                      "Env.step does, got (str, float, bool, dict)")])
def test_an_overridden_reset_or_step_off_gymnasiums_contract_is_named(tmp_path, monkeypatch, cls, said):
    """An env overriding the public `reset` (not its `_reset_task` hook) to return the obs alone lost
    every episode to "ValueError: too many values to unpack (expected 2)" from the pool's own code; now
    the episode's error names the env class, the method and what it returned against Gymnasium's
    contract (a `step` returning 4 items likewise)."""
    (tmp_path / "off_contract_env.py").write_text(OFF_CONTRACT)
    monkeypatch.syspath_prepend(str(tmp_path))
    pool = make_pool("inline", EnvSpec(f"off_contract_env:{cls}", {"split": "train"}), 1)
    try:
        (r,) = pool.reset([(0, {"options": {"task_id": "a"}})])
        if cls == "FourTupleStep":
            assert r.ok and r.obs == "start"
            (r,) = pool.step([(0, "go")])
        assert not r.ok and r.error.splitlines()[0] == f"TypeError: {said}"
    finally:
        pool.close()
