"""A cluster address where nothing listens, or something that is no Ray cluster, is refused within
seconds (`check_reachable`), before `ray.init`, which retries such an address for ~14 minutes. A real
`ray start` head passes; where a test needs a live address without one, a socket that answers the
HTTP/2 handshake as a gRPC server does stands in for it (`grpc_like`: the check reads no more)."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time

import pytest

from agentq.config import ConfigError
from agentq.pool.ray_pool import check_reachable

from conftest import ray_head


def closed_port() -> int:
    with socket.socket() as s:          # bound, then closed: nothing listens there now
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_address_is_refused_at_once():
    port = closed_port()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"nothing answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 5


def test_auto_resolves_as_ray_does(monkeypatch, tmp_path):
    """"auto" goes through Ray's own resolution: RAY_ADDRESS, then the `ray start` marker in Ray's
    temp folder (RAY_TMPDIR here; the check used to read tempfile's folder, which Ray does not
    always use), then any running cluster's GCS (scanned processes: made empty here, so that a
    cluster another test runs cannot answer for this one)."""
    from ray._private import services

    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed_port()}")
    with pytest.raises(ConfigError, match="ray.address='auto': nothing answers"):
        check_reachable("auto")
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))                       # no `ray start` marker there
    with pytest.raises(ConfigError, match="no running Ray cluster"):
        check_reachable("auto")
    monkeypatch.setenv("RAY_ADDRESS", "bogus")                            # was Ray's ValueError traceback
    with pytest.raises(ConfigError, match="RAY_ADDRESS='bogus' is no Ray address"):
        check_reachable("auto")
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{closed_port()}")  # a client address: probed as it is
    with pytest.raises(ConfigError, match="nothing answers at 127.0.0.1:"):
        check_reachable("auto")
    monkeypatch.setenv("RAY_ADDRESS", "auto")                             # Ray's own word for "find one"
    with pytest.raises(ConfigError, match="no running Ray cluster"):
        check_reachable("auto")
    monkeypatch.delenv("RAY_ADDRESS")
    (tmp_path / "ray").mkdir()                                           # a stale marker: the cluster is gone
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{closed_port()}\n")
    with pytest.raises(ConfigError, match="nothing answers"):
        check_reachable("auto")
    with grpc_like("0.0.0.0") as port:      # a live one in Ray's temp folder (Ray turns 127.0.0.1 into this
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")    # node's address to join)
        check_reachable("auto")


@contextlib.contextmanager
def grpc_like(host: str = "127.0.0.1"):
    """A server that answers every connection's HTTP/2 preface with an empty SETTINGS frame, as a gRPC
    server does first (the handshake `answers_grpc` reads); yields its port."""
    server = socket.socket()
    server.bind((host, 0))
    server.listen()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:         # closed: done
                return
            with conn:
                conn.recv(64)
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_a_listening_address_passes_and_a_malformed_one_is_named():
    with grpc_like() as port:
        check_reachable(f"127.0.0.1:{port}")
        check_reachable(f"ray://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="expected host:port"):
        check_reachable("my-cluster")


@pytest.mark.parametrize("service", ["silent", "http"])
def test_an_address_where_no_ray_cluster_answers_is_refused_in_seconds(service, tmp_path):
    """A wrong port with something else on it (a silent listener, an HTTP server such as the dashboard
    on 8265) passed the TCP check, and `ray.init` then retried it for minutes."""
    if service == "silent":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        port, stop = server.getsockname()[1], server.close
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        http = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop = http.kill
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
    try:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port} takes connections but does not answer as a Ray "
                                              "cluster"):
            check_reachable(f"127.0.0.1:{port}", timeout_s=2)
        assert time.monotonic() - t0 < 4          # connect and handshake share the one timeout
    finally:
        stop()


def test_with_tls_on_only_the_connection_is_checked(monkeypatch):
    """A cluster with TLS on (`RAY_USE_TLS=1`) answers a TLS handshake, never the plaintext HTTP/2
    preface: the check then stops at the TCP connection instead of refusing a working cluster."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        monkeypatch.setenv("RAY_USE_TLS", "1")
        check_reachable(f"127.0.0.1:{port}", timeout_s=2)
        monkeypatch.setenv("RAY_USE_TLS", "0")
        with pytest.raises(ConfigError, match="does not answer as a Ray cluster"):
            check_reachable(f"127.0.0.1:{port}", timeout_s=1)
    finally:
        server.close()


def test_a_real_ray_head_answers_the_check(tmp_path):
    with ray_head(tmp_path) as port:
        check_reachable(f"127.0.0.1:{port}")


def test_auto_says_where_its_address_came_from_and_warns_of_a_process_scan(monkeypatch, tmp_path, capsys):
    """ray.address=auto names the cluster it joined and where the address came from; one found only by
    Ray's scan of this machine's raylets (no RAY_ADDRESS, no `ray start` file) may be another run's
    private loopback cluster, which is warned of. The scan's result is a stand-in (a real scan would
    find whatever clusters other tests and sessions run here)."""
    from ray._private import services

    from agentq.pool.ray_pool import announce_join, resolve_auto_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))                      # no current-cluster file
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: ["127.0.0.1:40001"])
    address, origin = resolve_auto_address()       # Ray names loopback by this node's IP
    assert address.endswith(":40001") and origin == "a process scan"
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:40002\n")
    address, origin = resolve_auto_address()      # Ray's order: one scanned raylet wins over the file
    assert address.endswith(":40001") and origin == "a process scan"
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: ["127.0.0.1:40002"])   # the file's own cluster
    assert resolve_auto_address()[1].startswith("Ray's current-cluster file ")
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    address, origin = resolve_auto_address()
    assert address.endswith(":40002") and origin.startswith("Ray's current-cluster file ") and str(tmp_path) in origin
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:40003")
    address, origin = resolve_auto_address()
    assert address.endswith(":40003") and origin == "RAY_ADDRESS"

    announce_join("auto", "a process scan", "127.0.0.1:40001")
    warned = capsys.readouterr().err.strip()
    assert warned.startswith("warning: ray.address=auto joined the Ray cluster at 127.0.0.1:40001, found by a "
                             "process scan") and "another run's private" in warned
    assert "ray.address=<host:port>" in warned and "\n" not in warned
    announce_join("auto", "RAY_ADDRESS", "127.0.0.1:40003")
    assert capsys.readouterr().err.strip() == "Ray: joined the cluster at 127.0.0.1:40003 (ray.address=auto, from RAY_ADDRESS)"


def test_a_joined_cluster_is_named_with_its_origin(monkeypatch, capsys):
    """init_ray joining a cluster prints the one line (ray.init a stand-in: the check and the join are
    tested above and in tests/distributed)."""
    import ray

    from agentq.pool import ray_pool

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: None)
    monkeypatch.setattr(ray_pool, "check_reachable", lambda address: "a process scan")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("Ctx", (), {"gcs_address": "10.0.0.5:6379"})())
    ray_pool.init_ray("auto", None)
    assert "joined the Ray cluster at 10.0.0.5:6379, found by a process scan" in capsys.readouterr().err
