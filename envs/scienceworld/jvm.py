"""One heap-capped ScienceWorld JVM per worker process, shared by every env in that process.

The `scienceworld` package starts a JVM per `ScienceWorldEnv` with Java's default heap cap (a
quarter of the machine's RAM; one JVM was measured at 2.8 GB RSS). Here a process owns one JVM
per (heap cap, JVM options, simplifications, call timeout) key; each env gets its own simulator object
(`PythonInterface`) inside it.

Why simplifications are part of the key: the simulator keeps the active simplifications in a
JVM-wide singleton, so two envs (or two tasks of one env, see `tasks.simplifications_for`) loading
with different simplifications must not share a JVM; the env asks for the host of the flags each
task loads with.

All calls into one JVM are serialised by a lock: the simulator also keeps JVM-wide state (the
random generator and the object-id counter are reset by every `load`), so a load in one thread
must not interleave with a step in another.

Crashes: if the JVM process exits (killed, out of memory with `-XX:+ExitOnOutOfMemoryError`)
or stops answering within `call_timeout_s`, the call raises `EnvCrashedError`, the host is marked
dead, and the next `JVMHost.get()` (done by every `reset()`) starts a fresh JVM with a new
`generation`. Simulators created in an older generation are invalid: their envs' next step raises
`EnvCrashedError`, which ends the episode (`TextEnv.step`), until they are reset.
"""
from __future__ import annotations

import atexit
import collections
import os
import subprocess
import threading
import time
from typing import Any, Callable, TypeVar

from agentq.utils.process import dies_with_this_process

from ..base import EnvCrashedError
from ..jvm_start import first_line, java_executable, silence_client

T = TypeVar("T")

#: JVM options added to every launch (-Xmx comes from `heap`, -Xms from INITIAL_HEAP).
BASE_JAVA_OPTS = (
    "-XX:+UseSerialGC",              # 2-core workers: no parallel GC threads, least overhead
    "-XX:MinHeapFreeRatio=10",       # grow the heap only as needed and give memory back after
    "-XX:MaxHeapFreeRatio=40",       #   spikes (8 envs: 270 MB RSS instead of 480 MB, same speed)
    "-XX:+ExitOnOutOfMemoryError",   # an OOM kills the JVM, which we detect and restart
)
INITIAL_HEAP = 64 * 2**20           # -Xms (Java's default is 1/64 of RAM, touched at once)

_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(size: str | int) -> int:
    """Bytes of a Java memory size ("1g", "768m", "1048576"); ValueError if malformed."""
    text = str(size).strip().lower()
    num, unit = (text[:-1], text[-1]) if text and text[-1] in _SIZE_UNITS else (text, "")
    if not num.isdigit() or int(num) <= 0:
        raise ValueError(f"bad JVM memory size {size!r}; use e.g. '1g', '768m' or a number of bytes")
    return int(num) * _SIZE_UNITS[unit]


def _classpath() -> tuple[str, str]:
    from py4j.java_gateway import find_jar_path
    from scienceworld.constants import BASEPATH, JAR_PATH
    py4j_jar = find_jar_path()
    parts = [p for p in (py4j_jar, JAR_PATH) if p and os.path.exists(p)]
    return os.pathsep.join(parts), BASEPATH


# Seconds one JVM call may take before the JVM counts as hung. Below the env pool's own limit per env call
# (agentq.pool.base.CALL_TIMEOUT_S, 120 s), so that this handler, which restarts only the JVM and names the
# call, fires before the pool kills the whole worker.
CALL_TIMEOUT_S = 100.0


