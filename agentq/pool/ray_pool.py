"""Ray actors as environment workers (`env_pool=ray`): the same commands as the subprocess pool,
for spreading environments over a Ray cluster. A dead actor, or one that does not answer within
`call_timeout_s` per env call, is (killed and) recreated and its in-flight commands are answered
with error results. A local cluster (no `address`) is started bound to 127.0.0.1, without the
dashboard, so none of its services listen on the machine's network interfaces."""
from __future__ import annotations

import os
import time

from .base import EnvResult, EnvSpec, WorkerCore

LOOPBACK = "127.0.0.1"


def ray_init_kwargs(address: str | None) -> dict:
    """ray.init arguments: join `address` as given, or start a local cluster on loopback only."""
    kw = dict(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
              configure_logging=False)
    if address is None:
        kw["_node_ip_address"] = LOOPBACK
    return kw


def keep_local_cluster_on_loopback() -> None:
    """Ray turns a loopback node address into the machine's reachable IP (and its services listen
    there) unless its "no cluster" mode is on, which it reads from this variable at import time: set
    it for the processes the local cluster starts, and in this process if ray is already imported."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


class RayPool:
    def __init__(self, spec: EnvSpec, num_envs: int, num_workers: int = 2, address: str | None = None,
                 num_cpus_per_worker: float = 1.0, call_timeout_s: float = 120.0):
        import ray

        self._ray = ray
        self.call_timeout_s = float(call_timeout_s)
        if not ray.is_initialized():
            if address is None:
                keep_local_cluster_on_loopback()
            ray.init(**ray_init_kwargs(address))
        self.spec, self.num_envs = spec, num_envs
        self.num_workers = min(num_workers, num_envs)
        self._actor_cls = ray.remote(num_cpus=num_cpus_per_worker, max_restarts=0)(WorkerCore)
        self._slots = {w: [s for s in range(num_envs) if s % self.num_workers == w] for w in range(self.num_workers)}
        self._actors = {w: self._actor_cls.remote(spec, self._slots[w]) for w in range(self.num_workers)}
        self.restarts = 0
        ray.get([a.__ray_ready__.remote() for a in self._actors.values()])

    def _dispatch(self, cmd: str, items):
        by_worker: dict[int, list] = {}
        for it in items:
            by_worker.setdefault(it[0] % self.num_workers, []).append(it)
        futures = {w: getattr(self._actors[w], cmd).remote(its) for w, its in by_worker.items()}
        results: dict[int, EnvResult] = {}
        t0 = time.monotonic()
        for w, fut in futures.items():
            budget = self.call_timeout_s * len(by_worker[w])
            try:
                for r in self._ray.get(fut, timeout=max(0.0, t0 + budget - time.monotonic())):
                    results[r.slot] = r
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError) as e:
                hung = isinstance(e, self._ray.exceptions.GetTimeoutError)
                if hung:
                    self._ray.kill(self._actors[w])
                self.restarts += 1
                self._actors[w] = self._actor_cls.remote(self.spec, self._slots[w])
                why = (f"hung (no answer within {budget:g} s, env_pool.call_timeout_s={self.call_timeout_s:g}); killed"
                       if hung else f"died ({type(e).__name__})")
                for it in by_worker[w]:
                    results[it[0]] = EnvResult(it[0], ok=False, error=f"env actor {w} {why}; restarted")
        return [results[it[0]] for it in items]

    def actor(self, slot: int):
        return self._actors[slot % self.num_workers]

    def reset(self, items):
        return self._dispatch("reset", items)

    def step(self, items):
        return self._dispatch("step", items)

    def close(self):
        for a in self._actors.values():
            try:
                self._ray.get(a.close.remote(), timeout=10)
                self._ray.kill(a)
            except Exception:
                pass
        self._actors.clear()
