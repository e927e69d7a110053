"""Environment pools (in-process, subprocess workers, Ray actors) behind one interface."""
from __future__ import annotations

from typing import Any

from .base import EnvPool, EnvResult, EnvSpec, InlinePool, WorkerCore

POOL_TYPES = ("inline", "process", "ray")


def make_pool(kind: str, spec: EnvSpec, num_envs: int, num_workers: int = 2, **kw: Any) -> EnvPool:
    """Build a pool of `num_envs` env slots.

    Args:
        kind: "inline" (this process), "process" (subprocess workers) or "ray" (Ray actors).
        spec: how to build each environment.
        num_envs: env slots (episodes that can run at once).
        num_workers: workers the slots are spread over (process, ray).
        kw: the pool's own options (`call_timeout_s`, `address`, ...).
    Returns:
        The pool; close it when done.
    """
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
