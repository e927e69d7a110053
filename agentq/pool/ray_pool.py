"""Ray actors as environment workers (`env_pool=ray`): the same commands as the subprocess pool,
for spreading environments over a Ray cluster. A dead actor (also one killed by Ray's memory monitor,
whose calls Ray answers with OutOfMemoryError), or one that does not answer within `call_timeout_s`
per env call, is (killed and) recreated and its in-flight commands are answered with error results;
an episode under way on another slot of that actor (its env rebuilt with the actor) is answered
with an error at its next step (`SiblingSlots`). A local cluster (no `address`)
is started bound to 127.0.0.1, without the dashboard, so none of its services listen on the
machine's network interfaces (`ray_init_kwargs`, `keep_local_cluster_on_loopback`: the trainer's
placement starts it the same way; its learner ranks' torch.distributed rendezvous store is not Ray's
and listens on all interfaces, docs/distributed.md "Network exposure"). A joined cluster is named
on the console with where its address came from (`announce_join`).

A local cluster's workers import what the trainer can: the trainer's own sys.path folders (a module
beside the user's script, a `sys.path.insert`) go into their PYTHONPATH (`driver_import_paths`). A
joined cluster (`address`) is left as it is: its nodes must be able to import the env class
themselves, and an actor that cannot says so in one line naming the module (`EnvActor`).

Each actor asks for at most one CPU, and less when the cluster has fewer free CPUs than workers
(`cpus_per_worker`; none at all when every CPU is held, with a warning): Ray would otherwise wait
forever to place an actor it cannot fit (a 2-CPU machine with 3 workers, or a second pool while the
first one holds the CPUs). Actors that still cannot start within `start_timeout_s` raise an error
naming the free resources. The dispatch, restart and give-up rules are `WorkerPool`'s, shared with
the subprocess pool (a restarted actor is awaited like a restarted subprocess). The RL trainer plays
its evaluations through the training pool, so a run holds one set of workers."""
from __future__ import annotations

import contextlib
import os
import site
import socket
import sys
import sysconfig
import time
import weakref
from typing import Any, Iterator

from agentq.config import ConfigError
from agentq.utils.errors import first_line
from agentq.utils.process import descendants, kill_when_this_process_ends
from agentq.utils.ray_actors import actor_start_problem, kill_actor, last_line

from .base import CALL_TIMEOUT_S, EnvSpec, Heard, WorkerCore, WorkerPool, hung_message

LOOPBACK = "127.0.0.1"
CLOSE_TIMEOUT_S = 10.0      # for all actors together to close their envs; then they are killed
RESOURCE_SETTLE_S = 2.0     # how long released CPUs may take to show as free (measured: under 1 s)
REACH_TIMEOUT_S = 5.0       # for a joined cluster's address to accept a connection


def import_ray(setting: str) -> Any:
    """The ray module, or, where Ray is not installed (the optional `[ray]` extra), a one-line error
    naming `setting`, the setting that asked for Ray ("env_pool=ray", "placement=split").

    Raises:
        ConfigError: `import ray` failed.
    """
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"{setting} runs on Ray, which is not installed ({first_line(e)}): pip install -e "
                          "\".[ray]\" in a checkout, else pip install ray") from None
    return ray


def ray_init_kwargs(address: str | None) -> dict:
    """ray.init arguments: join `address` as given, or start a local cluster on loopback only whose
    workers also search this process's own sys.path folders (`driver_import_paths`).

    Args:
        address: a running cluster to join ("auto", "host:port"), or None for a new local one, even
            where a cluster is already running on this machine.
    Returns:
        Keyword arguments for `ray.init`.
    """
    # Ray's own None joins a cluster it finds (RAY_ADDRESS, the last `ray start` on this machine) and
    # then refuses num_cpus; "local" always starts a new one, as `ray.address: null` promises
    kw: dict[str, Any] = dict(address=address or "local", include_dashboard=False, log_to_driver=False,
                              ignore_reinit_error=True, configure_logging=False)
    if address is None:
        kw["_node_ip_address"] = LOOPBACK
        paths = driver_import_paths()
        if paths:   # a runtime_env's env_vars replace the variable: keep what the workers would inherit
            inherited = os.environ.get("PYTHONPATH")
            pythonpath = os.pathsep.join([*paths, *([inherited] if inherited else [])])
            kw["runtime_env"] = {"env_vars": {"PYTHONPATH": pythonpath}}
    return kw