class JVMHost:
    """A ScienceWorld JVM (py4j gateway) shared by the envs of one process."""

    _registry: dict[tuple, "JVMHost"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, heap: str = "1g", java_opts: tuple[str, ...] = (), simplifications: str = "",
                 call_timeout_s: float = CALL_TIMEOUT_S):
        parse_size(heap)
        self.heap = str(heap)
        self.java_opts = tuple(java_opts)
        self.simplifications = simplifications
        self.call_timeout_s = float(call_timeout_s)
        self.lock = threading.RLock()
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.gateway = None
        self.refs = 0
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self.stdout_tail: collections.deque[str] = collections.deque(maxlen=4)   # HotSpot's OOM notice lands here
        self._dead_reason: str | None = "not started"
        self._stderr_thread: threading.Thread | None = None
        self._stdout_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ registry
    @classmethod
    def get(cls, heap: str = "1g", java_opts=(), simplifications: str = "", call_timeout_s: float = CALL_TIMEOUT_S,
            start: bool = True) -> "JVMHost":
        """The process's host for these options; started (or restarted after a crash) if `start`."""
        key = (os.getpid(), heap, tuple(java_opts), simplifications, float(call_timeout_s))
        with cls._registry_lock:
            host = cls._registry.get(key)
            if host is None:
                host = cls._registry[key] = JVMHost(heap, tuple(java_opts), simplifications, call_timeout_s)
        if start:
            host.ensure_alive()
        return host

    @classmethod
    def hosts(cls) -> list["JVMHost"]:
        pid = os.getpid()
        return [h for k, h in cls._registry.items() if k[0] == pid]

    # ------------------------------------------------------------------ lifecycle
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self._dead_reason is None and self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        classpath, _ = _classpath()
        xms = min(INITIAL_HEAP, parse_size(self.heap))
        return [java_executable("ScienceWorld", 11), f"-Xmx{self.heap}", f"-Xms{xms // 2**10}k", *BASE_JAVA_OPTS,
                *self.java_opts, "-classpath", classpath, "py4j.GatewayServer", "--die-on-broken-pipe", "0"]

    def ensure_alive(self) -> None:
        with self.lock:
            if self.alive():
                return
            self._stop_process()
            self._start()

    def _start(self) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway
        _, cwd = _classpath()
        t0 = time.perf_counter()
        cmd = self.command()
        # stdin: the JVM exits when this process dies (--die-on-broken-pipe), once its main runs;
        # before that (a slow or suspended start) only the kernel's parent-death signal ends it, where
        # this is the main thread (a pool's worker, the trainer). stdout: first line
        # is the port, then the simulator's chatter (it prints every step), drained in bulk.
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, bufsize=0, start_new_session=True, preexec_fn=dies_with_this_process())
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None   # all PIPE
        # stderr drained from the start: a JVM that writes much there before its port would block
        self.stderr_tail.clear()
        self.stdout_tail.clear()
        self._stderr_thread = threading.Thread(target=_drain, args=(proc.stderr, self.stderr_tail), daemon=True,
                                               name=f"sw-jvm-{proc.pid}-stderr")
        self._stderr_thread.start()
        # bounded: a JVM that never prints its port (suspended, stopped) would hang every env here
        line = first_line(proc, self.call_timeout_s, "the ScienceWorld JVM",
                          "call_timeout_s (env.kwargs.call_timeout_s)")
        if not line.strip().isdigit():
            proc.kill()
            proc.wait()
            self._stderr_thread.join(timeout=5)       # EOF once the JVM is gone
            raise RuntimeError(f"ScienceWorld JVM failed to start ({' '.join(cmd)}): "
                               f"{line.decode(errors='replace')!r} {''.join(self.stderr_tail)[-2000:]}")
        port = int(line)
        self._stdout_thread = threading.Thread(target=_drain, args=(proc.stdout, self.stdout_tail), daemon=True,
                                               name=f"sw-jvm-{proc.pid}-stdout")
        self._stdout_thread.start()
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(
            port=port, auto_convert=False, auto_field=False, read_timeout=self.call_timeout_s))
        self.proc = proc
        self.generation += 1
        self._dead_reason = None
        self.start_time_s = time.perf_counter() - t0

    def _disconnect_gateway(self) -> None:
        """Mark the py4j client disconnected (`silence_client`: the simulators and Java lists it
        made send nothing when collected), then close it; once the JVM is stopped or dead."""
        gw, self.gateway = self.gateway, None
        if gw is None:
            return
        silence_client(gw)
        try:
            gw.close(keep_callback_server=False, close_callback_server_connections=False)
        except Exception:
            pass

    def _stop_process(self) -> None:
        proc = self.proc
        self._disconnect_gateway()
        if proc is not None:
            for f in (proc.stdin,):
                try:
                    if f is not None:
                        f.close()   # broken pipe: the JVM exits by itself
                except Exception:
                    pass
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def shutdown(self) -> None:
        with self.lock:
            self._stop_process()
            self._dead_reason = "shut down"

    def acquire(self) -> None:
        with self.lock:
            self.refs += 1

    def release(self) -> None:
        """Drop one env's reference; the JVM is stopped when no env uses it any more."""
        with self.lock:
            self.refs = max(0, self.refs - 1)
            if self.refs == 0:
                self.shutdown()

    # ------------------------------------------------------------------ calls
    def new_simulator(self):
        return self.call(lambda gw: gw.jvm.scienceworld.runtime.pythonapi.PythonInterface())

    def call(self, fn: Callable[[Any], T], generation: int | None = None) -> T:
        """Run `fn(gateway)` under the JVM lock; a dead or hung JVM becomes `EnvCrashedError`.

        `generation`: the generation the caller's simulator was made in; if the JVM has been
        restarted since, the simulator is gone and the call fails without touching the JVM.
        """
        from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError
        with self.lock:
            if not self.alive():
                # an env whose JVM died between calls may never be closed or restarted: its Java
                # objects must not reach for the dead port when they are collected (`_disconnect_gateway`)
                self._disconnect_gateway()
                raise EnvCrashedError(self._crash_message())
            if generation is not None and generation != self.generation:
                raise EnvCrashedError(
                    f"the ScienceWorld JVM was restarted (generation {generation} -> {self.generation}) "
                    "since this episode began; the episode is lost, call reset()")
            try:
                return fn(self.gateway)
            except Py4JJavaError:
                raise                                     # a Java exception: the JVM itself is fine
            except (Py4JNetworkError, Py4JError, OSError) as e:
                if self.proc is not None:
                    try:                      # a JVM that is exiting (e.g. after an OOM) needs a moment
                        self.proc.wait(timeout=1.0)
                    except subprocess.TimeoutExpired:
                        pass
                if self.proc is not None and self.proc.poll() is None:
                    # Still running but not answering (timeout or broken socket): treat as dead.
                    self._dead_reason = f"JVM stopped answering ({type(e).__name__}: {e})"
                    self.proc.kill()
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    self._dead_reason = "JVM process exited"
                self._disconnect_gateway()
                raise EnvCrashedError(self._crash_message()) from e

    def _crash_message(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        if code is not None:
            for t in (self._stdout_thread, self._stderr_thread):
                if t is not None:
                    t.join(timeout=1.0)       # collect the JVM's last words (e.g. the OOM notice)
        out = "\n".join("".join(self.stdout_tail).strip().splitlines()[-3:])
        err = "".join(self.stderr_tail)[-1500:].strip()
        return (f"ScienceWorld JVM (pid {self.pid}, -Xmx{self.heap}) is dead: {self._dead_reason or 'exited'}"
                f" (exit code {code}); the episode in flight is lost and the next reset() restarts the JVM"
                + (f"\nJVM stderr:\n{err}" if err else "") + (f"\nJVM stdout (last lines):\n{out}" if out else ""))

    # ------------------------------------------------------------------ memory
    def rss_bytes(self) -> int:
        """Resident memory of the JVM process (0 if not running)."""
        if not self.alive() or self.proc is None:
            return 0
        pid = self.proc.pid
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            import psutil
            return psutil.Process(pid).memory_info().rss
        except Exception:
            return 0


def _drain(stream, tail: collections.deque | None) -> None:
    """Read a pipe until EOF in large chunks (keeps the JVM from blocking on a full pipe)."""
    try:
        while True:
            chunk = os.read(stream.fileno(), 1 << 16)
            if not chunk:
                break
            if tail is not None:
                tail.append(chunk.decode(errors="replace"))
    except (OSError, ValueError):
        pass


def _shutdown_all() -> None:
    for host in JVMHost.hosts():
        try:
            host.shutdown()
        except Exception:
            pass


_inherited: list = []


def _forget_in_child() -> None:
    # A forked child must not talk to its parent's JVMs, nor keep them alive: forget them, close
    # the child's copy of their stdin pipes (so a parent's JVM still dies with the parent), and keep
    # the objects referenced so that garbage collection never shuts down the shared sockets.
    _inherited.extend(JVMHost._registry.values())
    for host in _inherited:
        if host.proc is not None and host.proc.stdin is not None:
            try:
                host.proc.stdin.close()
            except Exception:
                pass
    JVMHost._registry = {}
    JVMHost._registry_lock = threading.Lock()


atexit.register(_shutdown_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
