"""Fused decode steps for `TorchEngine`: forward one token per episode and sample the next one.

A decode step is `EngineModel.decode_step` (K/V written at each row's position, attention over
its slot, logits) followed by the counter-based sampler, all on the model's device. On CUDA with
the kernel path the step has no host synchronisation, so `DecodeRunner` captures it once per
batch-size bucket in a CUDA graph and replays it every step: the ~2–3 k kernel launches of a
step become one graph launch. What changes from step to step (token ids, slots, lengths, seeds,
temperature) lives in static buffers that are written before each replay; weights and the KV
cache are updated in place (`copy_`), so captured graphs stay valid across weight syncs.

Rows of a bucket beyond the live batch point at a scratch KV slot that no episode owns, so a
replay never touches another episode's cache. A row's sampled token depends only on its own
logits and its (seed, position) key, so graph replay, eager execution and any batch composition
give the same token.
"""
from __future__ import annotations

from typing import Any

import torch

from agentq.rollout.backend import SamplingParams

from .kv_cache import KVCache
from .model import EngineModel, decode_kernel_applies
from .sampler import row_keys, sample_counter, vocab_keys


def bucket_sizes(max_batch: int) -> list[int]:
    """Batch sizes a graph is captured for: 1, 2, 4, 8, 16, then steps of 16 up to 64, of 32 up
    to 256 and of 64 beyond (a live batch is padded up to the next one)."""
    sizes, b = [], 1
    while b < min(16, max_batch):
        sizes.append(b)
        b *= 2
    b = 16
    while b < max_batch:
        sizes.append(b)
        b += 16 if b < 64 else (32 if b < 256 else 64)
    sizes.append(max_batch)
    return sorted(set(sizes))


class _Bucket:
    """Static inputs of one bucket: token ids, slots, slot lengths after the step, seeds."""

    def __init__(self, size: int, pad_slot: int, device: torch.device):
        self.size = size
        self.ids = torch.zeros(size, dtype=torch.long, device=device)
        self.slots = torch.full((size,), pad_slot, dtype=torch.long, device=device)
        self.lens = torch.ones(size, dtype=torch.long, device=device)
        self.seeds = torch.zeros(size, dtype=torch.int64, device=device)
        self.pad_slot = pad_slot

    def fill(self, ids: list[int], slots: list[int], lens: list[int], seeds: list[int]) -> None:
        n, dev = len(ids), self.ids.device
        pad = self.size - n
        for buf, vals, fill in ((self.ids, ids, 0), (self.slots, slots, self.pad_slot), (self.lens, lens, 1),
                                (self.seeds, seeds, 0)):
            host = torch.tensor(list(vals) + [fill] * pad, dtype=buf.dtype)
            buf.copy_(host.to(dev, non_blocking=True))


class DecodeRunner:
    """Decode-and-sample steps over the engine's model and cache, eager or CUDA-graph replayed.

    Args:
        model: the engine's `EngineModel`.
        cache: its `KVCache`; `pad_slot` is a slot index no episode owns (padding rows write there).
        use_graphs: capture/replay CUDA graphs (only where the step is free of host syncs).
    """

    def __init__(self, model: EngineModel, cache: KVCache, pad_slot: int, max_batch: int, use_graphs: bool):
        self.model, self.cache, self.pad_slot = model, cache, pad_slot
        self.device = model.device
        self.graphable = use_graphs and self.device.type == "cuda" and decode_kernel_applies(cache)
        self.buckets = bucket_sizes(max_batch)
        self._bufs: dict[int, _Bucket] = {}
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool: Any = None              # the CUDA graphs' shared memory pool
        self._vkeys = vocab_keys(model.config.vocab_size, self.device)
        self._temp = torch.ones((), dtype=torch.float32, device=self.device)
        self.stats = {"graph_replays": 0, "eager_steps": 0, "graphs_captured": 0}

    # ------------------------------------------------------------------ sampling shared with prefill
    def sample(self, logits: torch.Tensor, params: SamplingParams, seeds: list[int], positions: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Counter-based draw for rows whose logits are already computed (the first token of a turn)."""
        dev = logits.device
        keys = row_keys(torch.tensor(seeds, dtype=torch.int64, device=dev),
                        torch.tensor(positions, dtype=torch.int64, device=dev))
        self._temp.fill_(params.temperature if params.temperature > 0 else 1.0)
        return sample_counter(logits, params, keys, self._vkeys, self._temp)

    # ------------------------------------------------------------------ decode
    def step(self, ids: list[int], slots: list[int], new_lens: list[int], seeds: list[int],
             params: SamplingParams) -> tuple[list[int], list[float]]:
        """Feed ids[i] at position new_lens[i] - 1 of slots[i]; sample each row's next token (at
        position new_lens[i]). Returns (tokens, log-probs) of the live rows."""
        n = len(ids)
        size = next((b for b in self.buckets if b >= n), None) if self.graphable else n
        if size is None:
            raise ValueError(f"decode batch {n} exceeds the largest bucket {self.buckets[-1]}")
        buf = self._buffers(size)
        buf.fill(ids, slots, new_lens, seeds)
        self._temp.fill_(params.temperature if params.temperature > 0 else 1.0)
        if self.graphable:
            graph, (tok, lp) = self._graph(buf, params)
            graph.replay()
            self.stats["graph_replays"] += 1
        else:
            tok, lp = self._run(buf, params)
            self.stats["eager_steps"] += 1
        return tok[:n].tolist(), lp[:n].tolist()

    def _buffers(self, size: int) -> _Bucket:
        if size not in self._bufs:
            self._bufs[size] = _Bucket(size, self.pad_slot, self.device)
        return self._bufs[size]

    def _run(self, buf: _Bucket, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model.decode_step(buf.ids, buf.slots, buf.lens, self.cache)
        keys = row_keys(buf.seeds, buf.lens)
        return sample_counter(logits, params, keys, self._vkeys, self._temp)

    def _graph(self, buf: _Bucket, params: SamplingParams) -> Any:
        key = (buf.size, params.temperature == 0, params.top_k, params.top_p)
        if key not in self._graphs:
            self._graphs[key] = self._capture(buf, params)
        return self._graphs[key]

    def _capture(self, buf: _Bucket, params: SamplingParams) -> Any:
        """Warm up on a side stream (compiles kernels, allocates workspaces), then capture. The
        buffers' current contents are the live batch; the capture's own writes go to the same
        places the replay that follows writes, so they change nothing."""
        saved = [t.clone() for t in (buf.ids, buf.slots, buf.lens, buf.seeds)]
        # capture and warm-up on padding rows only: their K/V lands in the scratch slot
        buf.fill([], [], [], [])
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self._run(buf, params)
        torch.cuda.current_stream().wait_stream(s)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._run(buf, params)
        for t, v in zip((buf.ids, buf.slots, buf.lens, buf.seeds), saved):
            t.copy_(v)
        self.stats["graphs_captured"] += 1
        return graph, out

    def reset(self) -> None:
        """Drop captured graphs (e.g. before freeing the engine)."""
        self._graphs.clear()
