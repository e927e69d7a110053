"""Environment pools (in-process, subprocess workers, Ray actors) behind one interface."""
from __future__ import annotations

from .base import EnvPool, EnvResult, EnvSpec, InlinePool, WorkerCore

POOL_TYPES = ("inline", "process", "ray")


def make_pool(kind: str, spec: EnvSpec, num_envs: int, num_workers: int = 2, **kw) -> EnvPool:
    if kind == "inline":
        return InlinePool(spec, num_envs)
    if kind == "process":
        from .process import ProcessPool
        return ProcessPool(spec, num_envs, num_workers=num_workers, **kw)
    if kind == "ray":
        from .ray_pool import RayPool
        return RayPool(spec, num_envs, num_workers=num_workers, **kw)
    raise ValueError(f"unknown env_pool type {kind!r}; valid: {list(POOL_TYPES)}")


__all__ = ["EnvPool", "EnvResult", "EnvSpec", "InlinePool", "POOL_TYPES", "WorkerCore", "make_pool"]
