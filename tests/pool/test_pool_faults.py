"""The subprocess and Ray pools under faults, with the same assertions for both (one dispatch,
`WorkerPool`): a worker that cannot be restarted costs its own slots, not the other workers' answers,
and the pool gives up after a bounded number of tries; bad input raises before anything runs; an
unpicklable env result costs its episode only; an interrupted call never leaves an answer behind for
the next one; close() ends hung workers and a failed start leaves none; a command too large for the
pipe of a stopped worker costs its timeout, not a pool blocked for good; an actor killed by Ray's
memory monitor is reported as such; a worker that dies at every call of one command ends the run after
three, whatever other commands complete between; an answer cut short or with a corrupt header counts
as a crash. The env is `fault_env.py`."""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import re
import signal
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from agentq.pool import EnvSpec, make_pool
from agentq.utils.errors import RunAborted
from proc_watch import gone, wait_until
from ray_faults import OOM, dead_actors_answer_oom, kill

HERE = Path(__file__).resolve().parent
KINDS = ["process", "ray"]


@pytest.fixture(scope="module")
def ray_cluster():
    """A 2-CPU local cluster for this module, started as agentq starts one: its workers import
    fault_env through this process's sys.path (pytest put this folder there)."""
    ray = pytest.importorskip("ray")
    from agentq.pool.ray_pool import keep_local_cluster_on_loopback, ray_init_kwargs

    if ray.is_initialized():
        ray.shutdown()
    assert str(HERE) in sys.path
    keep_local_cluster_on_loopback()
    ray.init(**ray_init_kwargs(None), num_cpus=2)
    try:
        yield ray
    finally:
        ray.shutdown()


def spec(**kw) -> EnvSpec:
    return EnvSpec("fault_env:FaultEnv", kw)


def make(kind: str, request, env: EnvSpec, n: int = 2, **kw):
    if kind == "ray":
        request.getfixturevalue("ray_cluster")
    kw.setdefault("call_timeout_s", 10)
    kw.setdefault("num_workers", n)
    return make_pool(kind, env, n, **kw)


def start(pool, slots) -> None:
    assert all(r.ok for r in pool.reset([(s, {"options": {"task_id": f"t/{s % 10}"}}) for s in slots]))


def obs(results) -> list[str]:
    return [r.obs if r.ok else "ERROR" for r in results]


def interrupted(kind: str, pool, items) -> None:
    """pool.step(items), interrupted (KeyboardInterrupt: a Ctrl-C in the trainer) 0.3 s into its wait
    for the answers. Raised from the wait itself, not by a signal at an arbitrary point."""
    def interrupt(*_, **__):
        time.sleep(0.3)
        raise KeyboardInterrupt
    with pytest.MonkeyPatch.context() as mp_:
        if kind == "process":
            from multiprocessing.connection import Connection

            from agentq.pool import process
            mp_.setattr(Connection, "poll", interrupt)
            mp_.setattr(process, "wait", interrupt)         # the pool's wait on every busy worker's pipe
        else:
            mp_.setattr(pool._ray, "get", interrupt)
            mp_.setattr(pool._ray, "wait", interrupt)       # the pool's wait on every busy actor's call
        with pytest.raises(KeyboardInterrupt):
            pool.step(items)


@pytest.mark.parametrize("kind", ["inline", "process"])
def test_an_env_that_raises_is_reported_down_to_its_own_line(kind, request):
    """The episode's error names the env's own frame (file, line, hook) and agentq's hook around it:
    the 4 outermost frames it kept showed only the worker and gymnasium's wrappers."""
    pool = make(kind, request, spec())
    try:
        start(pool, [0])
        (r0,) = pool.step([(0, "raise")])
        assert not r0.ok and r0.error.startswith("RuntimeError: boom in the env's own code\n")
        assert re.search(r'fault_env\.py", line \d+, in _act\n', r0.error), r0.error
        assert re.search(r'fault_env\.py", line \d+, in _step_task\n', r0.error), r0.error
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_that_cannot_restart_costs_its_slots_not_the_other_answers(kind, request, tmp_path):
    flag = tmp_path / "flag"
    pool = make(kind, request, spec(flag=str(flag)))
    try:
        start(pool, [0, 1])
        flag.touch()                                  # from now on worker 0 cannot be rebuilt
        r0, r1 = pool.step([(0, "crash"), (1, "a")])
        assert r1.obs == "echo a" and not r0.ok
        assert "could not be restarted (RuntimeError: cannot build:" in r0.error
        assert obs(pool.step([(1, "b")])) == ["echo b"]       # this call's answer, not an earlier one
        (again,) = pool.reset([(0, {"options": {"task_id": "t/0"}})])
        assert not again.ok and "is down: it could not be started" in again.error
        flag.unlink()
        start(pool, [0])                              # tried again at its next call: back up
        assert obs(pool.step([(0, "c"), (1, "d")])) == ["echo c", "echo d"]
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_that_never_comes_back_ends_the_run_after_three_tries(kind, request, tmp_path):
    flag = tmp_path / "flag"
    pool = make(kind, request, spec(flag=str(flag)))
    try:
        start(pool, [0, 1])
        flag.touch()
        assert not pool.step([(0, "crash")])[0].ok                       # failed start 1
        assert not pool.reset([(0, {"options": {"task_id": "t/0"}})])[0].ok      # 2
        with pytest.raises(RunAborted, match="could not be started 3 times in a row; giving up: RuntimeError"):
            pool.reset([(0, {"options": {"task_id": "t/0"}})])                   # 3
    finally:
        pool.close()


