"""Subprocess workers: each owns the environments of a share of the slots (the default pool).

Commands for different workers run in parallel; a worker steps its own environments in turn.
A worker that dies (segfault, OOM kill, a JVM taking the process down) is detected on the pipe,
restarted with fresh environments, and every command it had in flight is answered with an
error result, so those episodes are reported, never lost silently. A worker that does not answer
within `call_timeout_s` per env call it was sent (stopped, deadlocked, a hung engine) counts as
hung and is handled the same way: killed, restarted, its commands answered with errors. The
restarted worker's other slots had their envs rebuilt too: an episode under way on one of them is
answered with an error at its next step (`SiblingSlots`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing.connection import Connection
from typing import Any, Sequence

from .base import EnvResult, EnvSpec, SiblingSlots, WorkerCore


def _worker_main(conn: Connection, spec: EnvSpec, slots: list[int]) -> None:
    """A worker process: build the slots' environments, then answer commands until "close"."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        core = WorkerCore(spec, slots)
        conn.send(("ready", None))
    except Exception as e:
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            cmd, payload = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            core.close()
            conn.send(("closed", None))
            break
        conn.send(("ok", getattr(core, cmd)(payload)))


class ProcessPool:
    """`EnvPool` over subprocess workers; slot s lives in worker s mod num_workers."""

    def __init__(self, spec: EnvSpec, num_envs: int, num_workers: int = 2, start_method: str = "spawn",
                 call_timeout_s: float = 120.0, start_timeout_s: float = 600.0):
        """Start the workers and wait until each has built its environments.

        Args:
            spec: how to build each environment; num_envs: slots; num_workers: processes.
            start_method: multiprocessing start method ("spawn": no state inherited from the trainer).
            call_timeout_s: seconds one env call (one slot's reset or step) may take; a worker sent n
            calls is hung after n × call_timeout_s without an answer.
        start_timeout_s: seconds a worker may take to build its environments.
        """
        if num_workers < 1:
            raise ValueError("env_pool.num_workers must be ≥ 1")
        if not call_timeout_s > 0:
            raise ValueError(f"env_pool.call_timeout_s must be > 0, got {call_timeout_s!r}")
        self.call_timeout_s, self.start_timeout_s = float(call_timeout_s), float(start_timeout_s)
        self.spec, self.num_envs = spec, num_envs
        self.num_workers = min(num_workers, num_envs)
        self._ctx: Any = mp.get_context(start_method)    # its Process/Pipe depend on the start method
        self._slots = {w: [s for s in range(num_envs) if s % self.num_workers == w] for w in range(self.num_workers)}
        self._procs: dict[int, tuple] = {}
        self._siblings = SiblingSlots()
        self.restarts = 0
        for w in range(self.num_workers):
            self._start(w, wait=False)
        for w in range(self.num_workers):
            self._await_ready(w)

    def _start(self, w: int, wait: bool = True) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_worker_main, args=(child, self.spec, self._slots[w]), daemon=True,
                              name=f"agentq-env-{w}")
        p.start()
        child.close()
        self._procs[w] = (p, parent)
        if wait:
            self._await_ready(w)

    def _await_ready(self, w: int) -> None:
        p, conn = self._procs[w]
        try:
            if conn.poll(self.start_timeout_s):
                status, msg = conn.recv()
            else:
                p.kill()
                status, msg = "failed", f"no answer within {self.start_timeout_s:g} s (killed)"
        except EOFError:
            status, msg = "failed", f"exit code {p.exitcode}"
        if status != "ready":
            raise RuntimeError(f"env worker {w} failed to start ({self.spec.name}): {msg}")

    def worker_pid(self, slot: int) -> int:
        """The process id of the worker that runs `slot` (tests kill it)."""
        return self._procs[slot % self.num_workers][0].pid

    def _dispatch(self, cmd: str, items: Sequence[tuple[int, object]]) -> list[EnvResult]:
        send, results = self._siblings.answer_lost(cmd, items)
        by_worker: dict[int, list] = {}
        for it in send:
            by_worker.setdefault(it[0] % self.num_workers, []).append(it)
        sent = []
        for w, its in by_worker.items():
            p, conn = self._procs[w]
            try:
                conn.send((cmd, its))
                sent.append((w, its, True))
            except (BrokenPipeError, OSError):
                sent.append((w, its, False))
        t0 = time.monotonic()
        for w, its, ok in sent:
            p, conn = self._procs[w]
            reply, hung = None, False
            if ok:
                # every worker started at t0, so each gets its own budget counted from then
                wait = t0 + self.call_timeout_s * len(its) - time.monotonic()
                try:
                    if conn.poll(max(0.0, wait)):
                        status, reply = conn.recv()
                    else:
                        hung = True
                except (EOFError, ConnectionResetError, OSError):
                    reply = None
            if reply is None:           # the worker died or hung: restart it, report its commands as errors
                why = (f"hung: no answer to {cmd} of {len(its)} slot(s) within {self.call_timeout_s * len(its):g} s "
                       f"(env_pool.call_timeout_s={self.call_timeout_s:g}); killed" if hung
                       else f"died (exit code {p.exitcode if not p.is_alive() else 'unknown'})")
                self._restart(w, [it[0] for it in its], why)
                for it in its:
                    results[it[0]] = EnvResult(it[0], ok=False, error=f"env worker {w} {why}; restarted")
            else:
                for r in reply:
                    results[r.slot] = r
        self._siblings.record(results.values())
        return [results[it[0]] for it in items]

    def _restart(self, w: int, in_call: list[int], why: str) -> None:
        """Kill worker `w` (if alive) and start it again; its live slots outside the call are lost."""
        p, _ = self._procs[w]
        try:
            p.kill()
            p.join(timeout=10)
        except Exception:
            pass
        self.restarts += 1
        self._start(w)
        self._siblings.restarted(f"env worker {w}", self._slots[w], in_call, why)

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """See `EnvPool.reset`; a dead or hung worker's slots answer with errors (the worker restarts)."""
        return self._dispatch("reset", items)

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """See `EnvPool.step`; a dead or hung worker's slots answer with errors (the worker restarts)."""
        return self._dispatch("step", items)

    def close(self) -> None:
        """Ask every worker to close its environments; kill those that do not exit."""
        for w, (p, conn) in list(self._procs.items()):
            try:
                conn.send(("close", None))
                if conn.poll(10):
                    conn.recv()
            except Exception:
                pass
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        self._procs.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
