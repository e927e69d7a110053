"""Ray actors as environment workers (`env_pool=ray`): the same commands as the subprocess pool,
for spreading environments over a Ray cluster. A dead actor is recreated and its in-flight
commands are answered with error results."""
from __future__ import annotations

from .base import EnvResult, EnvSpec, WorkerCore


class RayPool:
    def __init__(self, spec: EnvSpec, num_envs: int, num_workers: int = 2, address: str | None = None,
                 num_cpus_per_worker: float = 1.0):
        import ray

        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     ignore_reinit_error=True, configure_logging=False)
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
        for w, fut in futures.items():
            try:
                for r in self._ray.get(fut):
                    results[r.slot] = r
            except self._ray.exceptions.RayActorError as e:
                self.restarts += 1
                self._actors[w] = self._actor_cls.remote(self.spec, self._slots[w])
                for it in by_worker[w]:
                    results[it[0]] = EnvResult(it[0], ok=False, error=f"env actor {w} died ({type(e).__name__}); restarted")
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
