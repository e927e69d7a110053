"""Nothing waits forever: a stopped env worker or TWX JVM is detected by a timeout, killed,
restarted, and its episodes are reported like a crash. Every JVM runs with a heap cap, and a
local Ray cluster listens on loopback only."""
import gc
import os
import signal
import time

import gymnasium as gym
import pytest
from proc_watch import gone

import agentq.envs  # noqa: F401  (registers the ids)
from agentq.envs import EnvCrashedError
from agentq.pool import EnvSpec, make_pool

SPEC = EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 10,
                                     "game_params": {"coin": "numLocations=2"}})


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP `pid` and wait until every thread of it is stopped: kill() returns before a thread
    running on another core has stopped, and a sub-millisecond env call could still be answered
    in that window (what made the TWX test below fail now and then)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            states = [open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
                      for t in os.listdir(f"/proc/{pid}/task")]
        except (FileNotFoundError, ProcessLookupError):       # a thread ended while we looked
            continue
        if all(s in "tT" for s in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within {timeout_s} s")


def test_a_stopped_worker_is_killed_restarted_and_reported():
    pool = make_pool("process", SPEC, 4, num_workers=2)
    try:
        assert all(r.ok for r in pool.reset([(i, {"options": {"task_id": f"coin/{i}"}}) for i in range(4)]))
        pool.call_timeout_s = 2.0           # after the first reset, which starts each worker's JVM
        pid = pool.worker_pid(1)
        stop(pid)
        res = pool.step([(i, "look around") for i in range(4)])
        assert [r.ok for r in res] == [True, False, True, False]
        assert ("hung: no answer to step of 2 slot(s): its first env call did not finish within 2 s "
                "(env_pool.call_timeout_s=2); killed") in res[1].error
        assert pool.restarts == 1 and pool.worker_pid(1) != pid
        assert gone(pid)
        again = pool.reset([(1, {"options": {"task_id": "coin/9"}}), (3, {"options": {"task_id": "coin/8"}})])
        assert [r.ok for r in again] == [True, True]
    finally:
        pool.close()


def twx_jvm(env):
    from agentq.envs.textworld_express.env import _SHARED

    return _SHARED["owner"]._gateway.java_process


@pytest.mark.parametrize("earlier_env", [False, True])
def test_a_stopped_twx_jvm_times_out_and_is_restarted(earlier_env):
    """A stopped JVM makes step() raise after this env's call_timeout_s, also when an env opened
    earlier in the process (with the default 60 s) started the shared JVM: each env's calls carry
    its own read timeout (`_client_with_timeout`). The stopped JVM is killed, and reset() brings a
    new one up."""
    first = gym.make("agentq/TextWorldExpress-v0", split="train") if earlier_env else None
    env = gym.make("agentq/TextWorldExpress-v0", split="train", call_timeout_s=2.0)
    try:
        if first is not None:
            first.reset(options={"task_id": "coin/2"})
        env.reset(options={"task_id": "coin/1"})
        jvm = twx_jvm(env)
        # py4j deletes a collected Java object through the client that made it: a cyclic-GC pass
        # during the step would wait out `first`'s 60 s client twice (CI saw 124 s). That is
        # `first`'s timeout, not this env's, so the timed window runs with the collector paused.
        gc.collect()
        gc.disable()
        try:
            stop(jvm.pid)
            t0 = time.monotonic()
            with pytest.raises(EnvCrashedError, match="stopped answering \\(call_timeout_s=2\\)"):
                env.step("look around")
            assert time.monotonic() - t0 < 20
        finally:
            gc.enable()
        assert jvm.poll() is not None                   # killed, not left stopped
        obs, info = env.reset(options={"task_id": "coin/1"})
        assert twx_jvm(env).pid != jvm.pid and info["task_id"] == "coin/1"
        assert env.step("look around")[0].startswith("You are in")
    finally:
        env.close()
        if first is not None:
            first.close()


def test_twx_jvm_has_a_heap_cap():
    env = gym.make("agentq/TextWorldExpress-v0", split="train", jvm_heap="384m")
    try:
        env.reset(options={"task_id": "coin/1"})
        args = open(f"/proc/{twx_jvm(env).pid}/cmdline").read().split("\0")
        assert "-Xmx384m" in args and "-XX:+ExitOnOutOfMemoryError" in args
    finally:
        env.close()
    with pytest.raises(ValueError, match="bad JVM memory size 'lots'"):
        gym.make("agentq/TextWorldExpress-v0", jvm_heap="lots")


def test_local_ray_cluster_listens_on_loopback_only():
    ray = pytest.importorskip("ray")
    from agentq.pool.ray_pool import ray_init_kwargs

    assert ray_init_kwargs(None)["_node_ip_address"] == "127.0.0.1"
    assert "_node_ip_address" not in ray_init_kwargs("auto")        # joining a cluster: its own address
    if ray.is_initialized():
        ray.shutdown()
    pool = make_pool("ray", SPEC, 2, num_workers=1)
    try:
        assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
        import psutil

        ours = {p.pid for p in psutil.Process().children(recursive=True)}
        listening = [c.laddr.ip for c in psutil.net_connections(kind="inet") if c.status == "LISTEN" and c.pid in ours]
        assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in listening), listening
        assert pool.step([(0, "look")])[0].ok is False          # not reset yet: reported, not raised
    finally:
        pool.close()
        ray.shutdown()
