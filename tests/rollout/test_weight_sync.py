"""When `weight_sync.SyncGraph` captures, replays or loads eagerly. A CUDA graph cannot be built on a
CPU, so `capture_graph` is replaced here by a stand-in whose replay re-runs the captured function
(what a replay computes, without the graph); the replay of a real graph is checked against an
eager engine in test_engine_cuda.py on a GPU."""
import logging

import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.rollout.backend import load_safetensors_dir
from agentq.rollout.torch_engine import weight_sync
from agentq.rollout.torch_engine.engine import TorchEngine


class _RerunGraph:
    """A replay re-runs the function and writes its tensors into the captured outputs, as a real
    replay rewrites the tensors its capture returned."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        new = self.fn()
        for k, v in self.out.items():
            if torch.is_tensor(v):
                v.copy_(new[k])


def _fake_capture(calls):
    def capture(fn, pool):
        calls.append(pool)
        out = fn()
        return _RerunGraph(fn, out), out
    return capture


@pytest.fixture
def engines(tiny_model_dir):
    return [TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=2, max_len=64)
            for _ in range(2)]


def test_the_same_tensors_twice_capture_then_replay_what_an_eager_sync_loads(tiny_model_dir, engines, monkeypatch):
    """Syncs from tensors changed in place: eager, eager + capture, then replays; every sync leaves
    the buffers an always-eager engine's sync leaves and reports its count of changed codes."""
    calls = []
    monkeypatch.setattr(weight_sync, "capture_graph", _fake_capture(calls))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    graphed, eager = engines
    graphed.syncer.use_graphs = True            # the CPU engine builds it off; the policy is what is tested
    w = {n: t.clone() for n, t in load_safetensors_dir(str(tiny_model_dir)).items()}
    g = torch.Generator().manual_seed(0)
    for version in range(1, 5):
        for t in w.values():
            t.add_(0.05 * t.abs().mean() * torch.randn(t.shape, generator=g))
        a, b = (e.update_weights(w.items(), version) for e in (graphed, eager))
        assert a.int8_codes_changed == b.int8_codes_changed and a.int8_codes_changed > 0
        for (name, x), (_, y) in zip(graphed.model.state_dict().items(), eager.model.state_dict().items()):
            assert torch.equal(x, y), (version, name)
    assert calls == ["pool"]
    assert graphed.syncer.stats == {"graph_replays": 2, "eager_syncs": 3, "graphs_captured": 1}
    # new tensors (a checkpoint read again): eager, and the next identical ones capture again
    fresh = {n: t.clone() for n, t in w.items()}
    graphed.update_weights(fresh.items(), 5)
    assert graphed.syncer.stats["eager_syncs"] == 4 and len(calls) == 1
    graphed.update_weights(fresh.items(), 6)
    assert len(calls) == 2 and graphed.syncer.stats["graphs_captured"] == 2


def test_a_failed_capture_leaves_syncs_of_those_tensors_eager_and_is_not_retried(tiny_model_dir, engines,
                                                                                 failing_capture, caplog):
    attempts = failing_capture(weight_sync, "operation not permitted when stream is capturing")
    eng = engines[0]
    eng.syncer.use_graphs = True
    w = load_safetensors_dir(str(tiny_model_dir))
    with caplog.at_level(logging.WARNING, logger=weight_sync.__name__):
        for version in range(1, 4):
            eng.update_weights(w.items(), version)
    assert "capture of the weight sync failed" in caplog.text and len(attempts) == 1
    # 1 sync of the checkpoint at construction, 3 here, all eager
    assert eng.syncer.stats == {"graph_replays": 0, "eager_syncs": 4, "graphs_captured": 0}
