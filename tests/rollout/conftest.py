import pytest
import torch


@pytest.fixture
def failing_capture(monkeypatch):
    """`patch(module)` makes that module's `capture_graph` fail as a GPU's capture may (a CPU cannot
    build a CUDA graph, so this stand-in is the only way to reach the fallback there); returns the
    list of attempted captures."""
    def patch(module, message: str = "CUDA out of memory") -> list:
        attempts: list = []

        def refuse(fn, pool):
            attempts.append(pool)
            raise RuntimeError(message)
        monkeypatch.setattr(module, "capture_graph", refuse)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
        return attempts
    return patch