def init_ray(address: str | None, num_cpus: int | None) -> None:
    """Start Ray unless it is up: join `address`, checked to answer first (`check_reachable`) and named
    on the console with where it came from (`announce_join`), or start a local cluster of `num_cpus`
    CPUs (None: every core) on loopback only.

    Raises:
        ConfigError: nothing answers at `address`.
    """
    import ray

    if ray.is_initialized():
        return
    origin = ""
    if address is None:
        keep_local_cluster_on_loopback()
    else:
        origin = check_reachable(address)
    before = set(descendants(os.getpid())) if address is None else set()    # a joined cluster is not ours
    with own_sigterm_handler_kept():
        ray.init(**ray_init_kwargs(address), num_cpus=num_cpus if address is None else None)
    if address is None:
        _reap_local_cluster_on_exit(sorted(set(descendants(os.getpid())) - before))
    else:       # which cluster "auto" (or a name) found is otherwise nowhere on the console
        announce_join(address, origin)


@contextlib.contextmanager
def own_sigterm_handler_kept() -> Iterator[None]:
    """`ray.init` installs its own SIGTERM handler (`sys.exit`) in the main thread, over the one there. A
    handler the process installed itself (the CLI's, which stops a run as Ctrl-C does, with its resume
    line) is put back after the block; where there was none, Ray's stays (its exit runs the exit hooks)."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(before) and signal.getsignal(signal.SIGTERM) is not before:
            signal.signal(signal.SIGTERM, before)


_cluster_watcher: Any = None     # the watcher of the local cluster this process started last


def _reap_local_cluster_on_exit(started: list[int]) -> None:
    """A local cluster's GCS and raylet end with the trainer, but its DashboardAgent and
    RuntimeEnvAgent (the raylet's children, up when `ray.init` returns) outlive a trainer killed by
    SIGKILL or the OOM killer, ~200 MB each, for good. A watcher kills what `ray.init` started once
    the trainer has ended. A new local cluster replaces the previous one's watcher, which then
    fires: what the shut-down cluster left goes too (its own processes only, by pid and start time)."""
    global _cluster_watcher
    if _cluster_watcher is not None and _cluster_watcher.stdin is not None:
        _cluster_watcher.stdin.close()
    _cluster_watcher = kill_when_this_process_ends(started)


def resolve_auto_address() -> tuple[str | None, str]:
    """What Ray's `ray.init(address="auto")` would join: RAY_ADDRESS (unless it is "auto" itself; a
    ray:// client address as it is), else the last `ray start` recorded in Ray's temp folder
    (RAY_TMPDIR, TMPDIR or /tmp), else any running cluster's GCS; None when there is none. Ray's own
    resolution, so the check and the join cannot disagree.

    Returns:
        The address (None: none found) and where it came from: "RAY_ADDRESS", "Ray's current-cluster
        file <path>" or "a process scan" (any raylet running here, also another run's private cluster).
    Raises:
        ConfigError: RAY_ADDRESS is no address Ray can parse.
    """
    from ray._private.services import canonicalize_bootstrap_address   # Ray has no public resolver

    env = os.environ.get("RAY_ADDRESS", "")
    if env.startswith("ray://"):             # a Ray Client address, which ray.init joins as it is
        return env, "RAY_ADDRESS"
    origin = "RAY_ADDRESS" if env not in ("", "auto") else _auto_origin()
    try:
        return canonicalize_bootstrap_address("auto"), origin
    except ConnectionError:                  # "Could not find any running Ray instance"
        return None, origin
    except ValueError as e:                  # a RAY_ADDRESS Ray cannot parse
        raise ConfigError(f"ray.address=auto: RAY_ADDRESS={env!r} is no Ray address ({e}); expected host:port, "
                          "ray://host:port or auto") from None


def _auto_origin() -> str:
    """Where Ray's "auto" without RAY_ADDRESS takes its address from, in Ray 2.x's own order
    (`ray._private.services.get_ray_address_from_environment`): one raylet found by scanning this
    machine's processes wins over the `ray start` file (the file's own, when it is that one); the file
    where none or several are found."""
    from ray._private.services import find_gcs_addresses
    from ray._private.utils import get_ray_address_file, read_ray_address

    scanned, recorded = list(find_gcs_addresses()), read_ray_address()
    if recorded is not None and (len(scanned) != 1 or scanned[0] == recorded):
        return f"Ray's current-cluster file {get_ray_address_file(None)}"
    return "a process scan"


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> str:
    """Refuse a cluster address where nothing listens, within `timeout_s`: Ray itself retries a
    dead address for ~14 minutes (20 attempts) before it gives up. "auto" is resolved by Ray itself
    (`resolve_auto_address`); a "ray://" client address by its host and port.

    Returns:
        Where the address came from: "ray.address", or for "auto" `resolve_auto_address`'s origin.
    Raises:
        ConfigError: no cluster to resolve "auto" to, or no answer at host:port.
    """
    resolved, origin = address, "ray.address"
    if address == "auto":
        found, origin = resolve_auto_address()
        resolved = found or ""
        if not resolved:
            raise ConfigError("ray.address=auto: no running Ray cluster on this machine (no RAY_ADDRESS, no `ray "
                              "start`); start one with `ray start --head`, or set ray.address=null for a local one")
    host, _, port = resolved.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"ray.address={address!r}: expected host:port (or auto, or null for a local cluster)")
    deadline = time.monotonic() + timeout_s
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError as e:
        raise ConfigError(f"ray.address={address!r}: nothing answers at {host}:{port} within {timeout_s:g} s ({e}); "
                          "is the cluster up (`ray status`)? ray.address=null starts a local one") from None
    with conn:
        # a cluster with TLS on answers a TLS handshake, not a plaintext preface: the TCP check only
        # (at least a second for the answer, however long the connection took)
        wait_s = max(1.0, deadline - time.monotonic())
        if not ray_uses_tls() and not answers_grpc(conn, wait_s):
            raise ConfigError(f"ray.address={address!r}: {host}:{port} takes connections but does not answer as a Ray "
                              f"cluster (no gRPC handshake within {wait_s:.1f} s; Ray would retry it for minutes): give "
                              "the address `ray start --head` printed (port 6379 by default), not the dashboard's "
                              "(8265) or another service's; ray.address=null starts a local cluster")
    return origin


def announce_join(address: str, origin: str, joined: str | None = None) -> None:
    """One line on the console: the cluster joined (`joined`, its GCS address; None: the one Ray is
    connected to) for `ray.address=address` and where that address came from; a process scan's find
    is a warning, as it may be a cluster another agentq run or test started for itself on loopback
    (Ray's "auto" falls back to any raylet here)."""
    from agentq.utils.logging import console

    if joined is None:
        import ray

        joined = ray.get_runtime_context().gcs_address

    if origin == "a process scan":
        console.print(f"warning: ray.address={address} joined the Ray cluster at {joined}, found by a process scan "
                      "(no RAY_ADDRESS, no current-cluster file of `ray start`): it may be another run's private "
                      "local cluster; give the cluster you mean as ray.address=<host:port>",
                      style="yellow", markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"Ray: joined the cluster at {joined} (ray.address={address}, from {origin})",
                      markup=False, highlight=False, soft_wrap=True)


def ray_uses_tls() -> bool:
    """Whether Ray's gRPC connections use TLS here (`RAY_USE_TLS`, read as Ray reads it)."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")


#: HTTP/2's client preface and an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server, as Ray's GCS
#: and its client server are, answers with a SETTINGS frame of its own
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def answers_grpc(conn: socket.socket, timeout_s: float) -> bool:
    """Whether the server on `conn` answers HTTP/2's preface with a SETTINGS frame (type 4 in the
    fourth byte of the first frame header) within `timeout_s`. A silent listener or an HTTP/1 server
    does not: `ray.init` then retried it for ~14 minutes."""
    deadline = time.monotonic() + timeout_s
    head = b""
    try:
        conn.sendall(H2_PREFACE)
        while len(head) < 4 and (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:         # a timeout, a reset: no answer
        return False
    return len(head) >= 4 and head[3] == 4


def driver_import_paths() -> list[str]:
    """This process's sys.path folders that a fresh Python of the same installation would not have:
    the script's folder, the working folder, folders added with `sys.path.insert` or `append`. A Ray
    worker gets only the installation's own paths (and the PYTHONPATH the cluster started with), so
    a module found through these alone fails to import there.

    Returns:
        Absolute paths that exist, in sys.path order, without the interpreter's standard library and
        site-packages folders and without those already on the inherited PYTHONPATH.
    """
    own = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    own |= {*site.getsitepackages(), site.getusersitepackages()}
    own = {os.path.realpath(p) for p in own if p}
    own.add(os.path.realpath(os.path.join(os.path.dirname(sysconfig.get_path("stdlib")),
                                          f"python{sys.version_info[0]}{sys.version_info[1]}.zip")))
    inherited = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    out: list[str] = []
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        path = os.path.abspath(entry or os.curdir)          # "": the working folder
        real = os.path.realpath(path)
        if (not os.path.exists(path) or path in out or real in inherited
                or any(real == p or real.startswith(p + os.sep) for p in own)):
            continue
        out.append(path)
    return out


def keep_local_cluster_on_loopback() -> None:
    """Ray turns a loopback node address into the machine's reachable IP (and its services listen
    there) unless its "no cluster" mode is on, which it reads from this variable at import time: set
    it for the processes the local cluster starts, and in this process if ray is already imported."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def cpus_per_worker(available_cpus: float, num_workers: int, wanted: float = 1.0) -> float:
    """CPUs each of `num_workers` actors requests: `wanted`, or an equal share of what is free
    (rounded down to 1/100; 0 when nothing is free: Ray places zero-CPU actors anywhere)."""
    return max(0.0, min(float(wanted), int(100 * available_cpus / max(1, num_workers)) / 100))


