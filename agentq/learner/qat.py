"""Align an HF causal LM's forward with the rollout engine's quantization (QAT).

`align_model(model, spec)` makes the learner compute the function the engine computes:

* every linear the `QuantSpec` quantizes runs `ste.w8a8_linear_ste`: forward value from the same
  integer path as the engine (per-token int8 X, per-channel int8 W from the current master weight,
  int32 accumulate, fp32 epilogue; the engine's Triton kernels on CUDA), straight-through
  gradients to the masters; the weight's codes are cached per weight version (`WeightCache`), and
  an input several linears read (q/k/v, gate/up) is quantized once (`ActivationCache`);
* attention reads K (after RoPE and q/k-norm) and V through the KV cache's round trip
  (`ste.kv_fake_quant`, identity gradient), at every position, as the engine's cache does;
* the linear audit (`QuantSpec.check_linears`) runs first: a linear the spec does not name is
  an error, never a silent full-precision layer;
* on CUDA bf16/fp16, RMSNorms, SiLU MLPs and RoPE run fused launches (`fused_modules`), the
  engine's kernels; the norms and SiLU·mul also hand the next W8A8 linear its activation codes.

With `spec = QuantSpec.preset("none")` the model is left numerically as HF computes it, apart
from the attention kernel (shared with the engine, see `kernels.attention`) and, on CUDA
bf16/fp16, the fused norms (one bf16 rounding step from HF's at most, as in the engine).
"""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn as nn

from agentq.kernels import attention as attn_ops
from agentq.kernels._interp import cuda_half
from agentq.kernels import ste
from agentq.kernels.quant_spec import QuantSpec
from agentq.utils.device import to_device

from .fused_modules import install_fused_elementwise, install_fused_rope, remove_fused_elementwise

ATTN_IMPL = "agentq"


