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

Run-ahead (`launch` / `launch_next` / `DecodeStep.result`): every step ends by advancing its own
inputs on the device (the sampled tokens become the next ids, live rows' lengths grow by one), so
the next step can be queued before the host has read this one's tokens. `TorchEngine.generate`
keeps one step in flight that way: the host's per-step work (reading the tokens back, stop checks,
bookkeeping, filling buffers) overlaps the GPU's next step instead of leaving the GPU idle. Rows
that turn out to have finished are dropped from the step after by a device-side gather; the one
extra token such a row computed is discarded, and its K/V lands one position past the row's
cached length, where the next turn's prefill writes anyway.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from agentq.rollout.backend import SamplingParams
from agentq.utils.device import device_tensor

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


def capture_graph(run: Callable[[], Any], pool: Any) -> tuple[Any, Any]:
    """A CUDA graph of `run()` in memory pool `pool`, and the outputs its capture returned (the
    tensors each replay rewrites). Two runs on a side stream first compile kernels and allocate
    workspaces, which a capture may not do; they and the capture write what a replay of the
    current inputs writes."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


class _Bucket:
    """Static inputs of one bucket: token ids, slots, slot lengths after the step, seeds, and
    `live` (1 for a live row, 0 for padding: how much a step advances each row's length)."""

    def __init__(self, size: int, pad_slot: int, device: torch.device):
        self.size = size
        self.ids = torch.zeros(size, dtype=torch.long, device=device)
        self.slots = torch.full((size,), pad_slot, dtype=torch.long, device=device)
        self.lens = torch.ones(size, dtype=torch.long, device=device)
        self.seeds = torch.zeros(size, dtype=torch.int64, device=device)
        self.live = torch.zeros(size, dtype=torch.long, device=device)
        self.pad_slot = pad_slot

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.slots, self.lens, self.seeds, self.live

    def fill(self, ids: list[int], slots: list[int], lens: list[int], seeds: list[int]) -> None:
        n, dev = len(ids), self.ids.device
        pad = self.size - n
        for buf, vals, fill in ((self.ids, ids, 0), (self.slots, slots, self.pad_slot), (self.lens, lens, 1),
                                (self.seeds, seeds, 0), (self.live, [1] * n, 0)):
            host = torch.tensor(list(vals) + [fill] * pad, dtype=buf.dtype)
            buf.copy_(host.to(dev, non_blocking=True))

    def gather_from(self, src: "_Bucket", keep: list[int]) -> None:
        """Rows `keep` of `src` (as its last step left them on the device) become this bucket's
        live rows, in that order; the rest is padding. No host synchronisation."""
        n, dev = len(keep), self.ids.device
        idx = torch.tensor(keep, dtype=torch.long).to(dev, non_blocking=True)
        rows = [t.index_select(0, idx) for t in src.tensors()]     # copies: src may be this bucket
        for buf, vals, fill in zip(self.tensors(), rows, (0, self.pad_slot, 1, 0, 0)):
            buf[n:].fill_(fill)
            buf[:n].copy_(vals)


@dataclass
class DecodeStep:
    """One queued decode step whose tokens the host has not necessarily read yet.

    `rows` are the caller's row identities, in bucket order; `result()` waits for this step only
    (its tokens and log-probs are copied to host memory as soon as the step ends)."""

    rows: list[int]
    bucket: _Bucket
    tok: torch.Tensor
    lp: torch.Tensor
    done: Any = None                     # a CUDA event recorded after the copies (None on CPU)

    def positions(self, rows: list[int]) -> list[int]:
        """Where each of `rows` (a subset of self.rows) sits in this step's bucket."""
        where = {r: j for j, r in enumerate(self.rows)}
        return [where[r] for r in rows]

    def result(self, rows: list[int] | None = None) -> tuple[list[int], list[float]]:
        """(tokens, log-probs) of `rows` (default: all of this step's rows), once the step has ended."""
        if self.done is not None:
            self.done.synchronize()
        n = len(self.rows)
        tok, lp = self.tok[:n].tolist(), self.lp[:n].tolist()
        if rows is None or rows == self.rows:
            return tok, lp
        at = self.positions(rows)
        return [tok[j] for j in at], [lp[j] for j in at]


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
        self.stats = {"graph_replays": 0, "eager_steps": 0, "graphs_captured": 0, "queued_ahead": 0}
        self._flip = 0
        self._host = ([(torch.empty(max_batch + 1, dtype=torch.long, pin_memory=True),
                        torch.empty(max_batch + 1, dtype=torch.float32, pin_memory=True)) for _ in range(2)]
                      if self.device.type == "cuda" else [])

    # ------------------------------------------------------------------ sampling shared with prefill
    def sample(self, logits: torch.Tensor, params: SamplingParams, seeds: list[int], positions: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Counter-based draw for rows whose logits are already computed (the first token of a turn)."""
        dev = logits.device
        keys = row_keys(device_tensor(seeds, dev, torch.int64), device_tensor(positions, dev, torch.int64))
        self._temp.fill_(params.temperature if params.temperature > 0 else 1.0)
        return sample_counter(logits, params, keys, self._vkeys, self._temp)

    # ------------------------------------------------------------------ decode
    def step(self, ids: list[int], slots: list[int], new_lens: list[int], seeds: list[int],
             params: SamplingParams) -> tuple[list[int], list[float]]:
        """Feed ids[i] at position new_lens[i] - 1 of slots[i]; sample each row's next token (at
        position new_lens[i]). Returns (tokens, log-probs) of the live rows."""
        return self.launch(ids, slots, new_lens, seeds, params).result()

    def launch(self, ids: list[int], slots: list[int], new_lens: list[int], seeds: list[int],
               params: SamplingParams, rows: list[int] | None = None) -> DecodeStep:
        """Queue the step `step` describes, with its inputs written from the host. `rows` (default
        0..n-1) name the rows in the returned `DecodeStep`."""
        buf = self._buffers(self._bucket_for(len(ids)))
        buf.fill(ids, slots, new_lens, seeds)
        return self._queue(buf, list(range(len(ids))) if rows is None else rows, params)

    def launch_next(self, prev: DecodeStep, rows: list[int], params: SamplingParams) -> DecodeStep:
        """Queue the step after `prev` for `rows` (a subset of prev.rows, in their order there):
        each row feeds the token `prev` sampled for it, from the device, before the host has read
        it. Rows of prev not in `rows` are dropped by a device-side gather."""
        self.stats["queued_ahead"] += 1
        if rows == prev.rows:
            return self._queue(prev.bucket, rows, params)
        buf = self._buffers(self._bucket_for(len(rows)))
        buf.gather_from(prev.bucket, prev.positions(rows))
        return self._queue(buf, rows, params)

    def _bucket_for(self, n: int) -> int:
        size = next((b for b in self.buckets if b >= n), None) if self.graphable else n
        if size is None:
            raise ValueError(f"decode batch {n} exceeds the largest bucket {self.buckets[-1]}")
        return size

    def _queue(self, buf: _Bucket, rows: list[int], params: SamplingParams) -> DecodeStep:
        """Run or replay one step over `buf` (which it advances) and queue its outputs' copy to the host."""
        self._temp.fill_(params.temperature if params.temperature > 0 else 1.0)
        if self.graphable:
            graph, (tok, lp) = self._graph(buf, params)
            graph.replay()
            self.stats["graph_replays"] += 1
        else:
            tok, lp = self._run(buf, params)
            self.stats["eager_steps"] += 1
        if self.device.type != "cuda":
            return DecodeStep(rows, buf, tok.clone(), lp.clone())
        # two host buffers in turn: the step in flight and the one whose tokens are being read
        self._flip ^= 1
        host_tok, host_lp = self._host[self._flip]
        host_tok[:buf.size].copy_(tok, non_blocking=True)
        host_lp[:buf.size].copy_(lp, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return DecodeStep(rows, buf, host_tok, host_lp, done)

    def _buffers(self, size: int) -> _Bucket:
        if size not in self._bufs:
            self._bufs[size] = _Bucket(size, self.pad_slot, self.device)
        return self._bufs[size]

    def _run(self, buf: _Bucket, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model.decode_step(buf.ids, buf.slots, buf.lens, self.cache)
        keys = row_keys(buf.seeds, buf.lens)
        tok, lp = sample_counter(logits, params, keys, self._vkeys, self._temp)
        # advance the inputs for a following `launch_next` (a host `fill` overwrites them)
        buf.ids.copy_(tok)
        buf.lens.add_(buf.live)
        return tok, lp

    def _graph(self, buf: _Bucket, params: SamplingParams) -> Any:
        key = (buf.size, params.temperature == 0, params.top_k, params.top_p)
        if key not in self._graphs:
            self._graphs[key] = self._capture(buf, params)
        return self._graphs[key]

    def _capture(self, buf: _Bucket, params: SamplingParams) -> Any:
        """Capture (`capture_graph`) on padding rows, then put the live batch back in the buffers."""
        saved = [t.clone() for t in buf.tensors()]
        # capture and warm-up on padding rows only: their K/V lands in the scratch slot
        buf.fill([], [], [], [])
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph, out = capture_graph(lambda: self._run(buf, params), self._pool)
        for t, v in zip(buf.tensors(), saved):
            t.copy_(v)
        self.stats["graphs_captured"] += 1
        return graph, out

    def reset(self) -> None:
        """Drop captured graphs (e.g. before freeing the engine)."""
        self._graphs.clear()
