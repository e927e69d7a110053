"""Ray actors as environment workers (`env_pool=ray`): the same commands as the subprocess pool,
for spreading environments over a Ray cluster. A dead actor, or one that does not answer within
`call_timeout_s` per env call, is (killed and) recreated and its in-flight commands are answered
with error results; an episode under way on another slot of that actor (its env rebuilt with the
actor) is answered with an error at its next step (`SiblingSlots`). A local cluster (no `address`)
is started bound to 127.0.0.1, without the dashboard, so none of its services listen on the
machine's network interfaces (`ray_init_kwargs`, `keep_local_cluster_on_loopback`: the trainer's
placement starts it the same way).

Each actor asks for at most one CPU, and less when the cluster has fewer free CPUs than workers
(`cpus_per_worker`; none at all when every CPU is held, with a warning): Ray would otherwise wait
forever to place an actor it cannot fit (a 2-CPU machine with 3 workers, or a second pool while the
first one holds the CPUs). Actors that still cannot start within `start_timeout_s` raise an error
naming the free resources. The RL trainer plays its evaluations through the training pool, so a
run holds one set of workers."""
from __future__ import annotations

import os
import time
import warnings
from typing import Any

from .base import EnvResult, EnvSpec, SiblingSlots, WorkerCore

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


def cpus_per_worker(available_cpus: float, num_workers: int, wanted: float = 1.0) -> float:
    """CPUs each of `num_workers` actors requests: `wanted`, or an equal share of what is free
    (rounded down to 1/100; 0 when nothing is free: Ray places zero-CPU actors anywhere)."""
    return max(0.0, min(float(wanted), int(100 * available_cpus / num_workers) / 100))


class RayPool:
    """`EnvPool` over Ray actors (each a `WorkerCore`); slot s lives in actor s mod num_workers."""

    def __init__(self, spec: EnvSpec, num_envs: int, num_workers: int = 2, address: str | None = None,
                 num_cpus: int | None = None, num_cpus_per_worker: float = 1.0, start_timeout_s: float = 300.0,
                 call_timeout_s: float = 120.0):
        """Join (or start) a Ray cluster and start the actors.

        Args:
            spec: how to build each environment; num_envs: slots; num_workers: actors.
            address: a running cluster to join; None starts a local one on 127.0.0.1 with `num_cpus` CPUs.
            num_cpus_per_worker: CPUs each actor asks for at most (less when fewer are free).
            start_timeout_s: seconds the actors may take to start (then an error naming free resources).
            call_timeout_s: seconds one env call may take before its actor counts as hung.
        """
        import ray

        self._ray = ray
        self.call_timeout_s = float(call_timeout_s)
        if not ray.is_initialized():   # num_cpus sizes a local cluster started here (None: every core)
            if address is None:
                keep_local_cluster_on_loopback()
            ray.init(**ray_init_kwargs(address), num_cpus=num_cpus if address is None else None)
        self.spec, self.num_envs = spec, num_envs
        self.num_workers = min(num_workers, num_envs)
        self.cpus_per_worker = cpus_per_worker(ray.available_resources().get("CPU", 0.0), self.num_workers,
                                               num_cpus_per_worker)
        if self.cpus_per_worker == 0:
            warnings.warn(f"the Ray cluster has no free CPU: {self.num_workers} env worker(s) start without a CPU "
                          "reservation and share the cores with the actors that hold them", stacklevel=2)
        self._actor_cls = ray.remote(num_cpus=self.cpus_per_worker, max_restarts=0)(WorkerCore)
        self._slots = {w: [s for s in range(num_envs) if s % self.num_workers == w] for w in range(self.num_workers)}
        self._actors = {w: self._actor_cls.remote(spec, self._slots[w]) for w in range(self.num_workers)}
        self._siblings = SiblingSlots()
        self.restarts = 0
        try:
            ray.get([a.__ray_ready__.remote() for a in self._actors.values()], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RuntimeError(
                f"{self.num_workers} Ray env worker(s) ({self.cpus_per_worker} CPU each) did not start within "
                f"{start_timeout_s:.0f} s; cluster resources free now: {ray.available_resources()}") from None

    def _dispatch(self, cmd: str, items: list) -> list[EnvResult]:
        send, results = self._siblings.answer_lost(cmd, items)
        by_worker: dict[int, list] = {}
        for it in send:
            by_worker.setdefault(it[0] % self.num_workers, []).append(it)
        futures = {w: getattr(self._actors[w], cmd).remote(its) for w, its in by_worker.items()}
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
                self._siblings.restarted(f"env actor {w}", self._slots[w], [it[0] for it in by_worker[w]], why)
                for it in by_worker[w]:
                    results[it[0]] = EnvResult(it[0], ok=False, error=f"env actor {w} {why}; restarted")
        self._siblings.record(results.values())
        return [results[it[0]] for it in items]

    def actor(self, slot: int) -> Any:
        """The Ray actor handle that runs `slot` (tests kill it)."""
        return self._actors[slot % self.num_workers]

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """See `EnvPool.reset`; a dead or hung actor's slots answer with errors (the actor is recreated)."""
        return self._dispatch("reset", items)

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """See `EnvPool.step`; a dead or hung actor's slots answer with errors (the actor is recreated)."""
        return self._dispatch("step", items)

    def close(self) -> None:
        """Close the actors' environments and kill the actors (the cluster keeps running)."""
        for a in self._actors.values():
            try:
                self._ray.get(a.close.remote(), timeout=10)
                self._ray.kill(a)
            except Exception:
                pass
        self._actors.clear()
