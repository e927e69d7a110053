"""A cluster address where nothing listens is refused within seconds (`check_reachable`), before
`ray.init`, which retries a dead address for ~14 minutes. Plain sockets stand in for a cluster's
port here (the check is a TCP connect); joining a real `ray start` cluster is in test_ray_resources."""
from __future__ import annotations

import socket
import time

import pytest

from agentq.config import ConfigError
from agentq.pool.ray_pool import check_reachable


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
    with socket.socket() as server:                                       # a live one in Ray's temp folder
        server.bind(("0.0.0.0", 0))          # Ray turns 127.0.0.1 into this node's address, as it would to join
        server.listen()
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{server.getsockname()[1]}\n")
        check_reachable("auto")


def test_a_listening_address_passes_and_a_malformed_one_is_named():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_reachable(f"127.0.0.1:{port}")
        check_reachable(f"ray://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="expected host:port"):
        check_reachable("my-cluster")