BAD = [
    ("step", [(2, "a")], ValueError, "slot 2 does not exist; valid: 0 … 1"),
    ("step", [(-1, "a")], ValueError, "slot -1 does not exist"),
    ("step", [(0, "a"), (0, "b")], ValueError, "slot 0 named twice"),
    ("step", [("0", "a")], TypeError, "slot must be an int, got str"),
    ("step", [(0, "a"), (1, None)], TypeError, "slot 1's action must be a str, got NoneType"),
    ("step", [(0, "a"), 1], TypeError, "each item must be a \\(slot, action\\) pair"),
    ("reset", [(0, {}), (1, "t/1")], TypeError, "slot 1's reset kwargs must be a dict"),
]


@pytest.mark.parametrize("kind", ["inline", *KINDS])
def test_bad_input_raises_before_anything_runs(kind, request):
    pool = make(kind, request, spec()) if kind != "inline" else make_pool("inline", spec(), 2)
    try:
        start(pool, [0, 1])
        bad = BAD if kind == "inline" else [   # an unpicklable value is caught before any worker gets its share
            *BAD, ("reset", [(0, {}), (1, {"options": {"task_id": threading.Lock()}})], TypeError, "cannot be sent")]
        for cmd, items, exc, match in bad:
            with pytest.raises(exc, match=match):
                getattr(pool, cmd)(items)
        res = pool.step([(0, "b"), (1, "c")])
        assert obs(res) == ["echo b", "echo c"] and [r.info["steps"] for r in res] == [1, 1]   # none of it ran
        assert getattr(pool, "restarts", 0) == 0
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_unsendable_result_costs_its_episode_only(kind, request):
    pool = make(kind, request, spec())
    try:
        start(pool, [0, 1])
        r0, r1 = pool.step([(0, "lock"), (1, "a")])
        assert not r0.ok and "result cannot be sent back to the pool (TypeError" in r0.error
        assert r1.obs == "echo a" and pool.restarts == 0
        start(pool, [0])
        assert obs(pool.step([(0, "b"), (1, "c")])) == ["echo b", "echo c"]
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_hung_worker_is_reported_alike_by_both_pools(kind, request):
    pool = make(kind, request, spec(), call_timeout_s=2)
    try:
        start(pool, [0, 1])
        r0, r1 = pool.step([(0, "hang"), (1, "a")])
        assert r1.obs == "echo a" and pool.restarts == 1
        worker = "worker" if kind == "process" else "actor"
        assert r0.error == (f"env {worker} 0 hung: no answer to step of 1 slot(s) within 2 s "
                            "(env_pool.call_timeout_s=2); killed; restarted")
    finally:
        pool.close()


def test_a_hang_after_a_workers_first_calls_is_found_one_call_timeout_after_the_last_that_finished():
    """A subprocess worker steps its slots in turn and ticks after each: one env that hangs is found
    within `call_timeout_s` of the last call that finished, where the pool waited n × call_timeout_s for
    the whole answer (8 slots × 1 s here; 16 slots × 120 s, 32 minutes, at the defaults). The calls
    before the hang are lost with the worker, as in any hang; the other worker's answers are kept."""
    pool = make_pool("process", spec(), 16, num_workers=2, call_timeout_s=1)
    try:
        start(pool, range(16))
        t0 = time.monotonic()
        res = pool.step([(s, "hang" if s == 4 else "a") for s in range(16)])
        took = time.monotonic() - t0
        assert obs(res[1::2]) == ["echo a"] * 8
        # worker 0's slots in order 0, 2, 4: two calls finished, then slot 4 hung
        assert [r.error for r in res[0::2]] == [("env worker 0 hung: no answer to step of 8 slot(s): 2 env call(s) "
                                                 "finished, the next did not finish within 1 s "
                                                 "(env_pool.call_timeout_s=1); killed; restarted")] * 8
        assert pool.restarts == 1 and took < 4, took       # the whole answer's budget: 8 s
        start(pool, range(0, 16, 2))
        assert obs(pool.step([(s, "b") for s in range(16)])) == ["echo b"] * 16
    finally:
        pool.close()