class QATLinear(nn.Linear):
    """An nn.Linear whose forward is the engine's W8A8 linear with STE gradients.

    Installed by swapping `__class__` on existing modules, so parameter names, objects and
    optimizer state are untouched; `spec` is the shared QuantSpec, `weight_cache` the weight's
    int8 codes for its current version (recomputed after each optimizer step)."""

    spec: QuantSpec
    weight_cache: ste.WeightCache
    act_cache: ste.ActivationCache      # shared by the model's QAT linears (q/k/v and gate/up read one x)
    group: "ProjectionGroup | None"     # the linears reading the same input, run as one GEMM
    grad_input: str                     # the backward's dX GEMM: "bf16" | "int8" (`ste.GRAD_INPUTS`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            return self.group.output(self, x)
        return ste.w8a8_linear_ste(x, self.weight, self.bias, self.spec, self.weight_cache, act_cache=self.act_cache,
                                   grad_input=self.grad_input)

    def quantized_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_q int8 [N, K], s_w fp32 [N]) of the current master weight: what the engine's sync
        computes from it, from the cache when the weight has not changed. int8 on every path: a CPU
        whose int GEMM is the fp32 emulation caches the same integers as fp32 (converted here)."""
        if self.group is not None:
            w_q, s_w = self.group.quantized_weight(self)
        else:
            w_q, s_w = self.weight_cache.get(self.weight, self.spec)
        return w_q.to(torch.int8), s_w


class ProjectionGroup:
    """Linears that read one input in the same forward (q/k/v_proj; gate/up_proj) run as one W8A8
    GEMM over their row-stacked weights (`ste.w8a8_linear_ste` with a tuple of weights), as the
    engine runs them: each output is its linear's bit for bit, and the learner pays one launch
    (and one dX, one dW GEMM in backward) where it paid two or three; per call, the aligned
    linear's launch costs the host several times a cuBLAS call's.

    The first member called with an input computes all outputs and holds the others' (views of
    the stacked output) until their members ask for them with the same tensor at the same
    version; any other call recomputes. `clear()` drops what is held (after each forward)."""

    def __init__(self, members: list[QATLinear]):
        self.members = members
        self.rows = [m.out_features for m in members]      # each member's rows of the stack
        self.cache = ste.WeightCache()       # codes of the stacked weights, once per weight version
        self.held: tuple[torch.Tensor, int, dict[int, torch.Tensor]] | None = None

    @staticmethod
    def fits(members: list[Any]) -> bool:
        """All QAT linears of one spec, dX GEMM and input width, with a bias on all or none."""
        first = members[0]
        return (all(isinstance(m, QATLinear) for m in members) and len({m.in_features for m in members}) == 1
                and all(m.spec == first.spec and m.grad_input == first.grad_input for m in members)
                and len({m.bias is None for m in members}) == 1)

    def output(self, member: QATLinear, x: torch.Tensor) -> torch.Tensor:
        held = self.held
        if held is not None and held[0] is x and held[1] == x._version and id(member) in held[2]:
            y = held[2].pop(id(member))
            if not held[2]:
                self.held = None
            return y
        y = self.stacked(x)
        outs = dict(zip(map(id, self.members), y.split(self.rows, dim=-1)))
        mine = outs.pop(id(member))
        self.held = (x, x._version, outs)
        return mine

    def stacked(self, x: torch.Tensor) -> torch.Tensor:
        """All members' outputs side by side [..., Σ rows] (one W8A8 GEMM), for a caller that
        takes them together (`fused_modules.FusedSiLUMLP`: gate and up)."""
        first = self.members[0]
        biases = None if first.bias is None else tuple(m.bias for m in self.members)
        return ste.w8a8_linear_ste(x, tuple(m.weight for m in self.members), biases, first.spec, self.cache,
                                   act_cache=first.act_cache, grad_input=first.grad_input)

    def quantized_weight(self, member: QATLinear) -> tuple[torch.Tensor, torch.Tensor]:
        """The member's rows of the stacked codes (the same codes as its weight's alone)."""
        i = self.members.index(member)             # ValueError for a module not in the group
        w_q, s_w = self.cache.get(tuple(m.weight for m in self.members), member.spec)
        return w_q.split(self.rows)[i], s_w.split(self.rows)[i]

    def invalidate(self) -> None:
        self.cache.invalidate()
        self.held = None

    def clear(self) -> None:
        self.held = None


#: linears HF decoder layers call with one input tensor, by their parent module's attribute names
PROJECTION_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _agentq_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """HF attention-interface function: KV round trip through the cache numerics, then the same
    masked attention the engine runs. query [B, Hq, T, D], key/value [B, Hkv, L, D].

    Packed rows (`learner.packing`) come as one sequence with HF's varlen kwarg `cu_seq_lens_q`
    (row boundaries [0, n1, n1+n2, …]): each row then attends causally within itself (Σ nᵢ²
    scores, not T²). With the boundaries on CUDA in bf16/fp16 (`varlen_inputs`) that is one
    varlen flash-attention call for all rows, whose launch depends only on the pack's token count
    (CUDA graphs, `learner.graphs`); with them on the CPU, one causal call per row. Without them
    the 4D block mask the packer passes gives the same result (the path any other attention takes)."""
    spec: QuantSpec = getattr(module, "agentq_spec", None) or QuantSpec.preset("none")
    key = ste.kv_fake_quant(key, spec)
    value = ste.kv_fake_quant(value, spec)
    b, _, t, _ = query.shape
    l = key.shape[2]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    bounds = kwargs.get("cu_seq_lens_q")
    kv_index = kwargs.get("agentq_kv_index")
    if kv_index is not None:                          # packed segments, some continuing a shared prefix
        return _segment_attention(query, key, value, kv_index, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"],
                                  kwargs["max_length_q"], kwargs["max_length_k"], scale), None
    if bounds is not None and b == 1 and t == l:      # packed rows: attention within each row only
        if torch.is_tensor(bounds) and bounds.is_cuda:
            return _varlen_causal_attention(query, key, value, bounds, int(kwargs["max_length_q"]), scale), None
        cuts = bounds.tolist() if torch.is_tensor(bounds) else [int(x) for x in bounds]
        out = torch.cat([_causal_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], scale)
                         for s, e in zip(cuts[:-1], cuts[1:]) if e > s], dim=2)     # empty rows: none
        return out.transpose(1, 2).contiguous(), None
    if attention_mask is None:
        return _causal_attention(query, key, value, scale).transpose(1, 2).contiguous(), None
    allowed = attention_mask[:, 0] if attention_mask.dtype == torch.bool else attention_mask[:, 0] > -1
    allowed = allowed.expand(b, t, l).clone()
    allowed[..., 0] |= ~allowed.any(-1)         # fully masked (padding) rows: avoid NaN
    out = attn_ops.masked_attention(query, key, value, allowed, scale)
    return out.transpose(1, 2).contiguous(), None


def _varlen_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor,
                             max_len: int, scale: float) -> torch.Tensor:
    """Causal attention within each packed row, one flash-attention varlen call (GQA native):
    query [1, Hq, T, D], key/value [1, Hkv, T, D], bounds [R + 1] int32 on the GPU (empty rows
    allowed), max_len ≥ the longest row. Returns [1, T, Hq, D] (HF's layout after attention)."""
    if not _fused_causal_ok(query):
        raise ValueError("varlen attention (row boundaries on the GPU) needs a CUDA bf16/fp16 model; "
                         f"got {query.dtype} on {query.device}")
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))      # [T, H, D]
    out = torch.ops.aten._flash_attention_forward(q, k, v, bounds, bounds, max_len, max_len, 0.0, True, False,
                                                  scale=scale)[0]
    return out.unsqueeze(0)


