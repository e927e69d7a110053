"""CUDA graphs of the engine's short prefill chunks (a turn's new tokens: observation + template).

Why: a delta prefill is light for the GPU and heavy in launches. At the 1.7B shape, 64 rows of
~130 new tokens take ~30 ms of W8A8 kernels through ~10 launches a layer, and a Triton launch
costs the GPU machine's host 40–80 µs, so run eagerly the GPU waits for the host (round 29's
profile of a rollout: the GPU idle 21 % of the W8A8 rollout against 8 % of bf16's, mostly in the
prefills; docs/kernels-history.md, round 29). `PrefillRunner` captures a chunk's forward once per (rows, tokens,
key length) bucket and replays it: one graph launch instead of ~300 kernel launches.

Shapes. Rows pad to the decode buckets (`decode.bucket_sizes`); a padding row feeds one token into
the scratch slot no episode owns, as padding rows of a decode step do. Tokens pad to
`token_buckets`: padding tokens are invalid, write no K/V, and their outputs are dropped. The key
length (what the prefill kernel's dequantized cache copy allocates) pads to a power of two. What
changes from call to call lives in static buffers written before each replay; weights and the
cache are updated in place, so graphs stay valid across weight syncs.

Count. Buckets multiply (row buckets × token buckets × key lengths): a run whose observation
lengths vary widely could capture hundreds of graphs, each costing ~3 forwards. Past `max_graphs`
a chunk of a bucket not yet captured runs eagerly, unpadded (the engine's own path); the buckets
captured by then keep replaying.

Bits. Each kernel on this path computes a valid token from its own row (integer GEMMs, per-token
activation codes, per-row norms, per-row attention), so the padding changes none of its bits,
except through the prefill attention's cache read, which depends on the chunk's length (codes in
place below `COPY_MIN_TOKENS`, a dequantized copy from there on; they round differently): a chunk
whose padding would switch the read runs eagerly, unpadded. Graph replay and eager execution of
the same padded chunk give the same bits (tests/rollout/test_engine_cuda.py). A bf16 engine's
cuBLAS GEMMs may pick another kernel for the padded row count, so its rounding can differ from
the unpadded forward's, as it does between any two batch compositions.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from agentq.kernels import attention as attn_ops
from agentq.kernels.triton_prefill import COPY_MIN_TOKENS
from agentq.utils.device import ASYNC_H2D
from agentq.utils.errors import first_line

from .decode import bucket_sizes, capture_graph
from .kv_cache import KVCache
from .model import EngineModel

log = logging.getLogger(__name__)

#: the longest chunk (tokens per row) replayed from a graph by default: a turn's observation and
#: template; longer chunks (first-turn prompts) keep the GPU busy on their own and run eagerly
DEFAULT_MAX_TOKENS = 256

#: the most prefill graphs captured by default: bounds the capture time (~3 forwards a graph) of a run
#: whose chunks spread over many of the hundreds of buckets; the buckets met first keep theirs
DEFAULT_MAX_GRAPHS = 64


def token_buckets(max_tokens: int) -> list[int]:
    """Chunk lengths a graph is captured for: steps of 16 up to 128, of 32 up to 256, of 64 beyond
    (a chunk is padded up to the next one), with an edge at `COPY_MIN_TOKENS` − 1 so that a chunk
    shorter than that stays shorter (its cache read is the in-place one either way)."""
    sizes, t = {COPY_MIN_TOKENS - 1}, 16
    while t < max_tokens:
        sizes.add(t)
        t += 16 if t < 128 else (32 if t < 256 else 64)
    sizes.add(max_tokens)
    return sorted(s for s in sizes if s <= max_tokens)


def key_bucket(key_len: int, max_len: int) -> int:
    """The key length a graph is captured for: the next power of two ≥ key_len (at least 64),
    at most the slot length."""
    return min(max(64, 1 << (key_len - 1).bit_length()), max_len)


def chunk_inputs(slots: list[int], pieces: list[list[int]], lens: list[int], rows: int, tokens: int,
                 pad_slot: int) -> tuple[torch.Tensor, ...]:
    """A prefill chunk as `EngineModel.forward` takes it, built on the host: row i feeds pieces[i]
    into slots[i] from position lens[i] (its first len(pieces[i]) tokens valid, the rest padding at
    position 0); rows past the pieces feed one token into `pad_slot`.

    Returns:
        (ids, positions, valid) [rows, tokens], (slots, new_lens, last) [rows]: last is each row's
        last valid token, whose logits start its turn.
    """
    n = len(pieces)
    ids = torch.zeros(rows, tokens, dtype=torch.long)
    counts = torch.ones(rows, dtype=torch.long)
    starts = torch.zeros(rows, dtype=torch.long)
    slot_t = torch.full((rows,), pad_slot, dtype=torch.long)
    for i, p in enumerate(pieces):
        ids[i, :len(p)] = torch.tensor(p)
    counts[:n] = torch.tensor([len(p) for p in pieces])
    starts[:n] = torch.tensor(lens)
    slot_t[:n] = torch.tensor(slots)
    ar = torch.arange(tokens)
    valid = ar[None, :] < counts[:, None]
    pos = torch.where(valid, starts[:, None] + ar[None, :], 0)
    return ids, pos, valid, slot_t, starts + counts, counts - 1


class _ChunkBuffers:
    """Static inputs of one (rows, tokens) bucket, as `EngineModel.forward` takes them, plus the
    token whose logits each row returns (its last valid one)."""

    def __init__(self, rows: int, tokens: int, pad_slot: int, vocab: int, device: torch.device):
        self.rows, self.tokens, self.pad_slot = rows, tokens, pad_slot
        long = torch.long
        self.ids = torch.zeros(rows, tokens, dtype=long, device=device)
        self.pos = torch.zeros(rows, tokens, dtype=long, device=device)
        self.valid = torch.zeros(rows, tokens, dtype=torch.bool, device=device)
        self.slots = torch.zeros(rows, dtype=long, device=device)
        self.new_lens = torch.zeros(rows, dtype=long, device=device)
        self.last = torch.zeros(rows, dtype=long, device=device)
        self.row_idx = torch.arange(rows, dtype=long, device=device)
        # the logits land here, outside the graphs' pool: a graph then holds no output of its own,
        # so the pool's memory is one forward's working set however many buckets are captured
        self.logits = torch.empty(rows, vocab, dtype=torch.float32, device=device)

    def fill(self, slots: list[int], pieces: list[list[int]], lens: list[int]) -> None:
        """Write `chunk_inputs` of these pieces into the buffers, one copy per buffer (without a
        stream sync unless `AGENTQ_ASYNC_H2D=0`: a pageable source is staged before it returns)."""
        host = chunk_inputs(slots, pieces, lens, self.rows, self.tokens, self.pad_slot)
        for buf, h in zip((*self.tensors(), self.last), host):
            buf.copy_(h, non_blocking=ASYNC_H2D)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.pos, self.valid, self.slots, self.new_lens


class PrefillRunner:
    """Prefill chunks through padded buckets, replayed from CUDA graphs (or run eagerly over the
    same padded shapes when `use_graphs` is False: the CPU tests' mode).

    Args:
        model, cache: the engine's; `pad_slot` is a slot no episode owns (padding rows write there).
        max_rows: the most rows a chunk has (the engine's slots).
        max_tokens: the longest chunk taken (tokens per row); 0 turns the runner off.
        use_graphs: capture / replay CUDA graphs (CUDA only).
        max_graphs: with `use_graphs`, the most graphs captured; a chunk of a bucket met after that
            runs eagerly, unpadded (`bucket` declines it). 0: no graphs. Not applied without graphs.
    """

    def __init__(self, model: EngineModel, cache: KVCache, pad_slot: int, max_rows: int, max_tokens: int,
                 use_graphs: bool, max_graphs: int = DEFAULT_MAX_GRAPHS):
        self.model, self.cache, self.pad_slot, self.max_graphs = model, cache, pad_slot, max_graphs
        self.device = model.device
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.enabled = max_tokens > 1 and model.prefill_capturable(cache)
        self.row_buckets = bucket_sizes(max_rows)
        self.token_buckets = token_buckets(max_tokens) if max_tokens > 1 else []
        self._bufs: dict[tuple[int, int], _ChunkBuffers] = {}
        self._graphs: dict[tuple[int, int, int], tuple[Any, torch.Tensor] | None] = {}
        self._pool: Any = None
        # uncaptured_chunks: declined because their bucket has no graph and `max_graphs` are taken
        self.stats = {"graph_replays": 0, "padded_eager_chunks": 0, "graphs_captured": 0, "declined_chunks": 0,
                      "uncaptured_chunks": 0}

    def bucket(self, rows: int, tokens: int, key_len: int) -> tuple[int, int, int] | None:
        """The (rows, tokens, key length) bucket that takes a chunk, or None: the runner is off, the
        chunk is too large or a single token per row (the decode kernel's path), its padding
        would change how the prefill attention reads the cache, or its bucket has no graph and
        `max_graphs` are already taken."""
        if not self.enabled or tokens < 2:
            return None
        b = next((s for s in self.row_buckets if s >= rows), None)
        t = next((s for s in self.token_buckets if s >= tokens), None)
        if b is None or t is None:
            return None
        k = key_bucket(key_len, self.cache.max_len)
        k_cache = self.cache.k[0]
        if attn_ops.prefill_cache_read(k_cache, rows, tokens, key_len) != attn_ops.prefill_cache_read(k_cache, b, t, k):
            self.stats["declined_chunks"] += 1
            return None
        return None if self._over_cap((b, t, k)) else (b, t, k)

    def _over_cap(self, key: tuple[int, int, int]) -> bool:
        """Whether bucket `key` would need a graph past `max_graphs` (a failed capture, stored as
        None, holds its place); warns the first time."""
        if not self.use_graphs or key in self._graphs or len(self._graphs) < self.max_graphs:
            return False
        self.stats["uncaptured_chunks"] += 1
        if self.stats["uncaptured_chunks"] == 1:
            log.warning("the cap of %d prefill CUDA graphs is reached: chunks of buckets not captured (first %s) "
                        "run eagerly, unpadded; rollout.prefill_graph_max raises the cap", self.max_graphs, key)
        return True

    def run(self, key: tuple[int, int, int], slots: list[int], pieces: list[list[int]], lens: list[int]
            ) -> torch.Tensor:
        """Feed pieces[i] into slots[i] (whose cache holds lens[i] tokens) through bucket `key`
        (`bucket`). Returns the logits of each piece's last token, [len(pieces), V] fp32."""
        b, t, k = key
        buf = self._bufs.get((b, t))
        if buf is None:
            buf = self._bufs[(b, t)] = _ChunkBuffers(b, t, self.pad_slot, self.model.config.vocab_size, self.device)
        graph = self._graph(buf, k) if self.use_graphs else None     # captured before the fill below
        buf.fill(slots, pieces, lens)
        if graph is not None:
            graph[0].replay()
            out = graph[1]
            self.stats["graph_replays"] += 1
        else:
            out = self._forward(buf, k)
            self.stats["padded_eager_chunks"] += 1
        # a copy: the next replay of this graph overwrites its output
        return out[:len(pieces)].clone()

    def _forward(self, buf: _ChunkBuffers, key_len: int) -> torch.Tensor:
        return buf.logits.copy_(self.model(*buf.tensors(), self.cache, logit_rows=(buf.row_idx, buf.last),
                                           key_len=key_len))

    def _graph(self, buf: _ChunkBuffers, key_len: int) -> tuple[Any, torch.Tensor] | None:
        """The bucket's graph and its output, captured on first use; None where a capture failed
        (that bucket then runs eagerly over the same padded shapes: the same bits)."""
        key = (buf.rows, buf.tokens, key_len)
        if key not in self._graphs:
            try:
                self._graphs[key] = self._capture(buf, key_len)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as err:     # AcceleratorError is a RuntimeError
                log.warning("CUDA graph capture of prefill bucket %s failed (%s: %s); it runs eagerly", key,
                            type(err).__name__, first_line(err))
                self._graphs[key] = None
        return self._graphs[key]

    def _capture(self, buf: _ChunkBuffers, key_len: int) -> tuple[Any, torch.Tensor]:
        """Capture (`capture_graph`) on padding rows only: their one token lands in the scratch slot."""
        buf.fill([], [], [])
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph, out = capture_graph(lambda: self._forward(buf, key_len), self._pool)
        self.stats["graphs_captured"] += 1
        return graph, out

    def reset(self) -> None:
        """Drop captured graphs and their memory pool's hold (e.g. before freeing the engine)."""
        self._graphs.clear()
        self._pool = None