def test_a_ray_actor_that_hangs_after_its_first_calls_is_found_one_call_timeout_after_its_last_tick(request):
    """A Ray actor's call streams ticks as its env calls end (at most every `tick_s`, 0.2 s here): one env
    that hangs after two 1 s calls is found `call_timeout_s` + `tick_s` after the last of them (~4.2 s),
    where the pool waited n × call_timeout_s for the whole answer (8 slots × 2 s here; 16 slots × 120 s at
    the defaults), and never sooner than call_timeout_s after a call that ended."""
    pool = make("ray", request, spec(), 16, num_workers=2, call_timeout_s=2)
    try:
        start(pool, range(16))
        assert pool.tick_s == pytest.approx(0.2)
        t0 = time.monotonic()
        res = pool.step([(s, {0: "slow", 2: "slow", 4: "hang"}.get(s, "a")) for s in range(16)])
        took = time.monotonic() - t0
        assert obs(res[1::2]) == ["echo a"] * 8
        assert [r.error for r in res[0::2]] == [("env actor 0 hung: no answer to step of 8 slot(s): no env call finished "
                                                 "within 2 s (2 reported finished; an actor reports at most every 0.2 s) "
                                                 "(env_pool.call_timeout_s=2); killed; restarted")] * 8
        assert pool.restarts == 1 and 4.0 < took < 12, took       # the whole answer's budget: 16 s
        start(pool, range(0, 16, 2))
        assert obs(pool.step([(s, "b") for s in range(16)])) == ["echo b"] * 16
    finally:
        pool.close()


def test_an_env_call_stream_ticks_at_most_every_tick_s():
    """`WorkerCore.call_ticking`: a tick as it starts, then after a call only once `tick_s` has passed
    since the last, each with the calls finished so far; the answer last, the same results as `call`'s."""
    from agentq.pool.base import WorkerCore, encode_items

    core = WorkerCore(spec(), [0, 1, 2])
    try:
        core.reset([(s, {"options": {"task_id": "t/0"}}) for s in range(3)])
        items = encode_items("step", [(0, "slow"), (1, "a"), (2, "slow")])
        messages = list(core.call_ticking("step", items, 0.5))
        assert [m[0] for m in messages] == ["tick", "tick", "tick", "ok"] and [m[1] for m in messages[:3]] == [0, 1, 3]
        answer = [(r.slot, r.obs) for r in pickle.loads(messages[-1][1])]
        assert answer == [(r.slot, r.obs) for r in pickle.loads(core.call("step", items))]
        assert answer == [(0, "echo slow"), (1, "echo a"), (2, "echo slow")]
        quick = list(core.call_ticking("step", encode_items("step", [(s, "a") for s in range(3)]), 5.0))
        assert quick[:-1] == [("tick", 0)] and quick[-1][0] == "ok"
    finally:
        core.close()


@pytest.mark.timeout(120)
def test_a_worker_whose_ticks_filled_the_pipe_while_the_pool_waited_elsewhere_is_not_hung():
    """Worker 1 steps 600 slots of 5 ms each, but its pipe holds ~280 ticks: it blocks sending the next
    (after ~1.4 s) until the pool reads it, which is only once worker 0's hang is found (~4 s). Its ticks
    then carry times long past, and its next call takes 5 ms; the wait for that call starts at the read, so the
    worker is not taken for hung (it was, with every one of its 600 episodes lost, in a review's
    reproduction)."""
    pool = make_pool("process", spec(), 1200, num_workers=2, call_timeout_s=2)
    try:
        start(pool, range(1200))
        res = pool.step([(s, {0: "slow", 2: "slow", 4: "hang"}.get(s, "nap")) for s in range(1200)])
        assert obs(res[1::2]) == ["echo nap"] * 600
        assert res[0].error == ("env worker 0 hung: no answer to step of 600 slot(s): 2 env call(s) finished, the "
                                "next did not finish within 2 s (env_pool.call_timeout_s=2); killed; restarted")
        assert pool.restarts == 1
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_worker_with_more_slots_than_its_pipe_holds_ticks_for_runs_on_while_the_pool_waits_on_another():
    """Two workers of 600 slots: worker 0's first three calls take 1 s each, then 597 of 5 ms (~6 s in
    all); worker 1's 600 take 5 ms each (~3 s), each ticking, and a pipe holds ~280 ticks. The pool reads
    worker 0's answer first. It used to read only that worker meanwhile, so worker 1 stopped after ~280
    calls until its turn and ended after worker 0 (~7.6 s); the pool now reads every busy worker's ticks
    while it waits, so worker 1 runs through and ends seconds before worker 0. ("clock" answers with
    the time its call ended, on the host's monotonic clock.)"""
    pool = make_pool("process", spec(), 1200, num_workers=2, call_timeout_s=30)
    try:
        start(pool, range(1200))
        res = pool.step([(s, "slow" if s in (0, 2, 4) else "clock") for s in range(1200)])
        assert all(r.ok for r in res), [r.error for r in res if not r.ok][:2]
        ended = [max(float(r.obs.split()[1]) for r in res[w::2] if r.obs.startswith("clock")) for w in (0, 1)]
        assert ended[1] < ended[0] - 1, ended
        assert pool.restarts == 0
        assert obs(pool.step([(s, "b") for s in range(1200)])) == ["echo b"] * 1200    # nothing left unread
    finally:
        pool.close()