def _segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_index: torch.Tensor,
                       q_bounds: torch.Tensor, k_bounds: torch.Tensor, max_q: int, max_k: int,
                       scale: float) -> torch.Tensor:
    """Attention of packed segments over gathered keys (`packing.SharedPackLayout`): query
    [1, Hq, T, D], key/value [1, Hkv, T, D], kv_index [Tk] (each segment's keys by packed
    position, a row segment's being its shared prefix's then its own), q_bounds / k_bounds
    [S + 1]. Each segment's queries are the last of its keys and attend causally (query i of n
    sees the first Tk_s − n + i + 1 keys). One varlen flash call with the boundaries on CUDA in
    bf16/fp16, else one call per segment. Returns [1, T, Hq, D]."""
    if torch.is_tensor(q_bounds) and q_bounds.is_cuda:
        if not _fused_causal_ok(query):
            raise ValueError("varlen attention (segment boundaries on the GPU) needs a CUDA bf16/fp16 model; "
                             f"got {query.dtype} on {query.device}")
        q = query[0].transpose(0, 1).contiguous()                                       # [T, Hq, D]
        k, v = (x[0].transpose(0, 1).index_select(0, kv_index) for x in (key, value))   # [Tk, Hkv, D], gathered
        # flash attention aligns a causal mask to the bottom right when a segment has more keys than queries
        out = torch.ops.aten._flash_attention_forward(q, k, v, q_bounds, k_bounds, int(max_q), int(max_k), 0.0,
                                                      True, False, scale=scale)[0]
        return out.unsqueeze(0)
    key, value = key.index_select(2, kv_index), value.index_select(2, kv_index)
    qc, kc = q_bounds.tolist(), k_bounds.tolist()
    out = torch.cat([_causal_attention(query[:, :, qs:qe], key[:, :, ks:ke], value[:, :, ks:ke], scale)
                     for qs, qe, ks, ke in zip(qc[:-1], qc[1:], kc[:-1], kc[1:]) if qe > qs], dim=2)
    return out.transpose(1, 2).contiguous()


#: the 4D "mask" `varlen_inputs` gives: HF hands a 4D mask to attention as it is, so it builds no
#: [T, T] mask of its own (nor checks the positions for packing with a device sync); the varlen
#: path never reads it
_PLACEHOLDER_MASKS: dict[torch.device, torch.Tensor] = {}


def placeholder_mask(device: torch.device) -> torch.Tensor:
    """The 4D mask to give the model when the varlen kwargs carry the attention's structure."""
    mask = _PLACEHOLDER_MASKS.get(device)
    if mask is None:
        mask = _PLACEHOLDER_MASKS[device] = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    return mask