#: this process's pools whose actors reserve CPUs (weak: a pool dropped without `close`, its actor
#: handles gone with it, has its actors ended by Ray and reserves nothing)
_live_pools: weakref.WeakSet = weakref.WeakSet()


def reserved_here(cluster: str) -> float:
    """The CPUs that this process's live pools on `cluster` (a GCS address) reserve."""
    return sum(p.reserved_cpus for p in list(_live_pools) if p.cluster == cluster)


def free_cpus(ray: Any, wanted: float, settle_s: float = RESOURCE_SETTLE_S) -> float:
    """The cluster's free CPUs, as far as this process can tell.

    Ray's view of free resources lags the actors in both directions. CPUs just released (a closed
    pool's killed actors, a removed placement group) show as free only a moment later, so while
    fewer than `wanted` are free this looks again for up to `settle_s` (a pool started right after
    another closed would otherwise get no CPU). CPUs just taken (a pool whose actors are up) may
    still show as free under load, so the answer is never more than the cluster's CPUs less those
    this process's own pools reserve (`reserved_here`): a second pool would otherwise ask for CPUs the
    first one holds and wait for them until its start times out."""
    unreserved = ray.cluster_resources().get("CPU", 0.0) - reserved_here(ray.get_runtime_context().gcs_address)
    deadline = time.monotonic() + settle_s
    free = ray.available_resources().get("CPU", 0.0)
    while free < min(wanted, unreserved) and time.monotonic() < deadline:   # no wait for CPUs our pools hold
        time.sleep(0.1)
        free = max(free, ray.available_resources().get("CPU", 0.0))
    return float(max(0.0, min(free, unreserved)))


