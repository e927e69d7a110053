"""What the Ray env pool (`agentq.pool.ray_pool`), the distributed rollout backend
(`agentq.rollout.distributed`) and the data-parallel learner do alike with their actors: wait for one
to be built, kill one that may be hung, name a Ray error by its last line, and say how an actor died.
Ray is passed in (the module imports it lazily)."""
from __future__ import annotations

from typing import Any

from agentq.utils.errors import first_line


def last_line(e: BaseException) -> str:
    """The last line of an error's text (a Ray error carries the remote traceback before it)."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(e).__name__


def actor_death(ray: Any, e: BaseException) -> str:
    """How a Ray call found its actor dead: the error's name, with the node's memory for Ray's memory
    monitor (the first line of its error; the rest is advice)."""
    if isinstance(e, ray.exceptions.OutOfMemoryError):
        return f"killed by Ray's memory monitor: OutOfMemoryError: {first_line(e)}"
    return type(e).__name__


def kill_actor(ray: Any, actor: Any) -> None:
    """`ray.kill` that never raises: also for an actor that is unreachable but alive, or already gone."""
    try:
        ray.kill(actor)
    except Exception:
        pass


def actor_start_problem(ray: Any, actor: Any, timeout: float, limit: str) -> str | None:
    """Wait up to `timeout` s for `actor` to be built.

    Args:
        ray: the ray module; actor: the actor's handle.
        timeout: seconds to wait (0 for a deadline already past).
        limit: the limit waited for, as the message names it ("30 s (placement.timeout_s)").
    Returns:
        None when it is up; else why not (its constructor's error, its death, or the timeout with the
        cluster's free resources). Such an actor is killed: a pending one would otherwise take its
        resources whenever they free up.
    """
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=timeout)
        return None
    except ray.exceptions.GetTimeoutError:
        problem = f"not started within {limit}; cluster resources free now: {ray.available_resources()}"
    except ray.exceptions.RayError as e:      # its constructor raised, or it died
        problem = last_line(e)
    kill_actor(ray, actor)
    return problem


__all__ = ["actor_death", "actor_start_problem", "kill_actor", "last_line"]