def varlen_inputs(bounds: torch.Tensor, max_len: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """(attention_mask, kwargs) to give the model for packed rows through the varlen attention
    (`_varlen_causal_attention`): bounds [R + 1] int32 row boundaries on the model's GPU, max_len ≥
    the longest row. The mask is a placeholder (`_PLACEHOLDER_MASKS`)."""
    return placeholder_mask(bounds.device), {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds,
                                             "max_length_q": max_len, "max_length_k": max_len}


def segment_inputs(q_bounds: torch.Tensor, k_bounds: torch.Tensor, kv_index: torch.Tensor
                   ) -> tuple[torch.Tensor, dict[str, Any]]:
    """(attention_mask, kwargs) for packed segments over gathered keys (`packing.SharedPackLayout`,
    `_segment_attention`): the boundaries and the gather on the model's device (int32 boundaries
    on a GPU for the varlen flash call; on the CPU one call per segment). Only this module's
    attention function reads the kwargs (`shares_prefixes`)."""
    dev = kv_index.device
    bounds_dtype = torch.int32 if dev.type == "cuda" else torch.long
    return placeholder_mask(dev), {
        "cu_seq_lens_q": to_device(q_bounds, dev, bounds_dtype), "cu_seq_lens_k": to_device(k_bounds, dev, bounds_dtype),
        "max_length_q": int(q_bounds.diff().max()), "max_length_k": int(k_bounds.diff().max()),
        "agentq_kv_index": kv_index}


def shares_prefixes(model: nn.Module) -> bool:
    """Whether `model` attends through `_agentq_attention` (`align_model` installs it), the one
    attention function that reads `segment_inputs`' gathered keys."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == ATTN_IMPL


def _causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention, [B, Hq, T, D] out (queries are the last T of the L keys). With T = L,
    SDPA's causal kernel (`attention.causal_attention`) where `_fused_causal_ok` and on a CPU (there
    in fp64 for no-grad passes, the masked path's bits); else the masked attention with a causal mask."""
    b, _, t, _ = query.shape
    l = key.shape[2]
    if t == l and (_fused_causal_ok(query) or query.device.type == "cpu"):
        return attn_ops.causal_attention(query, key, value, scale)
    allowed = torch.ones(t, l, dtype=torch.bool, device=query.device).tril(l - t).expand(b, t, l)
    return attn_ops.masked_attention(query, key, value, allowed, scale)


def _fused_causal_ok(query: torch.Tensor) -> bool:
    """A causal-only batch may use SDPA's fused kernels (flash / cuDNN, GQA without repeating K/V):
    on CUDA in bf16/fp16, where the explicit-mask path would fall back to the math kernel. CUDA fp32
    keeps the masked path (fp64 in no-grad passes, see `attention.attention_accum_dtype`)."""
    return cuda_half(query.device, query.dtype)


def _register_attention():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPL, _agentq_attention)
    AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)


def linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def grouping_default(model: nn.Module) -> bool:
    """Whether `align_model` groups projections when not told: AGENTQ_GROUPED=1 / 0 forces it on /
    off; unset, on for a model on CUDA only. Grouping saves the GPU host's launch time; on the CPU,
    where a launch costs nothing, it would only change the fp32 backward's sums (one dX GEMM over
    the stack re-associates them) and with them the default run's trajectory."""
    forced = os.environ.get("AGENTQ_GROUPED")
    if forced in ("0", "1"):
        return forced == "1"
    first = next(model.parameters(), None)
    return first is not None and first.is_cuda


def align_model(model: nn.Module, spec: QuantSpec, group_projections: bool | None = None,
                grad_input: str = "bf16") -> dict[str, list[str]]:
    """Install the aligned forward in place; returns the audit {"quantized": [...], "ignored": [...]}.

    group_projections: q/k/v_proj and gate/up_proj (`PROJECTION_GROUPS`) run as one GEMM each
    (`ProjectionGroup`: the same forward values, fewer launches). None = `grouping_default`.
    grad_input: the W8A8 linears' dX in backward (`ste.GRAD_INPUTS`): "bf16", the compute dtype's
    GEMM as before (fp32 on CPU), or "int8", per-token int8 gradients (`ste._int8_grad_input`)."""
    ste.check_grad_input(grad_input)
    if group_projections is None:
        group_projections = grouping_default(model)
    audit = spec.check_linears(linear_names(model))
    mods = dict(model.named_modules())
    act_cache = ste.ActivationCache()
    for name in audit["quantized"]:
        m = mods[name]
        m.__class__ = QATLinear
        m.spec = spec
        m.weight_cache = ste.WeightCache()
        m.act_cache = act_cache
        m.group = None
        m.grad_input = grad_input
    groups = []
    for parent in model.modules() if group_projections else ():
        for names in PROJECTION_GROUPS:
            members = [m for n in names if isinstance(m := getattr(parent, n, None), QATLinear)]
            if len(members) == len(names) and ProjectionGroup.fits(members):
                groups.append(ProjectionGroup(members))
                for m in members:
                    m.group = groups[-1]
    codes = (spec.act_scale_floor, spec.act_rounding) if audit["quantized"] else None
    install_fused_elementwise(model, codes, lambda m: isinstance(m, QATLinear), act_cache)
    install_fused_rope(model)
    for m in model.modules():
        if hasattr(m, "k_proj") and hasattr(m, "v_proj"):       # an attention block
            setattr(m, "agentq_spec", spec)
    _register_attention()
    if not hasattr(model, "agentq_attn_before"):     # what unalign_model restores
        setattr(model, "agentq_attn_before", getattr(model.config, "_attn_implementation", None))
    model.set_attn_implementation(ATTN_IMPL)  # type: ignore[operator]  # an HF PreTrainedModel method
    setattr(model, "agentq_spec", spec)
    setattr(model, "agentq_act_cache", act_cache)
    setattr(model, "agentq_groups", groups)
    return audit


