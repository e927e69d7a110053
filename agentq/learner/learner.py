"""The learner: an HF causal LM whose forward is aligned to the rollout quantization.

It computes old/reference log-probs, takes optimizer steps with a chosen `Objective`, and hands
its weights to the rollout engine by HF name. The master weights stay in full precision
(fp32 on CPU); with `learner_quant=aligned` every forward — old, reference, training — runs the
QuantSpec's fake quant (W8A8 via the integer path, KV round trip) with straight-through gradients.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from agentq.algos.objective import Objective
from agentq.kernels import attention
from agentq.kernels._interp import cuda_half
from agentq.kernels.logprob import token_logprobs
from agentq.kernels.quant_spec import QuantSpec
from agentq.kernels.ste import check_grad_input
from agentq.utils.checkpoint import CheckpointError
from agentq.utils.device import to_device
from agentq.utils.errors import first_line
from agentq.utils.memory import out_of_memory_hint

from .batch import PolicyBatch
from .graphs import GraphPool, PackGraphs
from .packing import (MIN_SHARED_TOKENS, PackLayout, SharedPackLayout, plan_packs, plan_shared_packs,
                      shared_prefix_groups)
from .qat import (align_model, invalidate_weight_caches, quantized_module_report, release_activation_cache,
                  segment_inputs, shares_prefixes, varlen_inputs)

#: where the LM head runs (`Learner(head_tokens=...)`): "actions", at the positions that predict
#: action tokens, the only log-probs an objective reads (`sequence_logprobs(scored=...)`); "all",
#: at every position, as a plain HF forward does (the A/B baseline of benchmarks)
HEAD_TOKENS = ("actions", "all")

#: where π_old comes from (`trainer.old_logp`): a no-grad pass before the update, or the update's
#: own first forward (`Learner.update`)
OLD_LOGP_MODES = ("recompute", "bypass")


def sequence_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      temperature: float = 1.0, position_ids: torch.Tensor | None = None,
                      scored: torch.Tensor | None = None, heads: torch.Tensor | None = None,
                      **model_kw: Any) -> torch.Tensor:
    """[B, L] log p(token_t | tokens_<t) in fp32 (position 0 = 0) under softmax(logits / temperature):
    the distribution a temperature-T sampler draws from, by `kernels.logprob.token_logprobs`
    (logit[target] − logsumexp: on CPU torch's fp32 ops; on CUDA one fused op that never builds an
    fp32 copy of the logits). attention_mask None = causal only (see `model_mask`); a 4D bool mask,
    `position_ids` (None: 0…L−1) and `model_kw` are passed to the model as they are (packing).

    `scored` ([B, L] bool, on the CPU; None = every token): the tokens whose log-probs are wanted,
    0 elsewhere. The LM head then runs only at the positions that predict them (HF's
    `logits_to_keep`; with B > 1, the union over the rows): in a multi-turn batch the actions are a
    fraction of the tokens, and the head is the widest GEMM of a small model (V = 151,936).
    `heads` ([K] long on the model's device, distinct, < L − 1): the positions to run the head at,
    given directly (a CUDA graph's static buffer, `graphs.padded_head_positions`); the caller
    zeroes the tokens it does not score.
    """
    if heads is None and scored is not None:
        heads = to_device(scored_columns(scored, input_ids.shape[1]), input_ids.device)
    if heads is not None and keeps_logits(model):
        model_kw["logits_to_keep"] = heads
    # use_cache=False: HF would otherwise fill a KV cache nobody reads (two concatenations per layer)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False, **model_kw).logits
    release_activation_cache(model)
    if heads is not None and logits.shape[1] != heads.numel():
        logits = logits[:, heads]      # a model without logits_to_keep: every position's, then those
    if heads is None:
        lp = token_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)
        return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
    targets = heads + 1
    lp = token_logprobs(logits, input_ids[:, targets], temperature)
    out = torch.zeros(input_ids.shape, dtype=lp.dtype, device=lp.device)
    out = out.index_copy(1, targets, lp)      # differentiable in lp (the training forward)
    return scored_only(out, scored)


def scored_only(logp: torch.Tensor, scored: torch.Tensor | None) -> torch.Tensor:
    """`logp` [B, L] with the tokens `scored` (CPU [B, L] bool; None = all) does not mark zeroed."""
    return logp if scored is None else logp * to_device(scored, logp.device, logp.dtype)


def keeps_logits(model: nn.Module) -> bool:
    """Whether `model`'s forward takes HF's `logits_to_keep` (every causal LM of transformers does;
    a custom model may not, and then runs its head at every position)."""
    cls = type(model)
    if cls not in _TAKES_LOGITS_TO_KEEP:
        _TAKES_LOGITS_TO_KEEP[cls] = "logits_to_keep" in inspect.signature(cls.forward).parameters
    return _TAKES_LOGITS_TO_KEEP[cls]


_TAKES_LOGITS_TO_KEEP: dict[type, bool] = {}     # by model class: a signature is read once


def scored_columns(scored: torch.Tensor, length: int) -> torch.Tensor:
    """[K] long (CPU): the positions t − 1 whose logits predict a scored token t of any row of
    `scored` ([B, L] bool, CPU). Never empty, so a forward with no scored token still has an LM
    head in its graph (its output is all zeros)."""
    cols = scored[:, 1:length].any(0).nonzero().flatten()
    return cols if cols.numel() else torch.zeros(1, dtype=torch.long)


def packed_sequence_logprobs(model: nn.Module, input_ids: torch.Tensor, lengths: torch.Tensor,
                             temperature: float = 1.0, row_bounds: bool = True,
                             scored: torch.Tensor | None = None) -> torch.Tensor:
    """`sequence_logprobs` of right-padded rows computed as one packed sequence (no padding).

    The rows' tokens are laid end to end; each keeps positions 0…n−1 and attends only to its own
    earlier tokens: with `row_bounds`, by the row boundaries as HF's varlen kwargs, which the
    aligned attention (`qat._agentq_attention`) uses (one varlen flash call on CUDA bf16/fp16,
    `qat.varlen_inputs`; row by row elsewhere, with the 4D block mask passed too); without, by
    the 4D block mask alone (`PackLayout.causal_block_mask`, which HF hands to any attention
    function as it is).

    Args:
        model: the HF causal LM (aligned or not); input_ids: [R, L] right-padded rows (CPU or the
        model's device); lengths: [R] real tokens per row (CPU); temperature: as in
        `sequence_logprobs`; row_bounds: pass the boundaries (False: the mask alone; for tests);
        scored: [R, L] bool (CPU), the tokens to score (None: all; see `sequence_logprobs`).
    Returns:
        [R, L] fp32 log-probs, 0 at each row's position 0, past its end and at unscored tokens.
    """
    layout = PackLayout.of(lengths)
    device = next(model.parameters()).device
    ids = to_device(layout.pack(input_ids), device)
    kw: dict[str, Any] = {}
    if layout.num_rows == 1:            # one row: plain causal attention, positions 0…n−1
        mask, pos = None, None
    elif row_bounds and varlen_model(model):
        mask, kw = varlen_inputs(to_device(layout.bounds(), device, torch.int32), int(layout.lengths.max()))
        pos = to_device(layout.position_ids(), device)
    else:
        mask, pos = layout.causal_block_mask(device), to_device(layout.position_ids(), device)
        if row_bounds:
            kw = {"cu_seq_lens_q": layout.bounds(), "cu_seq_lens_k": layout.bounds()}
    packed_scored = None if scored is None else layout.pack(scored.bool().cpu())
    logp = sequence_logprobs(model, ids, mask, temperature, position_ids=pos, scored=packed_scored, **kw)
    return unpack_rows(layout, logp, input_ids.shape[1])


def shared_prefix_packed_logprobs(model: nn.Module, input_ids: torch.Tensor, lengths: torch.Tensor,
                                  groups: list[tuple[list[int], int]], temperature: float = 1.0,
                                  scored: torch.Tensor | None = None) -> torch.Tensor:
    """`packed_sequence_logprobs` with each group's common prefix computed once
    (`packing.SharedPackLayout`): its rows' segments continue the prefix's positions and attend
    to its keys and their own (`qat.segment_inputs`). The same log-probs (a token's context is
    the same tokens at the same positions); the tokens the forward computes drop by the shared
    tokens times the group's rows less one, and the gradient of the prefix's activations is the
    sum over its rows, as autograd adds it.

    Args:
        model: an HF causal LM attending through `qat._agentq_attention` (`shares_prefixes`);
        input_ids: [R, L] right-padded rows (CPU); lengths: [R] (CPU); groups: rows sharing
        prefixes (`packing.shared_prefix_groups`); temperature, scored: as in
        `packed_sequence_logprobs`.
    """
    layout = SharedPackLayout.of(input_ids.cpu(), lengths, groups)
    device = next(model.parameters()).device
    ids = to_device(layout.pack(input_ids.cpu()), device)
    mask, kw = segment_inputs(layout.q_bounds, layout.k_bounds, to_device(layout.kv_index, device))
    packed_scored = None if scored is None else layout.pack(scored.bool().cpu())
    logp = sequence_logprobs(model, ids, mask, temperature, position_ids=to_device(layout.position_ids(), device),
                             scored=packed_scored, **kw)
    rows = unpack_rows(layout, logp, input_ids.shape[1])
    # a shared position is scored if any of its rows scores it: keep each row's own zeros
    return scored_only(rows, scored)


def unpack_rows(layout: PackLayout | SharedPackLayout, logp: torch.Tensor, length: int) -> torch.Tensor:
    """[R, length] rows of a pack's [1, ≥ total] log-probs, 0 at each row's first token (what
    precedes it in the pack is another row) and past its end."""
    rows = layout.unpack(logp, length)
    return torch.cat([torch.zeros_like(rows[:, :1]), rows[:, 1:]], dim=1)


def varlen_model(model: nn.Module) -> bool:
    """Whether packed rows go through the varlen flash attention: a CUDA bf16/fp16 model."""
    p = next(model.parameters())
    return cuda_half(p.device, p.dtype)


def packed_forward(model: nn.Module, temperature: float, ids: torch.Tensor, positions: torch.Tensor,
                   bounds: torch.Tensor, max_len: int, heads: torch.Tensor | None = None) -> torch.Tensor:
    """[1, T] fp32 log-probs of a padded pack (`graphs.padded_inputs`: ids, positions, int32 row
    boundaries on the model's GPU; max_len ≥ its longest row) through the varlen attention, the
    LM head at `heads` (None: every position): the function `graphs.PackGraphs` captures."""
    mask, kw = varlen_inputs(bounds, max_len)
    return sequence_logprobs(model, ids, mask, temperature, position_ids=positions, heads=heads, **kw)


def model_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The mask to give the model for a [B, L] padding mask (CPU tensor: no device sync): None when
    every row is right-padded, since under causal attention no real token sees a pad after it —
    attention can then run the fused causal kernel (`qat._fused_causal_ok`) instead of a masked
    one. Pad positions' log-probs are garbage either way and never used (action_mask is 0)."""
    m = attention_mask.bool()
    right_padded = bool(m[:, 0].all()) and bool((m[:, 1:] <= m[:, :-1]).all())
    return None if right_padded else attention_mask


class Learner:
    """The policy being trained: log-probs through the aligned forward, PPO updates with an
    `Objective`, weights out by HF name (module docstring)."""

    graphs: dict[tuple[int, bool], PackGraphs]
    graph_pool: GraphPool | None
    #: the `OLD_LOGP_MODES` this learner's `update` runs (`bypass_refusal` says when bypass is exact)
    old_logp_modes = OLD_LOGP_MODES

    def __init__(self, model_path: str | nn.Module, spec: QuantSpec, *, dtype: torch.dtype = torch.float32,
                 device: str = "cpu", lr: float = 1e-6, weight_decay: float = 0.01,
                 betas: tuple[float, float] = (0.9, 0.999),
                 grad_clip: float = 1.0, use_reference: bool = True, micro_batch_size: int = 8,
                 ref_path: str | None = None, activation_checkpointing: bool = False, temperature: float = 1.0,
                 pack_tokens: int | None = None, logprob_micro_batch_size: int | None = None,
                 logprob_pack_tokens: int | None = None, grad_input: str = "bf16", cuda_graphs: bool = False,
                 head_tokens: str = "actions", share_prefix: bool = True):
        """Args:
            model_path: an HF checkpoint folder, or an HF causal LM (e.g. random-init for benchmarks).
            spec: the learner's QuantSpec (`none` = unaligned); dtype/device: where it computes.
            use_reference: keep a frozen copy for π_ref (ref_path: load it from there instead).
            micro_batch_size: trajectories per forward; activation_checkpointing: recompute each
                decoder layer in backward (HF gradient checkpointing) to fit long contexts.
            temperature: the rollout sampler's; every log-prob (old, reference, training) is of
                softmax(logits / T), what the engine sampled from (`build.learner_temperature`).
            pack_tokens: None = micro-batches of `micro_batch_size` rows padded to their longest;
                a number = sequence packing: micro-batches are packs of rows laid end to end, at
                most this many tokens each (a longer row alone), no padding (`packing.py`).
            logprob_micro_batch_size / logprob_pack_tokens: the same two for the no-grad forwards
                of π_old / π_ref (None: as for training; see `batching_plans`).
            grad_input: the aligned linears' dX GEMM in backward: "bf16" (the compute dtype, fp32
                on CPU) or "int8" (per-token int8 gradients; `qat.align_model`).
            cuda_graphs: replay the packed passes' forwards (and the training backward) as CUDA
                graphs, one per pack shape (`graphs.PackGraphs`): takes the host out of the GPU
                learner's step. Needs a CUDA bf16/fp16 learner and packing (pack_tokens and/or
                logprob_pack_tokens; the passes that pack are graphed), no activation checkpointing.
            head_tokens: where the LM head runs, `HEAD_TOKENS` (graphed passes: `graphs.head_positions`).
            share_prefix: packs compute a prefix rows share (a GRPO group's prompt) once (`packing.
                SharedPackLayout`); same log-probs. CUDA-graphed passes keep plain packs (fixed shapes).
        """
        self.temperature, self.head_tokens = check_scoring(temperature, head_tokens)
        self.grad_input = check_grad_input(grad_input)        # before the model loads: a bad value fails at once
        self.train_batching, self.logprob_batching = batching_plans(
            micro_batch_size, pack_tokens, logprob_micro_batch_size, logprob_pack_tokens, share_prefix and not cuda_graphs)
        self.spec, self.device, self.dtype = spec, torch.device(device), dtype
        self.cuda_graphs = check_graphable(self, cuda_graphs, activation_checkpointing)    # before the load, too
        self.model, self.audit = self.load_aligned(model_path)
        if activation_checkpointing:
            self.model.gradient_checkpointing_enable(  # type: ignore[operator]  # an HF PreTrainedModel method
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.ref: nn.Module | None = None
        if use_reference:     # same fake quant (no KL floor at θ_0); ref_path: a resumed run's initial policy
            self.ref = (copy.deepcopy(self.model) if ref_path is None else self.load_aligned(ref_path)[0]).eval()
            self.ref.requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(betas[0], betas[1]), weight_decay=weight_decay)
        self.grad_clip, self.version = grad_clip, 0
        self.graphs, self.graph_pool = {}, None     # CUDA-graph runners by (id(model), training); their memory
        self.prefix_tokens: dict[str, int] = {}     # an update's packed row tokens, those shared prefixes saved

    def graph_runner(self, model: nn.Module, pack_tokens: int, train: bool) -> PackGraphs:
        """The CUDA-graph runner of `model`'s packed forward (training: with its backward), made at
        its first use. All runners share one memory pool (`graphs.GraphPool`)."""
        key = (id(model), train)
        runner = self.graphs.get(key)
        if runner is None:
            self.graph_pool = self.graph_pool or GraphPool()
            runner = self.graphs[key] = PackGraphs(model, functools.partial(packed_forward, model, self.temperature),
                                                   pack_tokens, train=train, pool=self.graph_pool)
        return runner

    def load_aligned(self, path: str | nn.Module) -> tuple[nn.Module, dict]:
        """(model, audit): the HF checkpoint at `path` (or the model given) on the learner's device and
        dtype, aligned to its spec with its dX option (`qat.align_model`)."""
        from transformers import AutoModelForCausalLM

        try:
            model = path if isinstance(path, nn.Module) else AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        except RuntimeError as e:       # transformers: a weight whose shape is not config.json's (an edited config)
            if "ignore_mismatched_sizes" not in str(e) and "size mismatch" not in str(e):
                raise
            raise CheckpointError(f"{path}: its weights do not fit its config.json ({first_line(e, 300)}); were they "
                                  "saved with this config.json?") from None
        model = model.to(device=self.device, dtype=self.dtype)
        return model, align_model(model, self.spec, grad_input=self.grad_input)

    # ------------------------------------------------------------------ log-probs
    @torch.no_grad()
    def logprobs(self, batch: PolicyBatch, model: nn.Module | None = None, every_token: bool = False) -> torch.Tensor:
        """Log-probs of the batch's action tokens under a model, without gradients.

        Args:
            batch: the rows to score; model: the policy (default) or the reference; every_token:
                score every token, not only `batch.action_mask`'s (the LM head then runs at every
                position; no objective needs that).
        Returns:
            [B, L] fp32 log p(token_t | tokens_<t) at the rollout temperature at the scored tokens
            (0 elsewhere: position 0, padding, and without every_token the observation tokens).
        """
        model = model or self.model
        scored = None if every_token else self.scored_tokens(batch)
        was_training = model.training
        model.eval()
        # filled on the device and read back once: a copy per micro-batch would stall the queue
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=self.device)
        plan = self.logprob_batching
        try:
            with memory_advice(self, train=False):
                for idx in plan.groups(batch.attention_mask.sum(1), batch.input_ids):
                    am = batch.attention_mask[idx]
                    L = int(am.sum(1).max())
                    out[to_device(idx, self.device), :L] = self.rows_logprobs(
                        model, batch.input_ids[idx, :L], am[:, :L], plan,
                        None if scored is None else scored[idx, :L]).float()
        finally:                                    # a failed pass leaves the model's mode as it was
            model.train(was_training)
        return out.cpu()

    def scored_tokens(self, batch: PolicyBatch) -> torch.Tensor | None:
        """The tokens whose log-probs a forward computes (CPU [B, L] bool): the action tokens, or
        None (every token) with head_tokens="all"."""
        return batch.action_mask.bool() if self.head_tokens == "actions" else None

    def fill_old_and_ref(self, batch: PolicyBatch) -> None:
        """Set `batch.old_logp` (this policy, before the update) and `batch.ref_logp` (None without a reference)."""
        batch.old_logp = self.logprobs(batch)
        self.fill_ref(batch)

    def fill_ref(self, batch: PolicyBatch) -> None:
        """Set `batch.ref_logp` only (None without a reference): the no-grad pass of bypass mode,
        where π_old comes from the update's own forward (`update(old_logp_mode="bypass")`)."""
        batch.ref_logp = self.logprobs(batch, self.ref) if self.ref is not None else None

    # ------------------------------------------------------------------ update
    def update(self, batch: PolicyBatch, objective: Objective, epochs: int = 1, minibatch_size: int | None = None,
               generator: torch.Generator | None = None, old_logp_mode: str = "recompute",
               lr: float | None = None) -> dict[str, float]:
        """PPO epochs over shuffled minibatches (token weights were computed once, in prepare).
        One optimizer step per minibatch; micro-batches accumulate gradients weighted by their share of
        the objective's units (action tokens, or trajectories for loss_agg=seq_mean), so each step
        minimises the minibatch's loss as if it were one forward. `lr`: this update's learning rate
        (`set_lr`; None keeps the optimizer's).

        old_logp_mode "bypass": `batch` comes without old_logp and weights. The one optimizer step's
        forwards all run at θ_old, so each micro-batch's training log-probs, detached, are its π_old:
        written into `batch.old_logp` (CPU, as `fill_old_and_ref` leaves it), and `objective.prepare`
        on those rows gives its weights before its loss. Refused where that is not exact
        (`bypass_refusal`); where the training forward itself is not the π_old pass's function
        (`grad_pass_refusal`: fp32 learners) it runs, π_old then being the training pass's log-probs
        (the trainer refuses that; benchmarks may time it)."""
        n = batch.num_seqs
        mb = minibatch_size or n
        bypass_old: torch.Tensor | None = None          # bypass: the batch's old_logp, filled by the forwards
        if old_logp_mode == "bypass":
            check_bypass(objective, epochs, minibatch_size, batch)
            batch.old_logp = bypass_old = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        elif old_logp_mode != "recompute":
            raise ValueError(f"old_logp_mode={old_logp_mode!r}; valid: {list(OLD_LOGP_MODES)}")
        self.set_lr(lr)
        sums: dict[str, float] = {}
        grad_norms = []
        self.prefix_tokens = {"rows": 0, "saved": 0}
        for _ in range(epochs):
            perm = torch.randperm(n, generator=generator)
            for s in range(0, n, mb):
                rows = perm[s: s + mb]
                weigh = None if bypass_old is None else functools.partial(old_logp_from_forward, objective,
                                                                          bypass_old, rows)
                norm = self.minibatch_step(batch.index(rows), objective, sums, weigh)
                if norm is not None:
                    grad_norms.append(norm)
        self.version += 1
        return {**update_summary(sums, grad_norms), **self.graph_stats(), **prefix_stats(self.prefix_tokens)}

    def graph_stats(self) -> dict[str, int]:
        """Counts since the start, over all CUDA-graph runners ({} without graphs): replays, buckets
        captured, packs left to the eager path (oversize, beyond the bucket cap, failed captures)."""
        if not self.graphs:
            return {}
        runners = self.graphs.values()
        return {"graph_replays": sum(r.replays for r in runners),
                "graph_captures": sum(len(r.entries) for r in runners),
                "graph_eager_packs": sum(r.eager_packs for r in runners),
                "graphs_released": int(self.graphs_released)}

    @property
    def graphs_released(self) -> bool:
        """Whether a capture ran out of memory and the graphs were dropped (`GraphPool.release`)."""
        return self.graph_pool is not None and self.graph_pool.released is not None

    def minibatch_step(self, minib: PolicyBatch, objective: Objective, sums: dict[str, float],
                       weigh: "WeighMicro | None" = None) -> float | None:
        """One optimizer step on a minibatch (gradients accumulated over micro-batches, clipped).
        Adds the minibatch's loss statistics into `sums`; returns the pre-clip gradient norm, or
        None when the minibatch has no unit of the objective (no step). A non-finite norm (NaN or
        inf in a gradient) skips the step and drops the gradients: clipping cannot rescue it (the
        clip factor is NaN or 0) and AdamW would write NaN into every weight and its moments for
        good; the norm is still returned (`update_summary` counts it). `weigh`: as in
        `accumulate_grads`."""
        if not self.accumulate_grads(minib, objective, sums, weigh):
            return None
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        if math.isfinite(norm):
            self.optimizer_step()
        else:
            self.opt.zero_grad(set_to_none=True)
        return norm

    def set_lr(self, lr: float | None) -> None:
        """Every param group's learning rate for the optimizer steps that follow (None: unchanged)."""
        if lr is None:
            return
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning rate {lr}: must be finite and > 0")
        for group in self.opt.param_groups:
            group["lr"] = float(lr)

    def optimizer_step(self) -> None:
        """AdamW's step, then every cached weight quantization dropped. The caches key on the
        weights' version counters, which torch's fused optimizer kernels (`fused=True`) do not bump:
        without this the aligned forward and the weight sync would keep the old weights' codes."""
        self.opt.step()
        invalidate_weight_caches(self.model)

    def accumulate_grads(self, minib: PolicyBatch, objective: Objective, sums: dict[str, float],
                         weigh: "WeighMicro | None" = None) -> bool:
        """Zero the gradients, then accumulate the minibatch loss's gradient over micro-batches of the
        rows this process owns (`local_rows`; all of them here), each weighted by its share of the
        whole minibatch's units, and combine across processes (`reduce_grads`; nothing here). Returns
        False (nothing computed) when the minibatch has no unit. `weigh` (bypass mode, see `update`):
        (the micro-batch's rows in `minib`, the CPU micro-batch, its log-probs) → the micro-batch with
        π_old and weights, between its forward and its loss."""
        # the minibatch's own statistics, on every row, before any micro-batch, pack or rank split
        minib = replace(minib, extra={**minib.extra, **objective.minibatch_extra(minib)})
        total_units = objective.agg_units(minib)
        if total_units == 0:
            return False
        stat_totals = objective.stat_units(minib)
        self.opt.zero_grad(set_to_none=True)
        if self.graph_pool is not None:
            self.graph_pool.clear_pending()     # a step that failed between a forward and its backward
        local_rows = self.local_rows(minib)
        local = minib.index(local_rows)
        weighted: dict[str, torch.Tensor | float] = {}
        with memory_advice(self, train=True):
            self._accumulate_micro_batches(local, local_rows, objective, (total_units, stat_totals), weighted, weigh)
        self.reduce_grads()
        for k, v in read_back(weighted).items():
            sums[k] = sums.get(k, 0.0) + v
        return True

    def _accumulate_micro_batches(self, local: PolicyBatch, local_rows: torch.Tensor, objective: Objective,
                                  totals: tuple[float, dict[str, float]], weighted: dict[str, torch.Tensor | float],
                                  weigh: "WeighMicro | None") -> None:
        """`accumulate_grads`' loop: each micro-batch's forward, loss and backward, its gradient
        weighted by its share of the minibatch's units (`totals`: `agg_units` and `stat_units` of the
        whole minibatch), its statistics added into `weighted`, each by its share of its own units."""
        total_units, stat_totals = totals
        for rows in self.micro_batches(local.attention_mask.sum(1), local.input_ids):
            micro = local.index(rows)
            L = int(micro.attention_mask.sum(1).max())
            micro = micro.trim(L)
            share = objective.agg_units(micro) / total_units      # from the CPU rows: no device sync
            stat_shares = {k: n / stat_totals[k] if stat_totals[k] else 0.0
                           for k, n in objective.stat_units(micro).items()}
            logp = self.rows_logprobs(self.model, micro.input_ids, micro.attention_mask, self.train_batching,
                                      self.scored_tokens(micro))
            if weigh is not None:
                micro = weigh(local_rows[rows], micro, logp)
            micro = micro.to(self.device)
            loss, stats = objective.loss(logp, micro)
            (loss * share).backward()
            release_activation_cache(self.model)        # the backward's shared X_fq, too
            add_weighted(weighted, {**stats, "loss": loss.detach()}, share, stat_shares)
            del logp, loss          # the autograd graph goes now, not when the next forward is done

    # hooks of the data-parallel learner (agentq/learner/distributed.py): which rows of a minibatch
    # this process computes, and how its partial gradients become the minibatch's
    def local_rows(self, minib: PolicyBatch) -> torch.Tensor:
        """Indices of the minibatch rows this process computes (all of them here)."""
        return torch.arange(minib.num_seqs)

    def reduce_grads(self) -> None:
        """Combine the partial gradients of all processes (nothing to do in one process)."""
        pass

    # ------------------------------------------------------------------ micro-batches
    def micro_batches(self, lengths: torch.Tensor, input_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The row groups of the training forwards (`MicroBatching.groups`)."""
        return self.train_batching.groups(lengths, input_ids)

    def rows_logprobs(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      plan: "MicroBatching", scored: torch.Tensor | None = None) -> torch.Tensor:
        """[n, L] log-probs of one micro-batch of rows (CPU [n, L] ids and padding mask, L = their
        longest), padded (plan.pack_tokens None) or packed into one sequence (rows must be
        right-padded; shared prefixes computed once with plan.share_min); `scored` (CPU [n, L]
        bool, None = all): the tokens to score, 0 elsewhere (`sequence_logprobs`)."""
        pack_tokens = plan.pack_tokens
        mask = model_mask(attention_mask)
        if pack_tokens is None:
            return sequence_logprobs(model, to_device(input_ids, self.device),
                                     None if mask is None else to_device(mask, self.device),
                                     self.temperature, scored=scored)
        if mask is not None:
            raise ValueError("sequence packing (pack_tokens) needs right-padded rows (as `collate` builds them)")
        lengths = attention_mask.sum(1)
        if self.cuda_graphs:
            layout = PackLayout.of(lengths)
            runner = self.graph_runner(model, pack_tokens, train=torch.is_grad_enabled())
            logp = runner.run(layout, layout.pack(input_ids), None if scored is None else layout.pack(scored))
            if logp is not None:        # the head's filler positions (`graphs.padded_head_positions`) zeroed
                rows = unpack_rows(layout, logp, input_ids.shape[1])
                return scored_only(rows, scored)
        groups = self.shared_prefixes(model, input_ids, lengths, plan)
        if groups:
            return shared_prefix_packed_logprobs(model, input_ids, lengths, groups, self.temperature, scored)
        return packed_sequence_logprobs(model, input_ids, lengths, self.temperature, scored=scored)

    def shared_prefixes(self, model: nn.Module, input_ids: torch.Tensor, lengths: torch.Tensor,
                        plan: "MicroBatching") -> list[tuple[list[int], int]]:
        """The groups of a pack's rows that compute their common prefix once (`packing.
        shared_prefix_groups`; none unless `plan.share_min` and the model attends through `qat`'s
        function), counted in `prefix_tokens` (the pack's row tokens, and those not computed)."""
        if not plan.share_min or not shares_prefixes(model):
            return []
        groups = shared_prefix_groups(input_ids, lengths.tolist(), plan.share_min)
        saved = sum((len(rows) - 1) * shared for rows, shared in groups)
        for key, n in (("rows", int(lengths.sum())), ("saved", saved)):
            self.prefix_tokens[key] = self.prefix_tokens.get(key, 0) + n
        return groups

    # ------------------------------------------------------------------ weights out
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Master weights by HF name, for the engine (which requantizes them)."""
        for name, p in self.model.state_dict().items():
            yield name, p

    def save(self, path: str, tokenizer: Any = None) -> None:
        """Write an HF checkpoint (safetensors, atomically) of the master weights, with the tokenizer if given."""
        from agentq.utils.checkpoint import save_hf_checkpoint
        save_hf_checkpoint(self.model, path, tokenizer)

    def report(self) -> dict[str, int]:
        """How many linears run quantized / in full precision (the QAT audit)."""
        return quantized_module_report(self.model)


#: `Learner.update`'s bypass hook: (micro-batch rows in the minibatch, CPU micro-batch, its log-probs
#: with grad) → the micro-batch with old_logp and the objective's weights attached
WeighMicro = Callable[[torch.Tensor, PolicyBatch, torch.Tensor], PolicyBatch]


def prefix_stats(tokens: dict[str, int]) -> dict[str, float]:
    """An update's {"rows": packed row tokens, "saved": those shared prefixes did not compute} as
    its metric `prefix_tokens_saved_frac` ({} when no pack looked for shared prefixes)."""
    rows = tokens.get("rows", 0)
    return {"prefix_tokens_saved_frac": tokens.get("saved", 0) / rows} if rows else {}


def check_scoring(temperature: float, head_tokens: str) -> tuple[float, str]:
    """(temperature, head_tokens) of a `Learner`, or a ValueError saying what is wrong."""
    if not temperature > 0:
        raise ValueError(f"Learner temperature={temperature!r}: must be > 0 (greedy decoding has no "
                         "sampling distribution to score)")
    if head_tokens not in HEAD_TOKENS:
        raise ValueError(f"head_tokens={head_tokens!r}; valid: {list(HEAD_TOKENS)}")
    return float(temperature), head_tokens


def bypass_refusal(objective: Objective, epochs: int, minibatch_size: int | None, rows: int,
                   split_trajectories: bool = False) -> str | None:
    """Why π_old taken from the training forward (old_logp_mode "bypass") would differ from a
    separate π_old pass with these settings, or None when it is exact: every forward of the update
    must run at θ_old (one epoch, one minibatch holding all `rows`, i.e. one optimizer step), and
    the objective's `prepare` must be row-local, since it then runs per micro-batch
    (`Objective.row_local_prepare`; a trajectory split over rows, `traj_id`, spans micro-batches)."""
    if epochs != 1:
        return f"ppo_epochs={epochs}: the epochs after the first run at the updated θ, not at θ_old"
    if minibatch_size is not None and minibatch_size < rows:
        return (f"minibatch_size={minibatch_size} < {rows} trajectories per step: the minibatches after the "
                "first run at θ after an optimizer step, not at θ_old")
    if not objective.row_local_prepare:
        return (f"objective {objective.name!r} weighs each row by numbers of the whole batch "
                "(row_local_prepare=False), so its prepare cannot run per micro-batch")
    if split_trajectories:
        return "the batch splits trajectories over rows (traj_id), which micro-batches may separate"
    return None


def grad_pass_refusal(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why a training (grad) forward of a learner in `dtype` on `device` does not compute the
    log-probs its no-grad π_old pass computes, or None when it does: fp32 learners run attention in
    fp64 in no-grad passes only (`kernels.attention.attention_accum_dtype`), so there bypass's π_old
    would carry the training pass's fp32 attention rounding (on the tiny aligned model up to 1e-2
    nats where it flips an int8 code) instead of the π_old the engine is aligned to."""
    with torch.no_grad():
        no_grad = attention.attention_accum_dtype(dtype, device)
    with torch.enable_grad():
        grad = attention.attention_accum_dtype(dtype, device)
    if no_grad == grad:
        return None
    return (f"a {dtype} learner's training forward computes attention in {grad}, its π_old pass in {no_grad}, "
            "so their log-probs differ")


def check_bypass(objective: Objective, epochs: int, minibatch_size: int | None, batch: PolicyBatch) -> None:
    """`bypass_refusal` for an update of `batch`, raised as a ValueError."""
    why = bypass_refusal(objective, epochs, minibatch_size, batch.num_seqs, batch.traj_id is not None)
    if why:
        raise ValueError(f"old_logp_mode='bypass' is not exact here: {why}; use 'recompute'")


def old_logp_from_forward(objective: Objective, old_logp: torch.Tensor, minib_rows: torch.Tensor,
                          micro_rows: torch.Tensor, micro: PolicyBatch, logp: torch.Tensor) -> PolicyBatch:
    """Bypass mode's `WeighMicro`: the CPU micro-batch with π_old = its training forward's log-probs
    (detached; also written into the batch's `old_logp` [B, L] at its rows, `minib_rows[micro_rows]`)
    and `objective.prepare`'s weights of those rows. On the CPU like the whole-batch prepare of
    recompute mode, so the two run the same arithmetic on the same numbers."""
    old = logp.detach().float().cpu()                   # [n, L]; from a GPU a copy (a CUDA graph reuses its output)
    old_logp[minib_rows[micro_rows], : old.shape[1]] = old
    micro = replace(micro, old_logp=old)
    return micro.weighted(objective.prepare(micro))


def check_graphable(learner: Learner, cuda_graphs: bool, activation_checkpointing: bool) -> bool:
    """`cuda_graphs` as a bool, or a ValueError where graphs cannot apply, saying why (Learner's
    docstring)."""
    if not cuda_graphs:
        return False
    if not cuda_half(learner.device, learner.dtype):
        raise ValueError(f"cuda_graphs=True needs a CUDA bf16/fp16 learner (got {learner.dtype} on {learner.device})")
    if learner.train_batching.pack_tokens is None and learner.logprob_batching.pack_tokens is None:
        raise ValueError("cuda_graphs=True graphs packed forwards: set pack_tokens and/or logprob_pack_tokens")
    if activation_checkpointing:
        raise ValueError("cuda_graphs=True and activation_checkpointing=True cannot be combined "
                         "(the graphs keep one pack's activations in their own memory pool)")
    return True


def update_summary(sums: dict[str, float], grad_norms: list[float]) -> dict[str, float]:
    """The update's logged numbers: per-minibatch means of the loss statistics, the mean finite
    gradient norm, the number of optimizer steps, and `skipped_nonfinite_grad`, the minibatches
    whose gradient norm was NaN / inf (no step: `Learner.minibatch_step`); `grad_norm` is NaN when
    no minibatch stepped (0.0 read as a genuinely zero gradient)."""
    own = sorted(set(sums) & {"grad_norm", "optimizer_steps", "skipped_nonfinite_grad"})
    if own:     # the objective's loss stat would be replaced by the update's own number without a word
        raise ValueError(f"the objective's loss stats {own} are names of the update's own metrics: rename them")
    count = len(grad_norms)
    finite = [g for g in grad_norms if math.isfinite(g)]
    out = {k: v / max(count, 1) for k, v in sums.items()}
    out["grad_norm"] = sum(finite) / len(finite) if finite else math.nan
    out["optimizer_steps"] = len(finite)
    out["skipped_nonfinite_grad"] = count - len(finite)
    return out


def add_weighted(acc: dict[str, torch.Tensor | float], stats: dict[str, Any], share: float,
                 shares: dict[str, float] | None = None) -> None:
    """acc[k] += stats[k] · share (`shares[k]` for a stat of its own units), device tensors kept on the
    device (in fp64, as Python floats would add them): reading each micro-batch's numbers back would
    stall the GPU queue between micro-batches (the CPU waits, then the GPU waits for the CPU's next
    launches)."""
    shares = shares or {}
    for k, v in stats.items():
        v = v.detach().double() if torch.is_tensor(v) else float(v)
        acc[k] = acc.get(k, 0.0) + v * shares.get(k, share)


def read_back(acc: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """`add_weighted`'s sums as floats, with one device-to-host copy for all of them."""
    held = {k: v for k, v in acc.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in acc.items() if not isinstance(v, torch.Tensor)}
    if held:
        out.update(zip(held, torch.stack([v.reshape(()) for v in held.values()]).tolist()))
    return out


def batching_plans(micro_batch_size: int, pack_tokens: int | None, logprob_micro_batch_size: int | None,
                   logprob_pack_tokens: int | None, share_prefix: bool = False
                   ) -> tuple["MicroBatching", "MicroBatching"]:
    """The Learner's (training, no-grad) micro-batching from its arguments; a value that is not a
    positive integer (or None, where allowed) is refused. The no-grad forwards of π_old / π_ref
    keep no activations for a backward, so they can take several times the rows; fewer, larger
    forwards also amortize the host's launch cost, which sets the pace of small ones on a GPU."""
    values = {"micro_batch_size": micro_batch_size, "pack_tokens": pack_tokens,
              "logprob_micro_batch_size": logprob_micro_batch_size, "logprob_pack_tokens": logprob_pack_tokens}
    for key, value in values.items():
        if value is None and key != "micro_batch_size":
            continue
        if not (isinstance(value, int) and value > 0):
            raise ValueError(f"Learner {key}={value!r}: must be a positive integer"
                             + ("" if key == "micro_batch_size" else " or None"))
    share_min = MIN_SHARED_TOKENS if share_prefix else 0      # packs sharing prefixes (`plan_shared_packs`)
    return (MicroBatching(micro_batch_size, pack_tokens, share_min),
            MicroBatching(logprob_micro_batch_size or micro_batch_size, logprob_pack_tokens or pack_tokens, share_min))


def memory_advice(learner: "Learner", train: bool) -> contextlib.AbstractContextManager[None]:
    """A device out-of-memory error of a learner pass re-raised with the settings that bound its
    memory (`memory_hint`). `train`: the update's forwards and backwards, else the no-grad π_old /
    π_ref passes."""
    return out_of_memory_hint(lambda: memory_hint(learner, train))


def memory_hint(learner: "Learner", train: bool) -> str:
    """What to lower when a learner pass runs out of device memory: its micro-batching settings by
    their config names, and activation checkpointing for the update."""
    plan = learner.train_batching if train else learner.logprob_batching
    prefix = "trainer." if train else "trainer.logprob_"
    size = (f"packs of at most {plan.pack_tokens} tokens" if plan.pack_tokens is not None
            else f"micro-batches of {plan.rows} trajectories")
    what = ("the update (forward + backward; AdamW's state, 8 bytes a parameter, exists from the first "
            "optimizer step on)" if train else "a no-grad π_old / π_ref pass")
    knob = f"{prefix}pack_tokens" if plan.pack_tokens is not None else f"{prefix}micro_batch_size"
    advice = f"agentq: {what} ran out of device memory with {size}. Lower {knob}"
    if train and not getattr(learner.model, "is_gradient_checkpointing", False) and not learner.cuda_graphs:
        advice += " or set trainer.activation_checkpointing=true (each layer recomputed in backward)"
    if learner.cuda_graphs and not learner.graphs_released:
        held = learner.graph_pool.held_bytes() if learner.graph_pool is not None else None
        advice += (", or set trainer.cuda_graphs=false: the CUDA graphs keep "
                   + (f"{held / 2**30:.1f} GiB" if held is not None else "about the largest pack's peak")
                   + " in a memory pool of their own, which the eager passes (packs of shapes not captured)"
                   " cannot use")
    return advice + "."


@dataclass(frozen=True)
class MicroBatching:
    """How a pass splits its rows into forwards: packs of at most `pack_tokens` tokens laid end to
    end (`plan_packs`), or, with packing off, length-sorted chunks of `rows` rows, each padded to
    its longest."""
    rows: int
    pack_tokens: int | None = None
    #: > 0: packs keep rows sharing at least this many leading tokens together and compute them once
    share_min: int = 0

    @property
    def shares_prefixes(self) -> bool:
        """Whether its packs compute shared prefixes once (packing on, `share_min` > 0)."""
        return bool(self.share_min) and self.pack_tokens is not None

    def groups(self, lengths: torch.Tensor, input_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Args:
            lengths: [B] real tokens per row; input_ids: [B, L] the rows (CPU), which packs
                sharing prefixes plan by (`plan_shared_packs`; None: by lengths alone).
        Returns:
            Row-index tensors partitioning range(B), one forward each.
        """
        if self.pack_tokens is None:
            return length_sorted_chunks(lengths, self.rows)
        if self.shares_prefixes and input_ids is not None:
            packs = plan_shared_packs(input_ids, lengths.tolist(), self.pack_tokens, self.share_min)
        else:
            packs = plan_packs(lengths.tolist(), self.pack_tokens)
        return [torch.tensor(p, dtype=torch.long) for p in packs]


def length_sorted_chunks(lengths: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Row indices in chunks of `size`, rows of similar length together: each chunk is padded only
    to its own longest row, which cuts the padded tokens (and attention's L²) of mixed-length
    episodes. The order of rows within a minibatch does not change its gradient (token-share
    weighted accumulation), so this is free."""
    order = torch.argsort(lengths, descending=True, stable=True)
    return [order[s: s + size] for s in range(0, len(order), size)]
