"""The error a run stops itself with, in the bottom layer so that every layer can raise it and the
CLI print it in one line (`agentq: run stopped: ...`, exit status 1)."""
from __future__ import annotations

from typing import Callable


class RunAborted(RuntimeError):
    """The run stopped itself because continuing could not produce anything useful."""


def give_up_if_failing(limit: int, failed_starts: dict[int, int], down: dict[int, str],
                       failed_calls: dict[tuple[int, str], tuple[int, str]], name: Callable[[int], str]) -> None:
    """The give-up rule the env pools and the distributed rollout backend share: raise RunAborted for
    a worker that failed `limit` starts in a row (`failed_starts`, the last cause in `down`) or died or
    hung in `limit` calls of one command in a row (`failed_calls`: (worker, command) → (count, last
    cause)). `name(w)` is how the message names worker w."""
    for w, n in failed_starts.items():
        if n >= limit:
            raise RunAborted(f"{name(w)} could not be started {n} times in a row; giving up: {down.get(w)}")
    for (w, cmd), (n, why) in failed_calls.items():
        if n >= limit:
            raise RunAborted(f"{name(w)} died or hung in {n} {cmd} calls in a row without completing one "
                             f"(restarted after each); giving up: {why}")


__all__ = ["RunAborted", "give_up_if_failing"]
