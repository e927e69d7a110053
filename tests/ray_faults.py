"""Helpers of the tests that kill Ray actors: a kill that has landed, and calls answered as Ray answers
them after its memory monitor killed the actor."""
from __future__ import annotations

from typing import Any

import pytest

#: Ray's error for every call to an actor that its memory monitor killed (Ray 2.60's text, its advice cut short)
OOM = ("1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 127.0.0.1, ID: "
       "9f3e0c) was 3.07GB used / 23.54GB limit (0.130294)\nOOM kill reason: Memory usage 3301621760B exceeded "
       "threshold of 3138000000B\nRefer to the documentation on how to address the out of memory issue: ... To "
       "disable worker killing, set the environment variable `RAY_memory_monitor_refresh_ms` to zero.")


def kill(ray: Any, actor: Any) -> None:
    """ray.kill `actor` and wait until it is dead: the kill lands asynchronously, and a call sent at once
    may still run on the actor."""
    ray.kill(actor)
    with pytest.raises(ray.exceptions.RayActorError):
        while True:
            ray.get(actor.__ray_ready__.remote(), timeout=30)


def dead_actors_answer_oom(ray: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on a call to a dead actor raises OutOfMemoryError(`OOM`), as Ray answers every call to an
    actor that its memory monitor killed (no RayActorError; tests/distributed/test_ray_oom_kills.py sees
    it with the monitor itself)."""
    get = ray.get

    def as_ray_answers_an_oom_killed_actor(*args: Any, **kw: Any) -> Any:
        try:
            return get(*args, **kw)
        except ray.exceptions.ActorDiedError:
            raise ray.exceptions.OutOfMemoryError(OOM) from None
    monkeypatch.setattr(ray, "get", as_ray_answers_an_oom_killed_actor)
