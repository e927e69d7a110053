"""Subprocess workers: each owns the environments of a share of the slots (the default pool).

Commands for different workers run in parallel; a worker steps its own environments in turn.
A worker that dies (segfault, OOM kill, a JVM taking the process down) is detected on the pipe,
restarted with fresh environments, and every command it had in flight is answered with an
error result, so those episodes are reported, never lost silently. A worker that does not answer
within `call_timeout_s` per env call it was sent (stopped, deadlocked, a hung engine) counts as hung (it
ticks after each env call, so that is `call_timeout_s` after its last tick, not the n × `call_timeout_s`
a whole answer of n slots gets) and is handled the same way: killed, restarted, its commands answered
with errors (a command larger than a pipe holds is sent from a thread, so one for a worker that does not
read it cannot block the trainer before that timeout starts; an answer must arrive whole within
`call_timeout_s` of its first bytes, so a worker stopped midway through sending a large one is handled
as a crash too, as is one whose answer's length header is corrupt, `_recv_within`). The restarted
worker's other slots had their envs rebuilt too: an episode under way on one of them is answered with an
error at its next step (`SiblingSlots`). The dispatch, restart and give-up rules are `WorkerPool`'s,
shared with the Ray pool.

A worker never outlives the trainer, even one hung in an env step when the trainer is SIGKILLed
(`_die_with_parent`): on Linux the kernel kills it (prctl PR_SET_PDEATHSIG), elsewhere, or when the
pool was started from a thread other than the main one or through a fork server, a watchdog thread
in the worker notices within `PARENT_POLL_S` that the trainer is gone and exits. What an env started itself is not killed
by this: an engine subprocess goes with the worker only if it watches it (the TextWorldExpress and
ScienceWorld JVMs exit when their stdin pipe from the worker closes, py4j's --die-on-broken-pipe;
ALFWorld and WebShop run inside the worker).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import signal
import struct
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from agentq.utils.process import set_pdeathsig

from .base import CALL_TIMEOUT_S, EnvSpec, Heard, WorkerCore, WorkerPool, hung_message

CLOSE_TIMEOUT_S = 10.0      # for all workers together to close their envs; then they are killed
PARENT_POLL_S = 0.5         # how often a worker's watchdog checks that the trainer still lives
SEND_INLINE_BYTES = 4096   # a command this small fits any empty pipe (macOS's holds 8 KiB); larger ones go by thread
MAX_READ = 2 ** 30          # bytes one os.readv asks for at most: macOS's fails (EINVAL) when its buffers sum past
                            # 32 bits (CPython caps its own reads likewise)
DEAF_S = 0.25               # the pool reading no worker's pipe for longer (a slow read of one message, a large
                            # answer unpickled) may have let a busy worker's pipe fill with ticks: the hang
                            # clocks start again where it listens again (`_answer`)
MAX_MESSAGE = 2 ** 34       # a length header past this (16 GiB) is corrupt: no env answer is that large, and the
                            # buffer is allocated before the first byte is read


def _trainer_gone(trainer_pid: int, direct_child: bool) -> Callable[[], bool]:
    """A check that the trainer has ended. A direct child asks whether it was re-parented (no pid
    reuse can fool that); a forkserver's worker, whose parent is the fork server (which the workers
    themselves keep alive), watches the trainer's pid through a pidfd (Linux ≥ 5.3), else by signal 0."""
    if direct_child:
        return lambda: os.getppid() != trainer_pid
    try:
        fd = os.pidfd_open(trainer_pid)
    except ProcessLookupError:
        return lambda: True
    except (AttributeError, OSError):          # no pidfds here: a recycled pid could fool this one
        def gone() -> bool:
            try:
                os.kill(trainer_pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
            return False
        return gone
    poller = select.poll()
    poller.register(fd, select.POLLIN)        # readable once the process has ended
    return lambda: bool(poller.poll(0))


def _watch_trainer(gone: Callable[[], bool]) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if gone():
            os._exit(1)                  # no clean-up: the main thread may be stuck in an env


def _die_with_parent(trainer_pid: int, direct_child: bool, pdeathsig: bool) -> None:
    """Make this worker end when the trainer dies, also by SIGKILL and while an env step hangs.

    Args:
        trainer_pid: the pid of the process that started the pool.
        direct_child: this worker is the trainer's child (spawn, fork), not a fork server's.
        pdeathsig: use PR_SET_PDEATHSIG. Linux sends it when the *thread* that started the worker
            ends, so the pool asks for it only from the main thread (a pool started from a short-lived
            thread would otherwise lose its workers) and only for direct children; the watchdog
            covers the rest.
    """
    if pdeathsig and direct_child:
        set_pdeathsig()
    gone = _trainer_gone(trainer_pid, direct_child)
    if gone():                          # the trainer died before prctl took effect: no signal will come
        os._exit(1)
    threading.Thread(target=_watch_trainer, args=(gone,), daemon=True, name="agentq-trainer-watch").start()


def _worker_main(conn: Connection, spec: EnvSpec, slots: list[int], trainer_pid: int, direct_child: bool,
                 pdeathsig: bool) -> None:
    """A worker process: build the slots' environments, then answer commands until "close" (or until
    the pool's end of the pipe closes); the envs are closed on the way out. It dies with the trainer
    (`_die_with_parent`)."""
    _die_with_parent(trainer_pid, direct_child, pdeathsig)
    # a terminal's Ctrl-C reaches the whole process group: the trainer takes it and closes the workers
    # (`close`); a worker that took it too broke off its env call midway (py4j logged a traceback each)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        core = WorkerCore(spec, slots)
    except Exception as e:
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    try:
        while True:
            cmd, payload = conn.recv()
            if cmd == "close":
                break
            # a tick after each slot's env call: the pool finds a hang one call_timeout_s after the last one
            conn.send(("ok", core.call(cmd, payload, lambda: conn.send(("tick", time.monotonic())))))
    except (EOFError, OSError):
        return
    finally:
        core.close()
    conn.send(("closed", None))


class ProcessPool(WorkerPool):
    """`EnvPool` over subprocess workers; slot s lives in worker s mod num_workers."""

    kind = "env worker"

    def __init__(self, spec: EnvSpec, num_envs: int, num_workers: int = 2, start_method: str = "spawn",
                 call_timeout_s: float = CALL_TIMEOUT_S, start_timeout_s: float = 600.0):
        """Start the workers and wait until each has built its environments.

        Args:
            spec: how to build each environment; num_envs: slots; num_workers: processes.
            start_method: multiprocessing start method ("spawn": no state inherited from the trainer).
            call_timeout_s: seconds one env call (one slot's reset or step) may take; a worker sent n
            calls is hung once one of them took longer (it ticks after each), or after n ×
            call_timeout_s without its whole answer.
            start_timeout_s: seconds a worker may take to build its environments.
        Raises:
            RuntimeError: a worker failed to start (none is left running).
        """
        self._procs: dict[int, tuple[Any, Connection]] = {}
        self._senders: dict[int, threading.Thread] = {}     # worker → the thread sending it a large command
        self._unreadable = (_Unfinished, _Garbled, EOFError, OSError)
        self._listened_at = 0.0     # when the pool last came out of waiting on the busy workers' pipes
        self._deaf_until = 0.0      # the end of the last stretch longer than DEAF_S in which it did not wait on them
        self._ctx: Any = mp.get_context(start_method)    # its Process/Pipe depend on the start method
        self._setup(spec, num_envs, num_workers, call_timeout_s, start_timeout_s)
        self._start_all()

    def _launch(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        # a forkserver's worker is the fork server's child, not ours; PDEATHSIG only from the main thread
        direct_child = self._ctx.get_start_method() != "forkserver"
        pdeathsig = threading.current_thread() is threading.main_thread()
        p = self._ctx.Process(target=_worker_main, args=(child, self.spec, self._slots[w], os.getpid(), direct_child,
                                                         pdeathsig),
                              daemon=True, name=f"agentq-env-{w}")
        self._procs[w] = (p, parent)
        p.start()
        child.close()

    def _await(self, w: int, timeout: float) -> str | None:
        p, conn = self._procs[w]
        try:
            status, msg = _recv_within(conn, timeout, self.call_timeout_s)
        except _Unfinished as late:
            status, msg = "failed", (f"no answer within {self.start_timeout_s:g} s (killed)" if late.size is None
                                     else f"stopped midway through its start message ({late}); killed")
        except _Garbled as e:
            status, msg = "failed", f"sent a corrupt start message ({e}); killed"
        except (EOFError, OSError):
            p.join(1)
            status, msg = "failed", f"it exited (exit code {p.exitcode})"
        if status == "ready":
            return None
        self._kill(w)
        return str(msg)

    def _kill(self, w: int) -> None:
        p, conn = self._procs[w]
        try:
            if p.is_alive():
                p.kill()
            p.join(10)
        except (AssertionError, ValueError, OSError):     # never started, or already closed
            pass
        self._heard.pop(w, None)
        sender = self._senders.pop(w, None)
        if sender is not None:          # its write fails once the worker is gone: never on a reused descriptor
            sender.join(10)
        conn.close()

    def _submit(self, w: int, cmd: str, blob: bytes) -> Any:
        conn = self._procs[w][1]
        if len(blob) > SEND_INLINE_BYTES:
            # more than the pipe holds: a worker that does not read (stopped, stuck) would block this send, and
            # the pool with it, before the wait for the answer and its call_timeout_s even began
            sender = threading.Thread(target=_send, args=(conn, (cmd, blob)), daemon=True, name=f"agentq-env-send-{w}")
            self._senders[w] = sender
            sender.start()
            return True
        return True if _send(conn, (cmd, blob)) else None

    def _answer(self, w: int, handle: Any, timeout: float, cmd: str, sent_at: float, n: int) -> tuple[bytes | None, str]:
        """As `WorkerPool._answer`; the worker ticks after each slot's env call (its clock is this one's:
        CLOCK_MONOTONIC is the host's), so a worker is hung once no call of its `n` finished within
        `call_timeout_s` of the last tick (or of the send), not only after n × `call_timeout_s`. While it
        waits on one worker the pool reads every busy worker's ticks (`_wait_for`): a pipe holds ~280,
        and a worker blocked sending one would start no next call until its turn came, so every
        worker's clock runs from its own last tick. Where the pool read no pipe for a while (`DEAF_S`),
        the clocks start again from then."""
        p, conn = self._procs[w]
        if handle is not None:
            heard = self._heard.pop(w, None) or Heard()
            last, ticks = max(sent_at, heard.last), heard.ticks
            overall = time.monotonic() + timeout
            try:
                if heard.failure is not None:
                    raise heard.failure
                if heard.ended:
                    return heard.answer, ""
                while True:
                    self._note_deaf_stretch()
                    wait_s = min(overall, self._clock(last) + self.call_timeout_s) - time.monotonic()
                    if not self._wait_for(w, conn, max(0.0, wait_s)):
                        raise _Unfinished()
                    status, payload = _recv_within(conn, 0.0, self.call_timeout_s)
                    if status != "tick":
                        return payload, ""
                    last, ticks = max(last, float(payload)), ticks + 1
            except _Unfinished as late:
                if late.size is None:
                    if n == 1 or self._clock(last) + self.call_timeout_s >= overall:
                        return None, "hung"         # the whole budget: `_exchange` says so
                    return None, hung_message(cmd, n, ticks, self.call_timeout_s)
                return None, (f"stopped midway through its answer to {cmd}: {late}, the rest not within "
                              f"{self.call_timeout_s:g} s (env_pool.call_timeout_s={self.call_timeout_s:g}); killed")
            except _Garbled as e:           # its end of the pipe is not to be trusted: handled as a crash
                return None, f"sent a corrupt answer to {cmd} ({e}); killed"
            except (EOFError, OSError):
                pass
        p.join(1)
        return None, f"died (exit code {p.exitcode if p.exitcode is not None else 'unknown'})"

    def _note_deaf_stretch(self) -> None:
        """Called as the pool turns back to its workers' pipes: if it read none for over `DEAF_S`, every
        busy worker's clock starts again from now (`_clock`)."""
        if time.monotonic() - self._listened_at > DEAF_S:
            self._deaf_until = time.monotonic()

    def _clock(self, last: float) -> float:
        """Where a busy worker's wait for its next call starts: its last tick (or the send), or the end of
        the pool's last stretch of not reading (its ticks may have filled its pipe then)."""
        return max(last, self._deaf_until)

    def _wait_for(self, w: int, conn: Connection, wait_s: float) -> bool:
        """Wait up to `wait_s` until worker `w` has something to read (True) or not (False), reading
        meanwhile whatever the other workers still owing an answer send (`_hear`)."""
        deadline = time.monotonic() + wait_s
        while True:
            others: dict[Any, int] = {self._procs[v][1]: v for v in self._pending
                                      if v != w and v in self._procs and not self._procs[v][1].closed
                                      and not self._heard.get(v, Heard()).ended}
            self._note_deaf_stretch()
            ready = wait([conn, *others], max(0.0, deadline - time.monotonic()))
            self._listened_at = time.monotonic()
            for c in ready:
                if c is not conn:
                    self._hear(others[c])
            if conn in ready:
                return True
            if not ready:
                return False

    def _read_next(self, v: int) -> tuple[str, Any]:
        return _recv_within(self._procs[v][1], 0.0, self.call_timeout_s)

    def _note_tick(self, heard: Heard, payload: Any) -> None:
        # the worker's own clock is this one's (CLOCK_MONOTONIC is the host's); a tick after each call
        heard.last, heard.ticks = max(heard.last, float(payload)), heard.ticks + 1

    def worker_pid(self, slot: int) -> int:
        """The process id of the worker that runs `slot` (tests kill it)."""
        return self._procs[slot % self.num_workers][0].pid

    def close(self) -> None:
        """Ask every worker to close its environments (`CLOSE_TIMEOUT_S` for all together), then kill
        those still running, also when this is interrupted: no worker outlives the pool."""
        senders = {w: t for w, t in self._senders.items() if t.is_alive()}     # their pipes are full: never written
        procs = [proc for w, proc in self._procs.items() if w not in senders]
        stuck = [proc for w, proc in self._procs.items() if w in senders]       # killed below
        self._procs, self._senders, self._heard = {}, {}, {}
        try:
            for _, conn in procs:
                _send(conn, ("close", None))
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            for p, conn in procs:
                _await_closed(conn, deadline)
                if p.is_alive():
                    p.join(max(0.0, deadline - time.monotonic()))
        finally:
            for p, conn in procs + stuck:
                if p.is_alive():
                    p.kill()
                    p.join(5)
            for sender in senders.values():     # a dead worker's pipe fails the write: it ends before the pipe closes
                sender.join(5)
            for _, conn in procs + stuck:
                conn.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _send(conn: Connection, message: tuple) -> bool:
    """Send `message` to a worker; False when its pipe is gone (a dead worker, or one closed after a failed start)."""
    try:
        conn.send(message)
        return True
    except (OSError, ValueError):
        return False


def _await_closed(conn: Connection, deadline: float) -> None:
    """Read a closing worker's messages (an interrupted call's answer may come first) until "closed"."""
    try:
        while True:
            left = max(0.0, deadline - time.monotonic())
            if _recv_within(conn, left, left)[0] == "closed":
                return
    except (_Unfinished, _Garbled, EOFError, OSError, ValueError):
        pass


class _Unfinished(Exception):
    """A worker's message did not come in time: nothing of it (`size` None), or only `got` of `size` bytes."""

    def __init__(self, got: int = 0, size: int | None = None):
        super().__init__(f"{got} of {size} bytes came")
        self.got, self.size = got, size


class _Garbled(Exception):
    """A worker's message is not one: its length header is negative (the pipe's bytes are corrupt)."""


def _recv_within(conn: Connection, wait_s: float, rest_s: float) -> Any:
    """`conn.recv()` with bounds: the message must start within `wait_s` and be whole within `rest_s` of
    that. `Connection.recv` waits without bound for the rest of a message once its first bytes came, so a
    worker stopped midway through sending a large answer blocked the pool for good. This reads the same
    frame as `Connection.recv_bytes` (a "!i" length, -1 then a "!Q" one for over 2 GiB; CPython's wire
    format, kept for compatibility) and unpickles it as `recv` does.

    Raises:
        _Unfinished: nothing, or part of a message, came in time (the worker must then be killed: the
            connection is midway through a message). EOFError: the worker's end closed (it died).
        _Garbled: a length that is negative or past `MAX_MESSAGE`, or bytes that do not unpickle (the
            pipe is corrupt: the worker must be killed too).
    """
    if not conn.poll(wait_s):
        raise _Unfinished()
    deadline = time.monotonic() + rest_s
    (size,) = struct.unpack("!i", _read_exactly(conn, 4, deadline))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exactly(conn, 8, deadline))
    if not 0 <= size <= MAX_MESSAGE:        # allocated before its first byte: a corrupt one must not be
        raise _Garbled(f"a length header of {size} bytes")
    data = _read_exactly(conn, size, deadline)
    try:
        return pickle.loads(data)
    except Exception as e:          # whatever unpickling garbage raises (UnpicklingError, EOFError, KeyError, ...)
        raise _Garbled(f"{size} bytes that do not unpickle ({type(e).__name__})") from None


def _read_exactly(conn: Connection, n: int, deadline: float) -> bytearray:
    """`n` bytes from the connection, each read waiting only while `deadline` allows (a read after
    `poll` says readable returns what is there without blocking) and asking for at most `MAX_READ`."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise _Unfinished(got, n)
        k = os.readv(conn.fileno(), [view[got:got + MAX_READ]])
        if k == 0:
            raise EOFError
        got += k
    return buf