def release_activation_cache(model: nn.Module) -> None:
    """Drop the shared activation codes after a forward (and the shared dequantized input after a
    backward): the cache only serves the linears of one pass, and would otherwise keep the last
    layer's tensors alive until the next."""
    cache = getattr(model, "agentq_act_cache", None)
    if cache is not None:
        cache.clear()
    for group in getattr(model, "agentq_groups", ()):
        group.clear()


def unalign_model(model: nn.Module) -> None:
    """Back to plain nn.Linear modules, HF's norm / MLP classes and the model's own attention (no
    K/V round trip), e.g. before save_pretrained or to compare with the aligned model."""
    remove_fused_elementwise(model)
    for m in model.modules():
        if isinstance(m, QATLinear):
            m.__class__ = nn.Linear  # type: ignore[assignment]  # swapping the class back in place
            del m.spec, m.weight_cache, m.act_cache, m.group, m.grad_input
        elif m is not model and hasattr(m, "agentq_spec"):      # an attention block
            del m.agentq_spec
    for attr in ("agentq_groups", "agentq_spec", "agentq_act_cache"):
        if hasattr(model, attr):
            delattr(model, attr)
    if hasattr(model, "agentq_attn_before"):
        model.set_attn_implementation(model.agentq_attn_before)  # type: ignore[operator]
        del model.agentq_attn_before


def set_grad_input(model: nn.Module, grad_input: str) -> None:
    """Switch an aligned model's dX GEMM in backward (`align_model`'s grad_input) in place, e.g. to
    compare the two options' gradients on the same weights (`eval/bench_learner.py`)."""
    ste.check_grad_input(grad_input)
    for m in model.modules():
        if isinstance(m, QATLinear):
            m.grad_input = grad_input


def invalidate_weight_caches(model: nn.Module) -> None:
    """Drop every cached weight quantization (needed only after writes through `.data`, which
    bypass the version counter the caches key on)."""
    for m in model.modules():
        if isinstance(m, QATLinear):
            m.weight_cache.invalidate()
            if m.group is not None:
                m.group.invalidate()


def pin_weight_caches(model: nn.Module) -> None:
    """Make every weight cache of the model recompute in place (`ste.WeightCache.pin`) and bring
    each up to date with its weight: CUDA graphs captured afterwards read the caches' tensors, and
    calling this again before each replay rewrites whatever an optimizer step made stale."""
    for m in model.modules():
        if isinstance(m, QATLinear):
            m.weight_cache.pin()
            if m.group is not None:
                m.group.cache.pin()
            m.quantized_weight()


def quantized_weights(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF weight name → (w_q, s_w) of every QAT linear, from the per-step cache (for a weight sync)."""
    return {f"{n}.weight": m.quantized_weight() for n, m in model.named_modules() if isinstance(m, QATLinear)}


def quantized_module_report(model: nn.Module) -> dict[str, int]:
    """Counts of linears running quantized vs full precision: the per-layer audit users ask for."""
    q = sum(isinstance(m, QATLinear) for m in model.modules())
    full = sum(type(m) is nn.Linear for m in model.modules())
    return {"quantized_linears": q, "full_precision_linears": full}


__all__ = ["ATTN_IMPL", "PROJECTION_GROUPS", "ProjectionGroup", "QATLinear", "align_model", "invalidate_weight_caches", "linear_names",
           "pin_weight_caches", "quantized_module_report", "quantized_weights", "release_activation_cache",
           "set_grad_input", "unalign_model", "varlen_inputs"]