class EnvActor(WorkerCore):
    """The `WorkerCore` each Ray actor holds: a module it cannot import (the env's, or one the env
    needs) is a one-line error naming the module and the node, not a bare ModuleNotFoundError."""

    def __init__(self, spec: EnvSpec, slots: list[int]):
        try:
            super().__init__(spec, slots)
        except ModuleNotFoundError as e:
            import ray

            raise ModuleNotFoundError(
                f"env {spec.name!r}: cannot import module {e.name!r} on Ray node "
                f"{ray.util.get_node_ip_address()}; the env class (and what it imports) must be importable on "
                "every Ray node: install its package there or put its folder on PYTHONPATH before `ray start` "
                "(a local cluster that agentq starts searches the trainer's sys.path)", name=e.name) from None


class RayPool(WorkerPool):
    """`EnvPool` over Ray actors (each a `WorkerCore`); slot s lives in actor s mod num_workers."""

    kind = "env actor"

    def __init__(self, spec: EnvSpec, num_envs: int, num_workers: int = 2, address: str | None = None,
                 num_cpus: int | None = None, num_cpus_per_worker: float = 1.0, start_timeout_s: float = 300.0,
                 call_timeout_s: float = CALL_TIMEOUT_S):
        """Join (or start) a Ray cluster and start the actors.

        Args:
            spec: how to build each environment; num_envs: slots; num_workers: actors.
            address: a running cluster to join; None starts a local one on 127.0.0.1 with `num_cpus` CPUs.
            num_cpus_per_worker: CPUs each actor asks for at most (less when fewer are free).
            start_timeout_s: seconds the actors may take to start (then an error naming free resources).
            call_timeout_s: seconds one env call may take: an actor counts as hung once no env call of
                its share ended within call_timeout_s of the last (`_answer`).
        Raises:
            RuntimeError: an actor failed to start (none is left running).
            ConfigError: Ray is not installed.
        """
        ray = import_ray("env_pool=ray")
        self._ray = ray
        self._unreadable = (StopIteration, ray.exceptions.RayError)
        self._actors: dict[int, Any] = {}
        self._calls: dict[int, Any] = {}        # busy actor → the stream of its call (`_submit`)
        self._setup(spec, num_envs, num_workers, call_timeout_s, start_timeout_s)   # refused before a cluster starts
        init_ray(address, num_cpus)
        free = free_cpus(ray, self.num_workers * num_cpus_per_worker)
        self.cpus_per_worker = cpus_per_worker(free, self.num_workers, num_cpus_per_worker)
        if self.cpus_per_worker == 0:
            from agentq.utils.logging import console      # a console line, not a warning's file:line

            console.print(f"warning: the Ray cluster has no free CPU: {self.num_workers} env worker(s) start without a "
                          "CPU reservation and share the cores with the actors that hold them",
                          style="yellow", markup=False, highlight=False, soft_wrap=True)
        self._actor_cls = ray.remote(num_cpus=self.cpus_per_worker, max_restarts=0)(EnvActor)
        self._start_all()
        self.cluster, self.reserved_cpus = ray.get_runtime_context().gcs_address, self.cpus_per_worker * self.num_workers
        _live_pools.add(self)

    def _launch(self, w: int) -> None:
        self._calls.pop(w, None)
        self._heard.pop(w, None)
        self._actors[w] = self._actor_cls.remote(self.spec, self._slots[w])

    def _await(self, w: int, timeout: float) -> str | None:
        return actor_start_problem(self._ray, self._actors[w], timeout,
                                   f"{self.start_timeout_s:g} s ({self.cpus_per_worker:g} CPU each)")

    def _kill(self, w: int) -> None:
        kill_actor(self._ray, self._actors[w])

    @property
    def tick_s(self) -> float:
        """How far apart an actor's ticks may be (`WorkerCore.call_ticking`): a tenth of
        `call_timeout_s`, at most 1 s."""
        return min(1.0, self.call_timeout_s / 10)

    def _submit(self, w: int, cmd: str, blob: bytes) -> Any:
        self._heard.pop(w, None)
        try:
            stream = self._actors[w].call_ticking.options(num_returns="streaming").remote(cmd, blob, self.tick_s)
        except self._ray.exceptions.RayError:
            return None
        self._calls[w] = stream
        return stream

    def _answer(self, w: int, handle: Any, timeout: float, cmd: str, sent_at: float, n: int) -> tuple[bytes | None, str]:
        """As `WorkerPool._answer`. An actor ticks as its env calls end (`WorkerCore.call_ticking`), so it
        is hung once none ended within `call_timeout_s` of the last, not only after n × `call_timeout_s`;
        while it waits on one actor the pool reads every busy actor's ticks (`_wait_for`), so each one's
        clock runs from its own last tick (the first comes as the actor starts the call). Ticks are read
        as they come (the pool's own clock: a joined cluster's nodes do not share one), and a call may end
        up to `tick_s` after a tick without one, so the wait is that much longer: a hang is found late by
        at most `tick_s` and a read's delay, never early."""
        ray = self._ray
        if handle is None:
            return None, "died (no longer reachable)"
        self._calls.pop(w, None)
        heard = self._heard.pop(w, None) or Heard()
        last, ticks = max(sent_at, heard.last), heard.ticks
        overall = time.monotonic() + timeout
        patience = self.call_timeout_s + self.tick_s
        try:
            if heard.failure is not None:
                raise heard.failure
            if heard.ended:
                return heard.answer, ""
            while True:
                if not self._wait_for(w, handle, max(0.0, min(overall, last + patience) - time.monotonic())):
                    break
                status, payload = self._next(handle)
                if status != "tick":
                    return payload, ""
                last, ticks = time.monotonic(), int(payload)
            if n == 1 or last + patience >= overall:
                return None, "hung"         # the whole budget: `_exchange` says so
            return None, hung_message(cmd, n, ticks, self.call_timeout_s, self.tick_s)
        except StopIteration:
            return None, "failed (its call ended without an answer)"
        except ray.exceptions.RayActorError as e:
            return None, f"died ({type(e).__name__})"
        except ray.exceptions.OutOfMemoryError as e:     # Ray's memory monitor killed it: the node's memory, not advice
            return None, f"died (killed by Ray's memory monitor: OutOfMemoryError: {first_line(e)})"
        except ray.exceptions.RayError as e:      # the call failed in Ray itself: the actor's state is unknown
            return None, f"failed ({type(e).__name__}: {last_line(e)})"

    def _next(self, stream: Any) -> tuple[str, Any]:
        """The next message of an actor's call stream, which `ray.wait` found ready."""
        return self._ray.get(next(stream), timeout=self.call_timeout_s)

    def _wait_for(self, w: int, stream: Any, wait_s: float) -> bool:
        """Wait up to `wait_s` until actor `w`'s call stream has a message (True) or not (False), reading
        meanwhile whatever the other busy actors send (`_hear`)."""
        deadline = time.monotonic() + wait_s
        while True:
            others = [(self._calls[v], v) for v in self._pending if v != w and v in self._calls
                      and not self._heard.get(v, Heard()).ended]
            ready, _ = self._ray.wait([stream, *(s for s, _ in others)], num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            for r in ready:
                for s, v in others:
                    if r is s:
                        self._hear(v)
            if any(r is stream for r in ready):
                return True
            if not ready:
                return False

    def _read_next(self, v: int) -> tuple[str, Any]:
        return self._next(self._calls[v])

    def _note_tick(self, heard: Heard, payload: Any) -> None:
        # read as it comes, on the pool's clock (a joined cluster's nodes do not share one): the calls
        # finished so far
        heard.last, heard.ticks = time.monotonic(), int(payload)

    def actor(self, slot: int) -> Any:
        """The Ray actor handle that runs `slot` (tests kill it)."""
        return self._actors[slot % self.num_workers]

    def close(self) -> None:
        """Ask the actors to close their environments (`CLOSE_TIMEOUT_S` for all together), then kill
        every actor, also a hung one or when this is interrupted (the cluster keeps running)."""
        actors, self._actors, self._calls, self._heard = list(self._actors.values()), {}, {}, {}
        _live_pools.discard(self)
        try:
            if actors:
                self._ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=CLOSE_TIMEOUT_S)
        except Exception:
            pass
        finally:
            for a in actors:
                try:
                    self._ray.kill(a)
                except Exception:
                    pass
