"""CUDA graphs of the learner's packed forwards (and of the training backward).

Why: on a GPU the aligned learner waits on the host. Each aligned linear is a few Triton launches,
each costing the host several torch ops' time, so at ~8k tokens per forward the 1B-shaped step ran
1.2–1.4× bf16's wall time at ~1.03× its GPU time. A graph replays a whole forward (or backward)
with one host call.

How: a packed micro-batch (`packing.py`) is one sequence whose shape depends only on its token
count and row count. Each pack is padded to a *bucket* (`Bucket`: a token count and a number of
row slots) and every bucket's forward is captured once and replayed for each pack that fits:

- **Padding.** The pack's tokens come first, then the padding tokens as rows of their own (token
  id 0, positions 0, 1, …), then empty rows up to the bucket's row slots. Every op of the model is per
  token except attention, and the varlen attention (`qat.varlen_inputs`) keeps each row inside its
  own boundaries, so the real rows' log-probs are the pack's own. (The GEMMs see more rows: the
  int8 GEMM's per-row sums are exact whatever the row count; a bf16 GEMM may pick another
  algorithm for another M and round differently.)
- **Static inputs.** Token ids, positions and row boundaries live in device buffers that each
  call overwrites before the replay; the attention's grid is sized by the bucket (its row slots
  and longest row), not by the pack.
- **The LM head** runs only where a token is scored (the learner's action tokens): a bucket also
  has a head count, the pack's scored tokens rounded up (`head_positions`), and a buffer of those
  positions, the scored ones first and distinct unscored ones after them, which the caller zeroes.
- **Weights.** The parameters are read in place (the optimizer writes them in place); their
  int8 codes (and W_fq, the transposed codes) sit in pinned `WeightCache`s, which the runner
  brings up to date in place before every replay (`qat.pin_weight_caches`).
- **Training.** The forward graph and the backward graph are captured as a pair (the way
  `torch.cuda.make_graphed_callables` does): the backward graph computes the parameters'
  gradients from a static output gradient and adds them into static buffers that are the
  parameters' `.grad`. The eager loss sits between the two; `_GraphedForward.backward` copies its
  gradient in and replays the backward graph, so micro-batches accumulate as before.
- **Memory.** All graphs of a learner share one memory pool (`GraphPool`; its passes never run
  at the same time): it holds about the largest pass's eager peak (training: forward +
  backward's), kept for the learner's lifetime. Eager passes cannot reuse it, so a capture that
  runs out of memory drops every graph (`GraphPool.release`) and all passes run eagerly from then
  on: the run goes on where the next eager pack would have run out as well. The training
  graphs add their gradients into one set of buffers outside it, which serve as the parameters'
  `.grad` (`PackGraphs.accumulate`).

Packs that fit no bucket (a row longer than `max_tokens`, more rows than `max_rows`), or that come
after `max_graphs` buckets were captured, run eagerly: `run` returns None and the caller takes its
eager path. CPU runs never capture: `capture=False` runs the same padded function eagerly, which
is how the padding and the gradient bookkeeping are tested without a GPU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from agentq.utils.errors import first_line

from .packing import PackLayout
from .qat import pin_weight_caches, release_activation_cache

log = logging.getLogger(__name__)

#: padded forwards run before a capture (on a side stream): they compile Triton kernels, pick
#: cuBLAS algorithms and fill the weight caches, none of which may happen during a capture
WARMUP_RUNS = 2

#: a bucket's token count is a multiple of max_tokens / GRANULES (itself a multiple of 64): a pack
#: pays for at most that many padding tokens
GRANULES = 32

#: a bucket's head positions are a multiple of its tokens / HEAD_STEPS (rounded up to 64): the head
#: of a pack that scores few tokens runs at that many positions, not at all of them
HEAD_STEPS = 8

#: a function of the static inputs (ids [1, T] long, positions [1, T] long, row boundaries [R + 1]
#: int32, max row length, head positions [H] long or None = every position) returning [1, T] fp32
#: log-probs, real at the positions the head ran for (`learner.packed_forward`)
PackedForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class Bucket:
    """A captured shape: `tokens` positions, `rows` row slots (the pack's rows, its padding rows,
    then empty rows), `max_len`, the longest row it admits (padding rows included), which sizes
    the attention's grid, and `heads`, the positions the LM head runs at (0: all of them)."""
    tokens: int
    rows: int
    max_len: int
    heads: int = 0


