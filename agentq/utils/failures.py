"""The give-up rule of the env pools (`agentq.pool.base.WorkerPool`) and the distributed rollout
backend (`agentq.rollout.distributed.DistributedBackend`), kept once: each counts, per worker, its
failed starts in a row and the calls of each command in a row it died or hung in, and ends the run
(`RunAborted`) once a count reaches its limit, so no worker is restarted for good.

    failures = FailureCounts(limit=3, name=lambda w: f"env worker {w}")
    failures.call_failed(w, "step", "died (exit code 3)")     # the call's answer never came
    failures.start_ended(w, problem)                           # its restart: None (up) or why not
    failures.raise_if_given_up()                               # once the call's results are in
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from agentq.utils.errors import RunAborted


@dataclass
class FailureCounts:
    """Per-worker counts of failures in a row, and the rule that gives up on them.

    Each command is counted on its own: a completed `step` starts the count of `step`s again, while
    the resets a restarted worker completes between its deaths in steps do not (an agent loop's
    reset, step, ... would otherwise keep the count at 1 and restart a worker dying at every step
    for good).

    Args:
        limit: failed starts, or calls of one command, in a row that end the run.
        name: how messages name worker w ("env worker 1 (fault_env:FaultEnv)", "rollout worker 1").
    """

    limit: int
    name: Callable[[int], str]
    failed_starts: dict[int, int] = field(default_factory=dict)     # worker → failed starts in a row
    down: dict[int, str] = field(default_factory=dict)              # worker → why its last start failed
    # (worker, command) → (calls of that command it died / hung in, in a row; the last why)
    failed_calls: dict[tuple[int, str], tuple[int, str]] = field(default_factory=dict)

    def start_ended(self, w: int, problem: str | None) -> None:
        """Record how a (re)start of worker `w` went.

        Args:
            w: the worker.
            problem: None when it is up; else why it could not start (it is down until a start works).
        """
        if problem is None:
            self.failed_starts.pop(w, None)
            self.down.pop(w, None)
        else:
            self.failed_starts[w] = self.failed_starts.get(w, 0) + 1
            self.down[w] = problem

    def call_completed(self, w: int, cmd: str) -> None:
        """Worker `w` answered a call of `cmd` (also with an error raised inside it): that count starts again."""
        self.failed_calls.pop((w, cmd), None)

    def call_failed(self, w: int, cmd: str, why: str) -> None:
        """Worker `w` died or hung in a call of `cmd` (`why`, the last cause the give-up message names)."""
        self.failed_calls[w, cmd] = (self.failed_calls.get((w, cmd), (0, ""))[0] + 1, why)

    def raise_if_given_up(self) -> None:
        """End the run for a worker whose failures in a row reached `limit` (call it once the call's
        results are in and its dead workers restarted, so nothing is left half done).

        Raises:
            RunAborted: a worker failed `limit` starts in a row, or died or hung in `limit` calls of
            one command in a row; the message names the worker, the count and the last cause.
        """
        for w, n in self.failed_starts.items():
            if n >= self.limit:
                raise RunAborted(f"{self.name(w)} could not be started {n} times in a row; giving up: "
                                 f"{self.down.get(w)}")
        for (w, cmd), (n, why) in self.failed_calls.items():
            if n >= self.limit:
                raise RunAborted(f"{self.name(w)} died or hung in {n} {cmd} calls in a row without completing one "
                                 f"(restarted after each); giving up: {why}")


__all__ = ["FailureCounts"]
