"""How long a Ray env pool takes to find hung actors (round 55): fault_env (tests/pool), a local 2-CPU
cluster. Case 1: 16 slots on 2 actors, call_timeout_s=2; actor 0's slots 0 and 2 take 1 s each, slot 4
hangs. Case 2: 9 slots on 3 actors, call_timeout_s=4; each actor's second slot hangs. Both times
include the restart of the hung actors. Run from the repo root: python docs/bench/cpu-r55/ray_hang_timing.py"""
import sys
import time

sys.path[:0] = ["tests/pool", "tests"]

import ray  # noqa: E402

from agentq.pool import EnvSpec, make_pool  # noqa: E402
from agentq.pool.ray_pool import keep_local_cluster_on_loopback, ray_init_kwargs  # noqa: E402


def timed_step(n: int, workers: int, timeout_s: float, actions: dict[int, str]) -> tuple[float, str]:
    pool = make_pool("ray", EnvSpec("fault_env:FaultEnv", {}), n, num_workers=workers, call_timeout_s=timeout_s)
    try:
        pool.reset([(s, {"options": {"task_id": f"t/{s % 10}"}}) for s in range(n)])
        t0 = time.monotonic()
        res = pool.step([(s, actions.get(s, "a")) for s in range(n)])
        return time.monotonic() - t0, str(res[0].error)
    finally:
        pool.close()


keep_local_cluster_on_loopback()
ray.init(**ray_init_kwargs(None), num_cpus=2)
took, error = timed_step(16, 2, 2, {0: "slow", 2: "slow", 4: "hang"})
print(f"case 1 (n x T budget 16 s): {took:.2f} s; {error}")
took, _ = timed_step(9, 3, 4, {3: "hang", 4: "hang", 5: "hang"})
print(f"case 2 (n x T budget 12 s): {took:.2f} s")
