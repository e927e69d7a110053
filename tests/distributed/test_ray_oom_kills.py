"""With Ray's own memory monitor (slow: the fast checks, in test_distributed_rollout.py and
tests/pool/test_pool_faults.py, answer a killed actor's calls as Ray does here). The monitor kills an
actor when its node runs low on memory, and Ray then answers the call it was running, and every later
call to it, with `ray.exceptions.OutOfMemoryError`: no `RayActorError`. A rollout worker killed so was
taken for a worker whose call raised (bad input): the error reached the trainer, and the worker was
never restarted (every later `generate` raised again). An env actor killed so was restarted, but its
episodes' error was Ray's advice paragraph, not what happened. Both are restarted now, their episodes
reported with the node's memory.

The cluster here kills at 2 GiB above the memory in use when it starts (`RAY_memory_usage_threshold`),
one worker at a time (`RAY_worker_killing_policy_by_group`), and a worker is made to take memory until
it is killed: 64 MiB every 50 ms (fault_env's "hog"; slowly, so that by the monitor's next look, 250 ms
on, the killed worker has freed it), so the test needs some free memory. The node's memory is the
machine's: where other programs take memory meanwhile, the monitor may kill a second worker, so what
follows the kill is checked on the killed worker's slots and episodes only."""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentq.pool import EnvSpec, make_pool

pytest.importorskip("ray")
MARGIN = 2 * 2 ** 30
POOL_TESTS = Path(__file__).resolve().parents[1] / "pool"      # fault_env.py
#: how a killed worker's episodes are reported (after "env actor 0 " / "rollout worker 1 ")
KILLED = (r"died \(killed by Ray's memory monitor: OutOfMemoryError: 1 worker\(s\) were killed due to the node "
          r"running low on memory\. Memory on the node \(IP: 127\.0\.0\.1, ID: \w+\) was [\d.]+GB used / [\d.]+GB "
          r"limit \([\d.]+\)\); restarted")


@pytest.fixture(scope="module")
def oom_cluster():
    """A 2-CPU local cluster started as agentq starts one, whose memory monitor kills at 2 GiB above
    what the machine uses now; its workers import fault_env through this process's sys.path."""
    import ray

    from agentq.pool.ray_pool import keep_local_cluster_on_loopback, ray_init_kwargs

    vm = psutil.virtual_memory()
    if vm.available < 3 * MARGIN:
        pytest.skip("needs 6 GiB of free memory: a worker takes 2 GiB before Ray's memory monitor kills it")
    if ray.is_initialized():
        ray.shutdown()
    env = {"RAY_memory_usage_threshold": f"{(vm.total - vm.available + MARGIN) / vm.total:.4f}",
           "RAY_memory_monitor_refresh_ms": "250", "RAY_worker_killing_policy_by_group": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)                 # read by the raylet when it starts
    sys.path.insert(0, str(POOL_TESTS))
    try:
        keep_local_cluster_on_loopback()
        ray.init(**ray_init_kwargs(None), num_cpus=2)
    finally:
        sys.path.remove(str(POOL_TESTS))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_env_actor_killed_by_rays_memory_monitor_is_reported_as_such(oom_cluster):
    pool = make_pool("ray", EnvSpec("fault_env:FaultEnv", {}), 4, num_workers=2, call_timeout_s=30)
    try:
        assert all(r.ok for r in pool.reset([(s, {"options": {"task_id": f"t/{s}"}}) for s in range(4)]))
        res = pool.step([(0, "hog"), (1, "a"), (2, "b"), (3, "c")])
        assert [r.obs for r in res[1::2]] == ["echo a", "echo c"] and pool.restarts == 1
        assert res[0].error == res[2].error and re.fullmatch(f"env actor 0 {KILLED}", res[0].error), res[0].error
        # the restarted actor plays
        assert all(r.ok for r in pool.reset([(s, {"options": {"task_id": f"t/{s}"}}) for s in (0, 2)]))
        res = pool.step([(0, "x0"), (2, "x2")])
        assert [r.obs for r in res] == ["echo x0", "echo x2"], [r.error for r in res]
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rollout_worker_killed_by_rays_memory_monitor_is_restarted(oom_cluster, tiny_model_dir, tokenizer,
                                                                    tmp_path):
    from test_distributed_rollout import distributed, turn, weights

    from agentq.rollout.distributed import EngineWorker

    flag = str(tmp_path / "hog")

    class Hog(EngineWorker):        # defined here: pickled by value into the actor
        def generate(self, requests):
            held = []
            while os.path.exists(flag) and len(held) < 256:
                held.append(b"x" * 2 ** 26)          # written, so resident
                time.sleep(0.05)
            return EngineWorker.generate(self, requests)

    dist = distributed(tiny_model_dir, tokenizer)
    try:
        dist._cls = oom_cluster.remote(max_restarts=0)(Hog)
        assert dist._restart({1: "to run Hog"}) == {} and dist.restarts == 1
        dist.update_weights(weights(tiny_model_dir).items(), version=0)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12 + e)] for e in range(8)}
        assert all(r.finish_reason != "error" for r in dist.generate(turn(range(4), ctx)))
        assert [dist.worker_of(e) for e in range(4)] == [0, 1, 0, 1]
        open(flag, "w").close()
        res = dist.generate(turn(range(4), ctx))                  # raised OutOfMemoryError
        os.unlink(flag)
        assert [r.finish_reason for r in res] == ["length", "error", "length", "error"] and dist.restarts == 2
        assert res[1].error == res[3].error and re.fullmatch(f"rollout worker 1 {KILLED}", res[1].error), res[1].error
        for e in (1, 2, 3):                  # episode 0 stays on worker 0: the next new one goes to worker 1
            dist.release(e)
        (again,) = dist.generate(turn([7], ctx))                  # raised OutOfMemoryError again
        assert again.finish_reason == "length" and dist.worker_of(7) == 1
    finally:
        dist.close()
