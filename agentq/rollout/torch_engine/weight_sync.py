"""A weight sync replayed from one CUDA graph when the learner hands over the same tensors.

Why: a sync requantizes every linear of the engine from the learner's master weights (per part:
a cast to the engine's dtype, the per-channel codes, a count of the codes that changed, two
copies), ~1,200 launches for a 1.7B model. The GPU work is a few ms; eagerly the host's launches
take ~50 ms, every RL step (round 29's H200 runs: interq's sync 0.05–0.07 s against bf16's
0.01 s of plain copies). A learner on the same GPU updates its parameters in place, so each
sync reads the same storages: `SyncGraph` captures the whole load once those storages repeat
and replays it, reading back only the count of changed codes.

The graph is keyed by every tensor's name, address, shape, stride and dtype. A sync whose
tensors differ (a checkpoint loaded from disk, weights received from another process) runs
eagerly; a graph is captured only after the same tensors arrive twice, so a source that hands
over new tensors every time never pays for a capture. Weights and codes are written in place, so
the engine's decode and prefill graphs, which read them, stay valid.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from agentq.utils.errors import first_line

from .decode import capture_graph
from .model import EngineModel

log = logging.getLogger(__name__)


def _key(named: list[tuple[str, torch.Tensor]]) -> tuple:
    return tuple((n, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device) for n, t in named)


class SyncGraph:
    """`EngineModel.load_weights`, replayed from a CUDA graph for tensors seen before.

    Args:
        model: the engine's model.
        use_graphs: capture / replay (CUDA only); off, every sync runs eagerly.
    """

    def __init__(self, model: EngineModel, use_graphs: bool):
        self.model = model
        self.use_graphs = use_graphs and model.device.type == "cuda"
        self._last_key: tuple | None = None       # the previous sync's tensors
        self._graph: Any = None
        self._graph_key: tuple | None = None
        self._graph_out: dict | None = None
        self._pool: Any = None
        self._failed_key: tuple | None = None     # tensors whose capture failed: not retried
        self.stats = {"graph_replays": 0, "eager_syncs": 0, "graphs_captured": 0}

    def load(self, named_tensors: list[tuple[str, torch.Tensor]]) -> dict:
        """Load the tensors (`EngineModel.load_weights`'s contract and return value)."""
        dev = self.model.embed_tokens.weight.device          # with its index
        key = _key(named_tensors) if self.use_graphs and all(t.device == dev for _, t in named_tensors) else None
        if key is not None and key == self._graph_key:
            self._graph.replay()
            self.stats["graph_replays"] += 1
            out = self._graph_out
            assert out is not None
            return {**out, "codes_changed": int(out["codes_changed"])}
        info = self.model.load_weights(named_tensors)
        self.stats["eager_syncs"] += 1
        if key is not None and key == self._last_key and key != self._failed_key:
            self._capture(named_tensors, key)
        self._last_key = key
        return info

    def _capture(self, named_tensors: list[tuple[str, torch.Tensor]], key: tuple) -> None:
        """Capture the load of these tensors (already loaded: the warm-up and capture runs rewrite
        the same values). A failed capture leaves syncs eager."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            graph, out = capture_graph(lambda: self.model.load_weights_queued(named_tensors), self._pool)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as err:      # AcceleratorError is a RuntimeError
            log.warning("CUDA graph capture of the weight sync failed (%s: %s); syncs of these tensors run "
                        "eagerly", type(err).__name__, first_line(err))
            self._failed_key = key
            return
        if not torch.is_tensor(out["codes_changed"]):        # nothing quantized: a count of 0 to read back
            out = {**out, "codes_changed": torch.zeros((), dtype=torch.long, device=self.model.device)}
        self._graph, self._graph_key, self._graph_out = graph, key, out
        self.stats["graphs_captured"] += 1

    def reset(self) -> None:
        """Drop the captured graph (the next syncs run eagerly until their tensors repeat)."""
        self._graph = self._graph_key = self._graph_out = self._last_key = self._failed_key = None