def _pow2_at_least(n: int, floor: int) -> int:
    out = floor
    while out < n:
        out *= 2
    return out


def head_positions(tokens: int, scored: int) -> int:
    """The head positions of a bucket of `tokens` for a pack that scores `scored` tokens: `scored`
    rounded up to a step of tokens / `HEAD_STEPS` (a multiple of 64), or 0 (every position) where
    that would reach the token count (no saving, and no unscored target left to pad with,
    `padded_head_positions`)."""
    step = -(-tokens // (HEAD_STEPS * 64)) * 64
    heads = -(-max(scored, 1) // step) * step
    return heads if heads < tokens else 0


def choose_bucket(total: int, rows: int, longest: int, max_tokens: int, max_rows: int,
                  scored: int | None = None) -> Bucket | None:
    """The smallest bucket a pack of `total` tokens in `rows` rows, the longest `longest`, fits;
    None: run it eagerly.

    Token counts: `total` rounded up to a multiple of the granule, max_tokens / `GRANULES` rounded
    up to a multiple of 64, so a pack pays for at most a granule of padding (each size is one more
    capture; packs of a budget fill it to within a row, so few sizes recur). Row length: the next power of two ≥ longest, from 128 (flash attention's query tile), at most
    the token count: an attention grid sized for the whole bucket would be mostly empty programs.
    The padding is cut into rows of at most that length. Row slots: the next power of two ≥ the
    rows plus padding rows, at least 2. Head positions (`scored`, the pack's scored tokens; None:
    every position): `head_positions`."""
    if total < 1 or rows < 1 or not 1 <= longest <= total:
        raise ValueError(f"a pack needs at least one row and one token, its longest row within it "
                         f"(got {rows} rows, {total} tokens, longest {longest})")
    granule = -(-max_tokens // (GRANULES * 64)) * 64
    if total > -(-max_tokens // granule) * granule:
        return None
    tokens = -(-total // granule) * granule
    max_len = min(_pow2_at_least(longest, 128), tokens)
    pad_rows = -(-(tokens - total) // max_len)
    slots = _pow2_at_least(rows + pad_rows, 2)
    heads = 0 if scored is None else head_positions(tokens, scored)
    return Bucket(tokens, slots, max_len, heads) if slots <= max_rows else None


def padded_head_positions(packed_scored: torch.Tensor, bucket: Bucket) -> torch.Tensor:
    """[bucket.heads] long: the positions t − 1 before the pack's scored tokens t, then positions
    before unscored ones (real rows' or padding's; distinct, and zeroed by the caller's mask, so
    their log-probs carry no gradient) up to the bucket's count."""
    flags = torch.zeros(bucket.tokens, dtype=torch.bool)
    flags[: packed_scored.numel()] = packed_scored.reshape(-1).cpu().bool()
    flags[0] = False                                   # position 0 has no logits before it
    before_scored = flags[1:].nonzero().flatten()
    fill = (~flags[1:]).nonzero().flatten()[: bucket.heads - before_scored.numel()]
    if before_scored.numel() + fill.numel() != bucket.heads:
        raise ValueError(f"a pack scoring {before_scored.numel()} tokens does not fit {bucket}")
    return torch.cat([before_scored, fill])


def padded_inputs(layout: PackLayout, packed_ids: torch.Tensor, bucket: Bucket
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [1, T], positions [1, T], row boundaries [R + 1] int32) of a pack padded to `bucket`
    (module docstring), on the CPU. packed_ids: [total] or [1, total], the pack's tokens. The
    padding rows hold token 0 at positions 0, 1, … (finite activations whose gradient is exactly
    zero: the loss never reads them). The head positions come from `padded_head_positions`."""
    total, t, m = layout.total, bucket.tokens, bucket.max_len
    pad_ends = list(range(total + m, t, m)) + ([t] if t > total else [])
    if layout.num_rows + len(pad_ends) > bucket.rows or int(layout.lengths.max()) > m:
        raise ValueError(f"a pack of {layout.num_rows} rows and {total} tokens does not fit {bucket}")
    ids = torch.zeros(1, t, dtype=torch.long)
    ids[0, :total] = packed_ids.reshape(-1).cpu()
    pad_pos = torch.arange(t - total) % m
    pos = torch.cat([layout.position_ids()[0], pad_pos]).unsqueeze(0)
    bounds = torch.full((bucket.rows + 1,), t, dtype=torch.int32)
    bounds[: layout.num_rows + 1] = layout.bounds().to(torch.int32)
    bounds[layout.num_rows + 1: layout.num_rows + 1 + len(pad_ends)] = torch.tensor(pad_ends, dtype=torch.int32)
    return ids, pos, bounds


@dataclass
class _Entry:
    """One bucket's static buffers and graphs (graph None: run eagerly, `capture=False`)."""
    bucket: Bucket
    ids: torch.Tensor
    pos: torch.Tensor
    bounds: torch.Tensor
    heads: torch.Tensor | None = None          # the head positions (None: every position)
    out: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None
    bwd_graph: torch.cuda.CUDAGraph | None = None
    grad_out: torch.Tensor | None = None


class GraphPool:
    """The memory pool a learner's runners share, and the training forward in flight.

    The passes never overlap (π_old and π_ref before the update, each micro-batch's forward then
    its backward), so one pool serves all of them: it holds the largest pass's peak, not the sum.
    The one condition is that nothing replays between a training forward and its backward (their
    activations are pool memory another graph may use): `pending` marks that window, and a replay
    inside it is refused."""

    def __init__(self, capture: bool = True):
        self.handle = torch.cuda.graph_pool_handle() if capture else None
        self.pending: _Entry | None = None
        self.runners: list[PackGraphs] = []
        self.released: str | None = None       # why the graphs were dropped (`release`); None: in use

    def release(self, why: str) -> None:
        """Drop every graph of the pool and capture none after: its memory goes back to the eager
        passes. A capture that runs out of memory calls it: the pool keeps about the largest pass's
        peak, which eager passes cannot use, so the next eager pack would run out too, hours into a
        run perhaps (new pack shapes are captured as they come); without graphs the run goes on."""
        held = self.held_bytes()
        for runner in self.runners:
            runner.entries.clear()
        self.released, self.pending = why, None
        torch.cuda.empty_cache()
        log.warning("CUDA graphs off for the rest of the run (%s): the %s their pool held go back to the eager "
                    "passes; trainer.cuda_graphs=false or a lower pack_tokens avoids this", why,
                    f"{held / 2**30:.1f} GiB" if held else "memory")

    def clear_pending(self) -> None:
        """Forget a training forward whose backward will not run (e.g. its step failed)."""
        self.pending = None

    def held_bytes(self) -> int | None:
        """Device memory this pool's segments hold now (None: no pool, or the allocator's snapshot
        does not say). Read only when an out-of-memory error is explained: a snapshot is slow."""
        if self.handle is None:
            return None
        try:
            segments = torch.cuda.memory_snapshot()
        except (RuntimeError, AttributeError):
            return None
        ours = tuple(self.handle) if isinstance(self.handle, (tuple, list)) else None
        if ours is None:
            return None
        if not segments:                 # nothing allocated on the device yet (a fresh process)
            return 0
        if "segment_pool_id" not in segments[0]:
            return None
        return sum(s["total_size"] for s in segments if tuple(s["segment_pool_id"]) == ours)


class _Call(nn.Module):
    """The padded forward as a module over the model, so `torch.func.functional_call` can run it
    on aliases of the parameters (`PackGraphs._capture`)."""

    def __init__(self, model: nn.Module, forward: PackedForward):
        super().__init__()
        self.model, self.fn = model, forward

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, bounds: torch.Tensor, max_len: int,
                heads: torch.Tensor | None) -> torch.Tensor:
        return self.fn(ids, pos, bounds, max_len, heads)


class PackGraphs:
    """The packed forward of one model, captured per bucket and replayed (module docstring).

    Args:
        model: the (aligned) HF causal LM; its weight caches are pinned.
        forward: the padded forward (`PackedForward`), e.g. `learner.packed_forward` bound to model.
        max_tokens: the largest bucket (the pass's pack budget); max_rows: most row slots.
        train: capture the backward too (the forward then runs with autograd); else no-grad.
        max_graphs: buckets captured at most; later shapes run eagerly (a warning says so once).
        pool: the `GraphPool` to share (None: one of its own).
        capture: False = run the padded forward eagerly (CPU; tests).
    """

    def __init__(self, model: nn.Module, forward: PackedForward, max_tokens: int, *, train: bool,
                 max_rows: int = 256, max_graphs: int = 16, pool: GraphPool | None = None, capture: bool = True):
        if capture and not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a GPU (capture=False runs the padded forward eagerly)")
        self.model, self.forward, self.train = model, forward, train
        self.max_tokens, self.max_rows, self.max_graphs, self.capture = max_tokens, max_rows, max_graphs, capture
        self.device = next(model.parameters()).device
        self.pool = pool or GraphPool(capture)
        self.pool.runners.append(self)
        self.entries: dict[Bucket, _Entry] = {}
        self.failed: set[Bucket] = set()       # buckets whose capture failed: eager from then on
        self.anchor = torch.zeros((), device=self.device, requires_grad=True)   # gives a replay a backward
        # the gradient accumulators: one buffer per trainable parameter, shared by all buckets;
        # the backward graphs add into them, and they are the parameters' .grad (`accumulate`)
        self.trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad] if train else []
        self.grad_bufs: list[torch.Tensor] | None = None
        self.replays = 0
        self.eager_packs = 0                   # packs left to the caller's eager path
        self._warned = False
        pin_weight_caches(model)

    def run(self, layout: PackLayout, packed_ids: torch.Tensor,
            packed_scored: torch.Tensor | None = None) -> torch.Tensor | None:
        """[1, T] fp32 log-probs of the padded pack (positions ≥ layout.total are padding), or None
        when the pack is left to the caller's eager path (it fits no bucket, `max_graphs` were
        captured, or its bucket's capture failed). In training mode the result carries a backward
        that replays the backward graph; no graph of the pool may replay before it has run.
        `packed_scored` ([1, total] bool, None = all): the tokens whose log-probs are wanted; the
        head then runs at the bucket's head positions, and the caller must zero the other tokens
        (some hold the log-probs of the filler positions)."""
        scored = None if packed_scored is None else int(packed_scored.reshape(-1)[1:].sum())
        bucket = choose_bucket(layout.total, layout.num_rows, int(layout.lengths.max()), self.max_tokens,
                               self.max_rows, scored)
        if (bucket is None or bucket in self.failed or self.pool.released is not None
                or (bucket not in self.entries and len(self.entries) >= self.max_graphs)):
            self.eager_packs += 1
            if bucket is not None and bucket not in self.failed and self.pool.released is None and not self._warned:
                log.warning("CUDA graphs: %d buckets captured already; packs of other shapes run eagerly",
                            self.max_graphs)
                self._warned = True
            return None
        if self.pool.pending is not None:
            raise RuntimeError("a CUDA graph replay before the backward of the graphed training forward in "
                               "flight: they share memory (GraphPool.clear_pending() after a failed step)")
        ids, pos, bounds = padded_inputs(layout, packed_ids, bucket)
        heads = padded_head_positions(packed_scored, bucket) if bucket.heads and packed_scored is not None else None
        pin_weight_caches(self.model)        # codes of weights the optimizer changed, rewritten in place
        entry = self.entries.get(bucket)
        if entry is None:
            entry = _Entry(bucket, ids.to(self.device), pos.to(self.device), bounds.to(self.device),
                           None if heads is None else heads.to(self.device))
            if self.capture and not self._capture(entry):
                self.failed.add(bucket)
                self.eager_packs += 1
                return None
            self.entries[bucket] = entry
        else:
            entry.ids.copy_(ids)
            entry.pos.copy_(pos)
            entry.bounds.copy_(bounds)
            if entry.heads is not None and heads is not None:     # the same bucket: both or neither
                entry.heads.copy_(heads)
        if not self.capture:                 # eager: the same padded function, autograd as usual
            return self.forward(entry.ids, entry.pos, entry.bounds, bucket.max_len, entry.heads)
        assert entry.graph is not None and entry.out is not None
        entry.graph.replay()
        self.replays += 1
        if not self.train:
            return entry.out
        self.pool.pending = entry
        return _GraphedForward.apply(self.anchor, entry, self)

    def _capture(self, e: _Entry) -> bool:
        """Capture e's graphs (after warm-up runs on a side stream); False, with a warning, if the
        capture failed (the bucket then runs eagerly).

        A training capture runs the model on fresh aliases of its parameters (same storage and
        version counter, so the optimizer's writes and the weight caches see through them) and
        takes the gradients with respect to those: autograd's gradient accumulators of the real
        parameters may belong to a graph from an eager pass still alive on another stream, and a
        capture that touched them would be invalidated."""
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    alias = self._aliases()
                    out = self._padded_forward(e, alias)
                    if self.train:
                        torch.autograd.grad(out, list(alias.values()), grad_outputs=torch.zeros_like(out),
                                            allow_unused=True)
                    del out, alias
                    release_activation_cache(self.model)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._record(e)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as err:       # AcceleratorError is a RuntimeError
            log.warning("CUDA graph capture of %s failed (%s: %s); packs of this shape run eagerly",
                        e.bucket, type(err).__name__, first_line(err))
            e.graph = e.bwd_graph = None
            if isinstance(err, torch.OutOfMemoryError):
                self.pool.release(f"the capture of {e.bucket} ran out of device memory")
            return False
        finally:
            release_activation_cache(self.model)
        log.info("CUDA graph captured: %s (%s)", e.bucket, "forward + backward" if self.train else "forward")
        return True

    def _aliases(self) -> dict[str, torch.Tensor]:
        """Fresh leaf aliases of the trainable parameters, by their names under `_Call` ({} no-grad)."""
        return {f"model.{n}": p.detach().requires_grad_() for n, p in self.trainable}

    def _padded_forward(self, e: _Entry, alias: dict[str, torch.Tensor]) -> torch.Tensor:
        args = (e.ids, e.pos, e.bounds, e.bucket.max_len, e.heads)
        call = _Call(self.model, self.forward)
        out = torch.func.functional_call(call, alias, args) if alias else call(*args)
        release_activation_cache(self.model)
        return out

    def _record(self, e: _Entry) -> None:
        """The capture proper: the forward graph, and for training the backward graph that adds
        the gradients into the accumulators (`accumulate`)."""
        alias = self._aliases()
        e.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(e.graph, pool=self.pool.handle):
            out = self._padded_forward(e, alias)
        if self.train:
            if self.grad_bufs is None:
                self.grad_bufs = [torch.zeros_like(p) for _, p in self.trainable]
            e.grad_out = torch.zeros_like(out)
            e.bwd_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(e.bwd_graph, pool=self.pool.handle):
                grads = torch.autograd.grad(out, list(alias.values()), grad_outputs=e.grad_out, allow_unused=True)
                # added where autograd would accumulate them (a parameter the loss does not reach,
                # allow_unused, gets nothing); a capture records the add, it does not run it
                torch._foreach_add_([b for b, g in zip(self.grad_bufs, grads) if g is not None],
                                    [g for g in grads if g is not None])
        e.out = out.detach()

    def accumulate(self, e: _Entry, grad: torch.Tensor) -> None:
        """The backward of a replayed training forward: its gradients added into the parameters'
        `.grad`, as autograd would. Each `.grad` is made the runner's buffer first: a parameter
        without one gets the zeroed buffer (after `zero_grad(set_to_none=True)`), one whose `.grad`
        is another tensor (an eager micro-batch's, a reduce's) has it copied in; the backward graph
        then adds in place, with no copy beyond what eager accumulation does."""
        assert e.grad_out is not None and e.bwd_graph is not None and self.grad_bufs is not None
        fresh = [b for (_, p), b in zip(self.trainable, self.grad_bufs) if p.grad is None]
        if fresh:
            torch._foreach_zero_(fresh)
        for (_, p), b in zip(self.trainable, self.grad_bufs):
            if p.grad is None:
                p.grad = b
            elif p.grad is not b:
                b.copy_(p.grad)
                p.grad = b
        e.grad_out.copy_(grad)
        e.bwd_graph.replay()
        self.pool.pending = None


class _GraphedForward(torch.autograd.Function):
    """A replayed training forward as an autograd node: its output is a copy of the graph's
    static output, its backward replays the backward graph (`PackGraphs.accumulate`)."""

    @staticmethod
    def forward(ctx, anchor, entry, runner):
        ctx.entry, ctx.runner = entry, runner
        return entry.out.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.runner.accumulate(ctx.entry, grad)
        return None, None, None