@pytest.mark.parametrize("kind", KINDS)
def test_workers_that_hang_together_are_found_together(kind, request):
    """Three workers each hang after one finished call. A subprocess worker's wait for its next call
    began only when the pool turned to it, so they were found one after another (3 × call_timeout_s, 9 s
    here; 8 workers stuck on one engine at the defaults: 16 minutes); a Ray actor's whole answer had 3 ×
    call_timeout_s. The pool hears every busy worker's ticks now, so each is found call_timeout_s after
    its own last call (a Ray actor up to `tick_s` later: its quick first call ended within `tick_s` of
    the tick its start sent, so no tick reported it)."""
    pool = make(kind, request, spec(), 9, num_workers=3, call_timeout_s=3)
    try:
        start(pool, range(9))
        t0 = time.monotonic()
        res = pool.step([(s, "hang" if s // 3 == 1 else "a") for s in range(9)])
        took = time.monotonic() - t0
        what = ("1 env call(s) finished, the next did not finish within 3 s" if kind == "process" else
                "no env call finished within 3 s (0 reported finished; an actor reports at most every 0.3 s)")
        worker = "worker" if kind == "process" else "actor"
        assert [r.error for r in res] == [f"env {worker} {s % 3} hung: no answer to step of 3 slot(s): {what} "
                                          "(env_pool.call_timeout_s=3); killed; restarted" for s in range(9)]
        assert pool.restarts == 3 and 3.0 < took < 8, took        # one call_timeout_s and the restarts
    finally:
        pool.close()


@pytest.mark.parametrize("where", ["_launch", "_await"])
def test_a_ctrl_c_while_a_worker_restarts_costs_the_next_call_only_that_workers_slot(where):
    """Ctrl-C while worker 1 was started again after a crash. In its launch, the pool kept its closed
    pipe and the next call's wait on worker 0 failed on it (worker 0 taken for dead too); in the wait for
    its start, its "ready" was later read as the answer to the next call (an error with no text). Now
    the worker counts as owing an answer until it has started, and the next call starts it again first."""
    pool = make_pool("process", spec(), 2, num_workers=2, call_timeout_s=5)
    try:
        start(pool, range(2))
        orig = getattr(pool, where)

        def interrupted_once(*args):        # in _await: before reading the worker's start message
            setattr(pool, where, orig)
            raise KeyboardInterrupt
        setattr(pool, where, interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            pool.step([(0, "a"), (1, "crash")])
        time.sleep(1)
        res = pool.step([(0, "b"), (1, "c")])
        assert res[0].ok and res[0].obs == "echo b", res[0].error
        assert not res[1].ok and "a call to it was interrupted before its answer was read" in res[1].error, res[1].error
        start(pool, [1])
        assert obs(pool.step([(0, "d"), (1, "e")])) == ["echo d", "echo e"]
    finally:
        pool.close()

def test_a_ctrl_c_that_reaches_a_worker_does_not_break_off_its_env_call():
    """A terminal's Ctrl-C is sent to its whole process group, the env workers too: a worker took it as
    a KeyboardInterrupt midway through an env call and exited (py4j logged a traceback per call). The
    trainer handles it and closes the workers; a worker now ignores it and answers."""
    pool = make_pool("process", spec(), 2, num_workers=2, call_timeout_s=10)
    try:
        start(pool, range(2))
        pid = pool.worker_pid(0)
        threading.Timer(0.5, os.kill, (pid, signal.SIGINT)).start()
        assert obs(pool.step([(0, "slow"), (1, "a")])) == ["echo slow", "echo a"]
        assert pool.restarts == 0 and pool.worker_pid(0) == pid
    finally:
        pool.close()

def kill_worker(kind: str, request, pool, w: int) -> None:
    """SIGKILL the subprocess worker / ray.kill the actor `w` and wait until it is dead (it is idle)."""
    if kind == "process":
        pid = pool.worker_pid(w)
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: gone(pid))
    else:
        kill(request.getfixturevalue("ray_cluster"), pool.actor(w))


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_killed_between_steps_costs_no_episode_at_the_next_reset(kind, request):
    """Worker 0 (slots 0 and 2) is killed while idle, between two steps' episodes. The next reset found
    it dead and answered its slots with errors, though no episode had begun on them (runs r2/r3 lost 16
    of 32 episodes so). Now the worker is restarted and the reset retried on it: every episode is played,
    the restart counted, and the results say what happened (`recovered`)."""
    pool = make(kind, request, spec(), n=4, num_workers=2)
    worker, died = ("env worker 0", "died (exit code -9)") if kind == "process" else ("env actor 0", "died (")
    try:
        start(pool, range(4))
        assert obs(pool.step([(s, "a") for s in range(4)])) == ["echo a"] * 4
        kill_worker(kind, request, pool, 0)
        res = pool.reset([(s, {"options": {"task_id": f"t/{s}"}}) for s in range(4)])
        assert obs(res) == [f"start t/{s}" for s in range(4)]
        assert pool.restarts == 1 and pool.recovered_episodes == 2
        assert [r.recovered is not None for r in res] == [True, False, True, False]
        assert res[0].recovered.startswith(f"{worker} {died}") and res[0].recovered.endswith(
            "; restarted; the reset was retried on it (no episode had started)")
        assert obs(pool.step([(s, "b") for s in range(4)])) == ["echo b"] * 4       # the episodes go on
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_that_dies_again_in_the_retried_reset_reports_its_episodes(kind, request):
    """Worker 0 is killed while idle; the retried reset kills it again (task "crash"): its episode is an
    error naming both deaths, counted as two restarts, and the other worker's episode is played."""
    pool = make(kind, request, spec())
    worker, died = died_in(kind)
    try:
        start(pool, [0, 1])
        kill_worker(kind, request, pool, 0)
        r0, r1 = pool.reset([(0, {"options": {"task_id": "crash"}}), (1, {"options": {"task_id": "t/1"}})])
        assert r1.obs == "start t/1" and not r0.ok and r0.recovered is None
        assert r0.error.startswith(f"{worker} died (") and r0.error.endswith(
            f"; restarted, and the reset retried on it: {died} again; restarted")
        assert pool.restarts == 2 and pool.recovered_episodes == 0
        start(pool, [0])                  # up again
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_reset_that_hung_is_not_retried(kind, request):
    """A reset that hangs on a live worker is the env's (it may hang again): its worker is killed and
    restarted, its episode an error, and the reset is not sent again (a second wait)."""
    pool = make(kind, request, spec(), call_timeout_s=1)
    worker = "worker" if kind == "process" else "actor"
    try:
        r0, r1 = pool.reset([(0, {"options": {"task_id": "hang"}}), (1, {"options": {"task_id": "t/1"}})])
        assert r1.ok and pool.restarts == 1 and pool.recovered_episodes == 0
        assert r0.error == (f"env {worker} 0 hung: no answer to reset of 1 slot(s) within 1 s "
                            "(env_pool.call_timeout_s=1); killed; restarted")
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_interrupted_call_leaves_no_answer_for_the_next(kind, request):
    pool = make(kind, request, spec())
    try:
        start(pool, [0, 1])
        interrupted(kind, pool, [(0, "slow"), (1, "a")])
        time.sleep(1.5)                               # both answers have arrived by now
        res = pool.step([(0, "b"), (1, "c")])
        assert all(not r.ok or r.obs == want for r, want in zip(res, ["echo b", "echo c"])), obs(res)
        start(pool, [0, 1])
        assert obs(pool.step([(0, "d"), (1, "e")])) == ["echo d", "echo e"]
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_close_ends_a_hung_worker(kind, request):
    pool = make(kind, request, spec(), call_timeout_s=60)
    start(pool, [0, 1])
    pids = [int(r.obs.split()[-1]) for r in pool.step([(0, "pid"), (1, "pid")])]
    interrupted(kind, pool, [(0, "hang")])                 # worker 0 is now stuck in its env
    t0 = time.monotonic()
    pool.close()
    assert time.monotonic() - t0 < 13
    assert wait_until(lambda: all(gone(pid) for pid in pids)), [pid for pid in pids if not gone(pid)]
    if kind == "ray":
        assert wait_until(lambda: request.getfixturevalue("ray_cluster").available_resources().get("CPU") == 2.0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_start_leaves_no_worker_running(kind, request, tmp_path):
    # `as error`: the error is still referenced (being reported), so no garbage collection closes the pool
    with pytest.raises(RuntimeError, match="failed to start \\(fault_env:FaultEnv\\): .*the first build") as error:
        make(kind, request, spec(fail_once=str(tmp_path / "once")))      # one of the two fails
    if kind == "process":
        assert wait_until(lambda: not [p for p in mp.active_children() if p.name.startswith("agentq-env")])
    else:
        assert wait_until(lambda: request.getfixturevalue("ray_cluster").available_resources().get("CPU") == 2.0)
    assert error.value is not None


def test_a_pool_started_right_after_another_closed_gets_the_freed_cpus(request):
    """Ray shows a killed actor's CPU as free a moment after the kill: without a second look, the
    next pool (a pipeline's RL pool after its SFT pool) asked for no CPU and warned that none was free."""
    ray = request.getfixturevalue("ray_cluster")
    first = make("ray", request, spec())
    assert first.cpus_per_worker == 1.0
    first.close()
    second = make("ray", request, spec())
    try:
        assert second.cpus_per_worker == 1.0 and ray.available_resources().get("CPU", 0.0) == 0.0
    finally:
        second.close()


def stop(pid: int) -> None:
    """SIGSTOP `pid` and wait until every thread of it is stopped (it reads no command from then on)."""
    os.kill(pid, signal.SIGSTOP)

    def states() -> list[str]:
        try:
            return [open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
                    for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:             # a thread ended while we looked
            return []
    assert wait_until(lambda: all(s in "tT" for s in states() or "R"), 10), states()


def kill_after(pid: int, seconds: float) -> threading.Event:
    """SIGKILL `pid` after `seconds` unless the returned event is set first: what would otherwise block
    forever (the defect a test checks for) ends, and the test fails on its assertions instead of hanging."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds) and not gone(pid):
            os.kill(pid, signal.SIGKILL)
    threading.Thread(target=watch, daemon=True).start()
    return done


@pytest.mark.timeout(60)
def test_a_large_command_for_a_stopped_worker_times_out_instead_of_blocking():
    """A worker's share of a step larger than its pipe holds (32 slots × a 9,000-character action: ~290 kB)
    for a worker that does not read (stopped): the send blocked the pool forever, before the wait for the
    answer and its call_timeout_s began. Now the worker is found hung within call_timeout_s (its first call), killed
    and restarted, and the other worker's answers are kept; the restarted worker takes such steps."""
    pool = make_pool("process", spec(), 64, num_workers=2, call_timeout_s=0.2)
    try:
        start(pool, range(64))
        pid = pool.worker_pid(0)
        stop(pid)
        done = kill_after(pid, 30)
        t0 = time.monotonic()
        res = pool.step([(s, f"{s} " + "x" * 9000) for s in range(64)])
        took = time.monotonic() - t0
        done.set()
        assert [r.error for r in res[0::2]] == [("env worker 0 hung: no answer to step of 32 slot(s): its first env "
                                                 "call did not finish within 0.2 s (env_pool.call_timeout_s=0.2); "
                                                 "killed; restarted")] * 32
        assert obs(res[1::2]) == [f"echo {s} " + "x" * 9000 for s in range(1, 64, 2)]
        assert pool.restarts == 1 and took < 15 and wait_until(lambda: gone(pid))
        start(pool, range(0, 64, 2))
        assert obs(pool.step([(s, f"{s} " + "y" * 9000) for s in range(64)])) == [f"echo {s} " + "y" * 9000
                                                                                 for s in range(64)]
    finally:
        pool.close()


@pytest.mark.timeout(60)
def test_close_ends_a_worker_whose_pipe_is_full():
    """An interrupted call (Ctrl-C) left a large share of a step half-sent to a stopped worker: neither the
    call nor close() blocks on that full pipe (close() does not write to it), and close() kills the worker
    within its deadline. The call's send blocked until the worker was killed."""
    pool = make_pool("process", spec(), 64, num_workers=2, call_timeout_s=60)
    pids = [pool.worker_pid(0), pool.worker_pid(1)]
    start(pool, range(64))
    stop(pids[0])
    done = kill_after(pids[0], 30)
    t0 = time.monotonic()
    interrupted("process", pool, [(s, "x" * 9000) for s in range(64)])     # the send blocked here
    pool.close()                                                            # or here, writing "close"
    done.set()
    assert time.monotonic() - t0 < 13
    assert wait_until(lambda: all(gone(pid) for pid in pids)), [pid for pid in pids if not gone(pid)]


@pytest.mark.timeout(60)
def test_an_actor_killed_by_rays_memory_monitor_is_reported_with_the_nodes_memory(request, monkeypatch):
    """Ray answers every call to an actor that its memory monitor killed with OutOfMemoryError, not a
    RayActorError (tests/distributed/test_ray_oom_kills.py sees it with the monitor itself, -m slow; here
    the actor is ray.kill-ed and its calls answered so, `dead_actors_answer_oom`). The actor was restarted,
    but its episodes' error was the last line of Ray's text, advice on settings ("failed (OutOfMemoryError:
    ... To disable worker killing, ...)"), not what happened to it."""
    ray = request.getfixturevalue("ray_cluster")
    pool = make("ray", request, spec())
    try:
        start(pool, [0, 1])
        kill(ray, pool.actor(0))
        dead_actors_answer_oom(ray, monkeypatch)
        r0, r1 = pool.step([(0, "a"), (1, "b")])
        assert r1.obs == "echo b" and pool.restarts == 1
        assert r0.error == ("env actor 0 died (killed by Ray's memory monitor: OutOfMemoryError: "
                            f"{OOM.splitlines()[0]}); restarted")
        start(pool, [0])
        assert obs(pool.step([(0, "c"), (1, "d")])) == ["echo c", "echo d"]
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_that_dies_at_every_call_ends_the_run_after_three_deaths_in_a_row(kind, request):
    """Worker 0 starts fine but dies in every call that reaches it (its env's task "crash"). It was
    restarted at every call, for good, each episode lost, the run never ending. Now three deaths in resets
    in a row without a completed reset between end the run with one line naming the worker, the command,
    the count and the last cause; a completed reset in between starts the count again, and each death
    before the third is still answered as an error result (the episode reported). A reset a worker died in
    is retried once on the restarted worker: each try counts, so a reset that kills its worker every time
    costs two tries a call, and the third try in a row gives up without a retry."""
    pool = make(kind, request, spec())
    worker = "worker" if kind == "process" else "actor"
    died = "died (exit code 3)" if kind == "process" else "died (ActorDiedError)"

    def reset(task: str):
        return pool.reset([(0, {"options": {"task_id": task}}), (1, {"options": {"task_id": "t/1"}})])
    try:
        for task in ("crash", "t/0", "crash"):        # a completed call after the first deaths
            r0, r1 = reset(task)
            assert r1.ok and (r0.ok if task == "t/0" else r0.error == (
                f"env {worker} 0 {died}; restarted, and the reset retried on it: {died} again; restarted"))
        assert pool.restarts == 4 and pool.recovered_episodes == 0
        with pytest.raises(RunAborted) as error:
            reset("crash")
        assert str(error.value) == (f"env {worker} 0 (fault_env:FaultEnv) died or hung in 3 reset calls in a row "
                                    f"without completing one (restarted after each); giving up: {died}")
        assert pool.restarts == 5
    finally:
        pool.close()


def died_in(kind: str) -> tuple[str, str]:
    """How a pool of `kind` names its worker 0 and its death by the env task / action "crash"."""
    return (("env worker 0", "died (exit code 3)") if kind == "process"
            else ("env actor 0", "died (ActorDiedError)"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_that_dies_at_every_step_ends_the_run_though_its_resets_complete(kind, request):
    """What an agent loop sends: a reset, then a step, over and over; worker 0's env crashes at every step
    (action "crash") and the restarted worker completes every reset in between. The count of calls it died
    in went 1, 0, 1, 0, ...: restarted for good, every episode lost, the run never ending. Now each command
    is counted on its own: the third step in a row it dies in ends the run, a reset completing between
    them or not; the deaths before it are still answered as error results."""
    pool = make(kind, request, spec())
    worker, died = died_in(kind)
    try:
        for _ in range(2):
            start(pool, [0, 1])
            r0, r1 = pool.step([(0, "crash"), (1, "a")])
            assert r1.obs == "echo a" and r0.error == f"{worker} {died}; restarted"
        start(pool, [0, 1])
        with pytest.raises(RunAborted) as error:
            pool.step([(0, "crash"), (1, "a")])
        assert str(error.value) == (f"{worker} (fault_env:FaultEnv) died or hung in 3 step calls in a row without "
                                    f"completing one (restarted after each); giving up: {died}")
        assert pool.restarts == 3
    finally:
        pool.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_whose_steps_complete_between_deaths_is_restarted_not_given_up_on(kind, request):
    """Worker 0 dies at every other step (resets between them): a completed step starts the count of steps
    it died in again, so it is restarted each time and the run goes on (no false give-up)."""
    pool = make(kind, request, spec())
    worker, died = died_in(kind)
    try:
        for i in range(6):
            start(pool, [0, 1])
            r0, r1 = pool.step([(0, "a" if i % 2 else "crash"), (1, "b")])
            assert r1.obs == "echo b" and (r0.obs == "echo a" if i % 2 else r0.error == f"{worker} {died}; restarted")
        assert pool.restarts == 3
    finally:
        pool.close()


@pytest.mark.timeout(60)
def test_a_worker_that_stops_midway_through_a_large_answer_is_restarted_not_waited_for(request):
    """Three workers answer one step: worker 0 hangs, worker 1 stops (SIGSTOP) after the first 64 KiB of
    an 8 MiB answer, worker 2 sends a 4 MiB answer whole. The pool read the rest of worker 1's message
    without a timeout: blocked for good (here until the test kills worker 1 after 30 s). Now the rest of
    a message must come within call_timeout_s of its start: worker 1 is treated as crashed (killed,
    restarted, its episode an error), worker 2's answer is kept, and the call returns within its
    timeouts."""
    from fault_env import BIG

    pool = make_pool("process", spec(), 3, num_workers=3, call_timeout_s=1, start_timeout_s=10)
    try:
        start(pool, range(3))
        pid = pool.worker_pid(1)
        done = kill_after(pid, 30)
        t0 = time.monotonic()
        r0, r1, r2 = pool.step([(0, "hang"), (1, "bigstop"), (2, "big")])
        took = time.monotonic() - t0
        done.set()
        assert r0.error == ("env worker 0 hung: no answer to step of 1 slot(s) within 1 s "
                            "(env_pool.call_timeout_s=1); killed; restarted")
        cut = re.fullmatch(r"env worker 1 stopped midway through its answer to step: (\d+) of (\d+) bytes came, "
                           r"the rest not within 1 s \(env_pool.call_timeout_s=1\); killed; restarted", r1.error)
        assert cut and 0 < int(cut[1]) < BIG < int(cut[2]), r1.error
        assert r2.ok and r2.obs == "b" * BIG
        # worker 0's timeout, one call_timeout_s for the rest of each of the other two answers, the restarts
        assert pool.restarts == 2 and took < 3 * 1 + 10 and wait_until(lambda: gone(pid))
        start(pool, range(2))
        assert obs(pool.step([(0, "a"), (1, "b"), (2, "c")])) == ["echo a", "echo b", "echo c"]
    finally:
        pool.close()


def test_an_answer_with_a_corrupt_length_header_is_handled_as_a_crash():
    """An answer whose length header is negative (not -1, the marker of a longer header): the read raised
    `ValueError: negative count`, which no caller caught, so the call raised to the trainer with worker 0
    left as it was. Now the pipe counts as corrupt: the worker is killed and restarted, its episode is an
    error result naming that, the other worker's answer is kept, and the restarted worker plays on. (The
    test puts the header on a pipe of its own in place of worker 0's.)"""
    pool = make_pool("process", spec(), 2, num_workers=2, call_timeout_s=2)
    proc, real = pool._procs[0]
    ours, theirs = mp.Pipe()
    try:
        start(pool, [0, 1])
        pool._procs[0] = (proc, ours)
        os.write(theirs.fileno(), struct.pack("!i", -5))
        r0, r1 = pool.step([(0, "a"), (1, "b")])
        assert r1.obs == "echo b" and pool.restarts == 1
        assert r0.error == ("env worker 0 sent a corrupt answer to step (a length header of -5 bytes); killed; "
                            "restarted")
        assert wait_until(lambda: gone(proc.pid))
        start(pool, [0])
        assert obs(pool.step([(0, "c"), (1, "d")])) == ["echo c", "echo d"]
    finally:
        pool.close()
        real.close()
        theirs.close()


@pytest.mark.parametrize("frame, why", [
    (struct.pack("!i", -1) + struct.pack("!Q", 2 ** 64 - 1), f"a length header of {2 ** 64 - 1} bytes"),
    (struct.pack("!i", -1) + struct.pack("!Q", 2 ** 34 + 1), f"a length header of {2 ** 34 + 1} bytes"),
    (struct.pack("!i", 5) + b"\x80\x05junk", "5 bytes that do not unpickle (UnpicklingError)"),
    (struct.pack("!i", 3) + b"abc", "3 bytes that do not unpickle (UnpicklingError)")])
def test_a_frame_that_is_not_a_message_is_garbled_before_anything_is_allocated(frame, why):
    """A long header with a size no answer has (OverflowError or a 16 GiB+ allocation before the first
    byte), or bytes that do not unpickle (a traceback from the call): both mean the pipe is corrupt."""
    import agentq.pool.process as process

    ours, theirs = mp.Pipe()
    try:
        os.write(theirs.fileno(), frame)
        with pytest.raises(process._Garbled) as e:
            process._recv_within(ours, 1.0, 1.0)
        assert str(e.value) == why
    finally:
        ours.close()
        theirs.close()


def test_an_answer_is_read_in_reads_of_at_most_max_read_bytes(monkeypatch):
    """One os.readv asked for the whole rest of an answer; macOS's readv fails (EINVAL) when that passes
    32 bits (a 4 GiB answer), as CPython knows, capping its own reads. Now each read asks for at most
    `MAX_READ` bytes (1 GiB; here 100 kB, against a 4 MiB answer), and the answer still comes whole."""
    from fault_env import BIG

    import agentq.pool.process as process
    asked: list[int] = []
    readv = os.readv

    def counted_readv(fd, buffers):
        asked.append(sum(len(b) for b in buffers))
        return readv(fd, buffers)
    pool = make_pool("process", spec(), 1, num_workers=1, call_timeout_s=10)
    try:
        start(pool, [0])
        monkeypatch.setattr(process, "MAX_READ", 100_000)
        monkeypatch.setattr(os, "readv", counted_readv)
        assert obs(pool.step([(0, "big")])) == ["b" * BIG]
        assert max(asked) == 100_000 and sum(asked) > BIG
    finally:
        monkeypatch.undo()
        pool.close()
