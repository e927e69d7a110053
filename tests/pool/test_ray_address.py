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
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed_port()}")
    with pytest.raises(ConfigError, match="ray.address='auto': nothing answers"):
        check_reachable("auto")
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))    # no `ray start` marker there
    with pytest.raises(ConfigError, match="no running Ray cluster"):
        check_reachable("auto")
    (tmp_path / "ray").mkdir()                                           # a stale marker: the cluster is gone
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{closed_port()}\n")
    with pytest.raises(ConfigError, match="nothing answers"):
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
