"""A minimal Llama / Qwen2 / Qwen3 forward for the rollout engine.

Why not HF modules: they cannot read a per-token-per-head int8 KV cache with ragged per-slot
positions. HF stays the reference (tests compare logits). Rotary embeddings come from the HF
model's own rotary class so positions are encoded identically in engine and learner.

Every linear of a decoder layer is an `EngineLinear` that runs as W8A8 (int8 codes + per-channel
scales, requantized from the learner's weights at every sync) or dense, as the `QuantSpec`
says; the module audit (`QuantSpec.check_linears`) runs at construction, so no layer can run
unquantized by accident.
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Any, Iterable, Sequence, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from agentq.kernels import attention as attn_ops
from agentq.kernels import cpu_gemm, int8_linear, quant
from agentq.kernels.quant import PartialSums
from agentq.kernels.quant_spec import QuantSpec

from .kv_cache import KVCache, KVTensors

SUPPORTED = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}
#: prefill chunks' K/V written by the q/k-norm + RoPE launch where the prefill kernel reads the cache
#: in place (same tokens and log-probs as the separate cache write: interpreter and H200 engine tests,
#: docs/bench/h200-r11/gputests-r11a.log); AGENTQ_PREFILL_KV_WRITE=0 turns it off
PREFILL_KV_WRITE = os.environ.get("AGENTQ_PREFILL_KV_WRITE", "1") != "0"


class WeightsRefused(ValueError):
    """A weight set refused before any tensor was copied (a shape or dtype the engine cannot take)."""


#: a linear's input: rows of the model dtype, or their per-token int8 codes and fp32 scales
Activation = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class EngineLinear(nn.Module):
    """A linear whose output rows may concatenate several HF projections that read the same
    input (q/k/v, gate/up): one activation quantization and one GEMM instead of three or two.
    Per-channel weight scales and per-token activation codes make this exact: every output row
    is computed as its own projection would compute it."""

    # buffers (registered in __init__; declared for the type checker)
    w_q: torch.Tensor
    s_w: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool, quantized: bool, spec: QuantSpec,
                 dtype: torch.dtype, device: torch.device | str, glu: bool = False):
        super().__init__()
        self.quantized, self.spec, self.dtype = quantized, spec, dtype
        if glu and (len(parts) != 2 or len(set(parts.values())) != 1):
            raise ValueError(f"a GLU linear has two parts of equal width (gate, up), not {parts}")
        # gate/up on CUDA: rows paired (gate j at 2j, up j at 2j + 1) for the GLU GEMM's tiles
        self.paired = glu and int8_linear.glu_layout(quantized, device)
        self.in_features = in_features
        self.parts = dict(parts)                     # HF projection name → output rows
        self.offsets, o = {}, 0
        for name, n in self.parts.items():
            self.offsets[name] = (o, o + n)
            o += n
        self.out_features = o
        if quantized:
            # int8 codes; fp32 (the same integers) on a CPU whose int GEMM is the fp32 emulation
            self.register_buffer("w_q", torch.zeros(o, in_features, dtype=cpu_gemm.weight_code_dtype(device, dtype),
                                                    device=device))
            self.register_buffer("s_w", torch.ones(o, dtype=torch.float32, device=device))
        else:
            self.register_buffer("weight", torch.zeros(o, in_features, dtype=dtype, device=device))
        self.register_buffer("bias", torch.zeros(o, dtype=dtype, device=device) if bias else None)

    @torch.no_grad()
    def load(self, w: torch.Tensor, part: str) -> tuple[torch.Tensor | int, int]:
        """Load one projection's full-precision weight; returns (int8 codes changed, codes total),
        the first a count on the device (summed by the caller, read once per sync: a read per
        projection would wait for the device ~200 times per 1B-model sync)."""
        if not self.quantized:
            self._rows(self.weight, part).copy_(w)
            return 0, 0
        # E = the weight in the engine's compute dtype, then per-channel int8 with fresh scales.
        w_q, s_w = int8_linear.quantize_weight(w.to(self.dtype), self.spec)
        rows = self._rows(self.w_q, part)
        changed = (w_q != rows).sum()
        rows.copy_(w_q)
        self._rows(self.s_w, part).copy_(s_w)
        return changed, w_q.numel()

    @torch.no_grad()
    def load_bias(self, b_: torch.Tensor, part: str) -> None:
        assert self.bias is not None, f"{part}: this linear has no bias"
        self._rows(self.bias, part).copy_(b_.to(self.bias.dtype))

    def _rows(self, t: torch.Tensor, part: str) -> torch.Tensor:
        """The rows of `t` (weight, codes, scales or bias) that hold projection `part`: a slice,
        or every other row when gate and up are paired."""
        if self.paired:
            return t[list(self.parts).index(part)::2]
        a, b = self.offsets[part]
        return t[a:b]

    def act_quant(self) -> tuple[float, str] | None:
        """(scale floor, rounding) of this linear's per-token activation codes, for a kernel
        before it that can emit them (`Activation`); None when it runs dense."""
        return (self.spec.act_scale_floor, self.spec.act_rounding) if self.quantized else None

    def forward(self, x: Activation, partial_sums: bool = False
                ) -> tuple[torch.Tensor, ...] | torch.Tensor | PartialSums:
        """The output rows (split per part), or with `partial_sums` (a one-part quantized linear
        whose output only a fused residual add + norm reads) possibly its int32 partial sums
        (`int8_linear.w8a8_linear_partials`)."""
        if partial_sums and self.quantized and len(self.parts) == 1:
            return int8_linear.w8a8_linear_partials(x, self.w_q, self.s_w, self.bias, self.spec, self.dtype)
        if isinstance(x, tuple):          # already per-token int8 codes + scales (a fused kernel's)
            y = int8_linear.w8a8_linear_codes(x[0], x[1], self.w_q, self.s_w, self.bias, self.dtype)
        elif self.quantized:
            y = int8_linear.w8a8_linear(x, self.w_q, self.s_w, self.bias, self.spec)
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.paired:                   # (gate, up) as strided views; `silu_mul` is the fast path
            return y.unflatten(-1, (-1, 2)).unbind(-1)
        return y if len(self.parts) == 1 else y.split(list(self.parts.values()), dim=-1)

    def silu_mul(self, x: Activation, act_quant: tuple[float, str] | None) -> Activation:
        """silu(gate) · up of this gate/up linear, as the down projection reads it: per-token codes
        + scales (`act_quant` = that linear's (scale floor, rounding)) or rows (None). A linear with
        paired rows (quantized, on CUDA) runs one GEMM with SiLU·mul in its epilogue (gate and up
        never written) and a one-read quantization; otherwise the GEMM, then the fused SiLU·mul (+
        codes) kernel. Same bits either way. Needs the fused kernels (bf16 / fp16 on CUDA)."""
        assert tuple(self.parts.values())[0] * 2 == self.out_features, "parts: gate, then up, of equal width"
        if self.paired:     # quantized, so the fused norm before it hands over codes
            assert isinstance(x, tuple), "a paired gate_up linear takes per-token codes"
            return int8_linear.w8a8_glu_codes(x[0], x[1], self.w_q, self.s_w, self.bias, self.dtype, act_quant)
        from agentq.kernels import triton_norm
        gate, up = self(x)
        return triton_norm.silu_mul(gate, up) if act_quant is None else triton_norm.silu_mul_quant(gate, up, *act_quant)


def use_fused_kernels(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Fused Triton norm / SiLU·mul kernels: bf16/fp16 models on CUDA (fp32 keeps torch's exact
    arithmetic, the mode where engine and learner agree to ~1e-6). AGENTQ_FUSED=0 turns them off."""
    import os

    from agentq.kernels._interp import HAVE_TRITON, cuda_half
    return (HAVE_TRITON and cuda_half(device, dtype)
            and os.environ.get("AGENTQ_FUSED", "1") != "0")


class RMSNorm(nn.Module):
    """Same arithmetic as HF's Llama/Qwen RMSNorm (fp32 statistics, weight applied in input dtype);
    one Triton launch instead of ~7 torch kernels when `fused` (see `kernels.triton_norm`)."""

    weight: torch.Tensor   # a buffer

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.eps = eps
        self.fused = use_fused_kernels(dtype, device)
        self.register_buffer("weight", torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            from agentq.kernels.triton_norm import rms_norm
            return rms_norm(x, self.weight, self.eps)
        dt = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor | PartialSums | None,
                     quant: tuple[float, str] | None = None) -> tuple[torch.Tensor, Any]:
        """The residual add before this norm and the norm: (x + delta, norm(x + delta)). Fused, it
        is one launch that can also emit the normed rows as a W8A8 linear's input codes (`quant`,
        from `EngineLinear.act_quant`) and take delta as a linear's partial sums; the values are
        the same either way."""
        if self.fused:
            from agentq.kernels.triton_norm import add_rms_norm
            return add_rms_norm(x, delta, self.weight, self.eps, quant)
        if isinstance(delta, PartialSums):      # one row per row of x (the fused norm's contract)
            delta = delta.value().reshape(x.shape)
        s = x if delta is None else x + delta
        return s, self(s)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Any, layer_idx: int, spec: QuantSpec, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.layer_idx = layer_idx
        h, nh, nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        hd = getattr(cfg, "head_dim", None) or h // nh
        self.n_heads, self.n_kv, self.head_dim = nh, nkv, hd
        self.scale = hd ** -0.5
        qkv_bias = bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2"
        mlp_bias = bool(getattr(cfg, "mlp_bias", False))

        def lin(i, parts, b, glu=False):
            # the spec decides per projection (quantized_modules / ignored_modules), as the learner's
            # align_model and the vLLM export do; a fused linear runs one GEMM, so all of it or none,
            # which QuantSpec holds every spec to (`FUSED_GROUPS`)
            return EngineLinear(i, parts, b, spec.quantizes(next(iter(parts))), spec, dtype, device, glu)

        inter = cfg.intermediate_size
        self.qkv_proj = lin(h, {"q_proj": nh * hd, "k_proj": nkv * hd, "v_proj": nkv * hd}, qkv_bias)
        self.o_proj = lin(nh * hd, {"o_proj": h}, bool(getattr(cfg, "attention_bias", False)) and cfg.model_type in ("llama", "qwen3"))
        self.gate_up_proj = lin(h, {"gate_proj": inter, "up_proj": inter}, mlp_bias, glu=True)
        self.down_proj = lin(inter, {"down_proj": h}, mlp_bias)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype, device)
        self.qk_norm = cfg.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, device)

    # The residual add after each block is deferred into the next pre-norm (`RMSNorm.add_and_norm`):
    # a layer takes (x, delta) and returns (x', delta') with x' + delta' its output; the first
    # layer gets delta None and the model's final norm does the last add.
    def _qkv(self, x, delta, cos, sin):
        """Residual add + pre-norm, fused q/k/v projection: (x + delta, q, k, v), q/k/v [B, T, H, D]
        views of one projection output (before q/k-norm and RoPE)."""
        b, t, _ = x.shape
        x, h = self.input_layernorm.add_and_norm(x, delta, self.qkv_proj.act_quant())
        q, k, v = self.qkv_proj(h)
        return (x, q.reshape(b, t, self.n_heads, self.head_dim), k.reshape(b, t, self.n_kv, self.head_dim),
                v.reshape(b, t, self.n_kv, self.head_dim))

    def _norm_rope(self, q, k, v, cos, sin):
        """q/k-norm (Qwen3) and RoPE: q [B, H, T, D], k/v [B, Hkv, T, D]."""
        if self.input_layernorm.fused:          # q/k-norm + RoPE in one Triton launch
            from agentq.kernels.triton_norm import qk_norm_rope
            qw, kw, eps = self._qk_norm_args()
            q, k = qk_norm_rope(q, k, qw, kw, cos, sin, eps)
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)       # [B, H, T, D]
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        return q, k, v

    def _qk_norm_args(self):
        return ((self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else (None, None, 0.0))

    def _out_and_mlp(self, x, o, partial_sums=False):
        """Attention output o [B, H, T, D] → o_proj, residual add + post-norm, MLP: (x', delta').
        partial_sums (decode, fused norms): o_proj and down_proj may hand their int32 partial sums
        to the norm after them (`EngineLinear.forward`), so delta' can be `PartialSums`."""
        b, _, t, _ = o.shape
        o = o.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
        fused = self.post_attention_layernorm.fused
        x, h = self.post_attention_layernorm.add_and_norm(x, self.o_proj(o, partial_sums and fused),
                                                          self.gate_up_proj.act_quant())
        if fused:
            return x, self.down_proj(self.gate_up_proj.silu_mul(h, self.down_proj.act_quant()), partial_sums)
        gate, up = self.gate_up_proj(h)
        return x, self.down_proj(F.silu(gate) * up)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                ctx: "ForwardContext") -> tuple[torch.Tensor, torch.Tensor]:
        x, q, k, v = self._qkv(x, delta, cos, sin)
        # the prefill kernel reads K/V from the cache: q/k-norm + RoPE write the valid tokens' K/V there
        fused_write = self._fused_write(ctx) if ctx.prefill_kernel and PREFILL_KV_WRITE else None
        if fused_write is not None:
            q = self._norm_rope_to_cache(q, k, v, cos, sin, ctx, fused_write, ctx.n_new32)
        else:
            q, k, v = self._norm_rope(q, k, v, cos, sin)
            # quantize on write (valid tokens only), then read everything back dequantized
            ctx.cache.write(self.layer_idx, *ctx.write_addresses, ctx.new_tokens(k), ctx.new_tokens(v))
        return self._out_and_mlp(x, self._attend(q, ctx))

    def _fused_write(self, ctx: "ForwardContext | DecodeContext") -> KVTensors | None:
        """This layer's cache tensors for `_norm_rope_to_cache` (`KVCache.fused_write_args`), or None:
        the layer runs torch ops, or the cache takes no direct writes (fp8, CPU)."""
        return ctx.cache.fused_write_args(self.layer_idx) if self.input_layernorm.fused else None

    def _norm_rope_to_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, ctx: "ForwardContext | DecodeContext", fused_write: KVTensors,
                            n_new: torch.Tensor | None = None) -> torch.Tensor:
        """q/k-norm + RoPE in one launch that also writes the tokens' K/V into the cache at
        (ctx.slots, ctx.positions) (`triton_norm.qk_norm_rope_to_cache`; n_new: [B] each row's valid
        tokens, None: all). Returns q [B, H, T, D]."""
        from agentq.kernels.triton_norm import qk_norm_rope_to_cache
        qw, kw, eps = self._qk_norm_args()
        return qk_norm_rope_to_cache(q, k, v, qw, kw, cos, sin, eps, *fused_write, ctx.slots, ctx.positions,
                                     ctx.cache.kv_quant(), n_new).transpose(1, 2)

    def _attend(self, q: torch.Tensor, ctx: "ForwardContext | DecodeContext") -> torch.Tensor:
        """Attention of q [B, H, T, D] over each row's slot: the Triton decode kernel (one query
        token, int8/float cache read in place) or the cache read back dequantized + masked SDPA."""
        i, cache = self.layer_idx, ctx.cache
        if ctx.use_kernel:
            return attn_ops.decode_attention(
                q[:, :, 0].contiguous(), cache.k[i], None if cache.k_scale is None else cache.k_scale[i],
                cache.v[i], None if cache.v_scale is None else cache.v_scale[i],
                ctx.slots32, ctx.lens32, self.scale).unsqueeze(2)
        if isinstance(ctx, ForwardContext) and ctx.prefill_kernel:     # the cache read in place, no copies
            in_place = cache.fused_write_args(i)
            assert in_place is not None                                  # prefill_kernel implies it
            k, v, ks, vs = in_place
            return attn_ops.prefill_attention(q, k, ks, v, vs, ctx.slots32, ctx.n_new32, ctx.lens32, self.scale,
                                              key_len=ctx.key_len)
        # read in the attention's dtype (fp64 for an fp32 model): into `reuse_reads` buffers, not new copies
        kc, vc = cache.read(i, ctx.slots, ctx.key_len, attn_ops.attention_accum_dtype(q.dtype, q.device))
        return attn_ops.masked_attention(q, kc, vc, ctx.allowed, self.scale)

    def decode(self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
               d: "DecodeContext") -> tuple[torch.Tensor, torch.Tensor]:
        """One new token per row (x [B, 1, H]); no host synchronisation when `d.use_kernel`, so the
        step can be captured in a CUDA graph. Same arithmetic as `forward` with T = 1."""
        x, q, k, v = self._qkv(x, delta, cos, sin)
        fused_write = self._fused_write(d)
        if fused_write is not None:     # q/k-norm + RoPE + this token's K/V into the cache: one launch
            q = self._norm_rope_to_cache(q, k, v, cos, sin, d, fused_write)
        else:
            q, k, v = self._norm_rope(q, k, v, cos, sin)
            d.cache.write(self.layer_idx, d.slots, d.positions, k[:, :, 0], v[:, :, 0])
        return self._out_and_mlp(x, self._attend(q, d), partial_sums=True)


def decode_kernel_applies(cache: KVCache) -> bool:
    """Whether decode attention runs the Triton int8/float-KV kernel. fp32 models keep the torch
    path (fp64 attention): the kernel reads q as fp16, and fp32 is the mode where engine and
    learner must agree to ~1e-6."""
    return (cache.spec.kv != "fp8_e4m3_per_tensor" and cache.dtype != torch.float32
            and attn_ops.decode_attention_available(cache.device))


class DecodeContext:
    """Per-step bookkeeping of a decode step (one token per row): slots [B], new_lens [B] (slot
    length after the token is written); positions = new_lens - 1. Without the kernel it also holds
    the mask of the torch path, which needs the longest row's length (a host sync)."""

    def __init__(self, cache: KVCache, slots: torch.Tensor, new_lens: torch.Tensor):
        self.cache, self.slots, self.new_lens = cache, slots, new_lens
        self.positions = new_lens - 1
        self.use_kernel = decode_kernel_applies(cache)
        if self.use_kernel:      # the kernel's index dtype, converted once per step, not per layer
            self.slots32, self.lens32 = slots.to(torch.int32), new_lens.to(torch.int32)
        else:
            self.key_len = int(new_lens.max())
            keys = torch.arange(self.key_len, device=slots.device)
            self.allowed = (keys.view(1, -1) < new_lens.view(-1, 1)).unsqueeze(1)     # [B, 1, L]


class ForwardContext:
    """Per-forward bookkeeping shared by all layers (positions, masks, cache indices).

    key_len: max(new_lens) when the caller knows it, or a bound above it (a CUDA-graph bucket:
    `prefill_graphs`); None reads it from the device (a host sync). The valid tokens' cache
    addresses (a `nonzero`, another sync) are built on first use: the path where q/k-norm + RoPE
    write K/V and the prefill kernel reads the cache in place never needs them."""

    def __init__(self, cache: KVCache, slots: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                 new_lens: torch.Tensor, allow_decode_kernel: bool, key_len: int | None = None):
        self.cache, self.slots, self.positions, self.new_lens, self.valid = cache, slots, positions, new_lens, valid
        self.key_len = int(new_lens.max()) if key_len is None else key_len
        t = positions.shape[1]
        self.use_kernel = allow_decode_kernel and t == 1 and decode_kernel_applies(cache)
        self.prefill_kernel = (not self.use_kernel and cache.fused_write_args(0) is not None
                               and attn_ops.prefill_kernel_available(cache.device, cache.dtype, cache.head_dim))
        if self.use_kernel or self.prefill_kernel:
            self.slots32, self.lens32 = slots.to(torch.int32), new_lens.to(torch.int32)
            self.n_new32 = valid.sum(1, dtype=torch.int32)    # valid tokens are each row's first n (`_forward`)
        else:
            keys = torch.arange(self.key_len, device=positions.device)
            self.allowed = keys.view(1, 1, -1) <= positions.unsqueeze(-1)   # [B, T, L]; causal + per-slot length

    @functools.cached_property
    def valid_idx(self) -> tuple[torch.Tensor, ...]:
        return self.valid.nonzero(as_tuple=True)

    @functools.cached_property
    def all_valid(self) -> bool:
        """Every token valid (a first-turn chunk of equal rows): K/V rows are written as they lie."""
        return self.valid_idx[0].numel() == self.valid.numel()

    @functools.cached_property
    def write_addresses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots, positions) of the valid tokens' cache rows, once for all layers."""
        if self.all_valid:
            return self.slots.repeat_interleave(self.positions.shape[1]), self.positions.reshape(-1)
        return self.slots[self.valid_idx[0]], self.positions[self.valid_idx]

    def new_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The valid tokens of K or V [B, Hkv, T, D] as [N, Hkv, D] (a view when all are valid and
        the layout allows; the cache writes take any token / head strides)."""
        x = x.permute(0, 2, 1, 3)
        return x.reshape(-1, *x.shape[2:]) if self.all_valid else x[self.valid_idx]


class EngineModel(nn.Module):
    """The engine's Llama / Qwen2 / Qwen3 decoder: fused int8 linears, KV cache in slots, prefill
    chunks and one-token decode steps."""

    lm_head: torch.Tensor               # a buffer (untied models, head in full precision)
    rotary: Any                         # the HF rotary-embedding module of the architecture
    _rope: tuple[torch.Tensor, torch.Tensor] | None

    def __init__(self, hf_config: Any, spec: QuantSpec, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        super().__init__()
        mt = hf_config.model_type
        if mt not in SUPPORTED:
            raise ValueError(f"the torch engine supports model_type {sorted(SUPPORTED)}, got {mt!r}; "
                             "use rollout.backend=vllm for other architectures "
                             "(pip install -e \".[vllm]\"; docs/vllm.md)")
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"only SiLU MLPs are supported, got hidden_act={hf_config.hidden_act!r}")
        self.config, self.spec, self.dtype, self.device = hf_config, spec, dtype, torch.device(device)
        self.embed_tokens = nn.Embedding(hf_config.vocab_size, hf_config.hidden_size, device=device, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList([DecoderLayer(hf_config, i, spec, dtype, device)
                                     for i in range(hf_config.num_hidden_layers)])
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, dtype, device)
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        # a W8A8 head when the spec lists lm_head (its codes come from the embedding when tied); a
        # full-precision head reads the embedding table itself, or its own buffer
        self.head = None
        if spec.quantizes("lm_head"):
            self.head = EngineLinear(hf_config.hidden_size, {"lm_head": hf_config.vocab_size}, False, True, spec,
                                     dtype, device)
        elif not self.tied:
            self.register_buffer("lm_head", torch.zeros(hf_config.vocab_size, hf_config.hidden_size, dtype=dtype, device=device))
        mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
        self.rotary = getattr(mod, f"{SUPPORTED[mt]}RotaryEmbedding")(config=hf_config).to(device)
        # audit the HF projections the engine runs (fused modules hold several)
        linear_names = [f"{n.rsplit('.', 1)[0]}.{part}" for n, m in self.named_modules()
                        if isinstance(m, EngineLinear) for part in m.parts]
        self.audit = spec.check_linears(linear_names + ["lm_head"])
        self._targets = self._param_targets()
        self.set_max_len(int(getattr(hf_config, "max_position_embeddings", 4096)))

    @property
    def decoder_layers(self) -> Sequence[DecoderLayer]:
        """`self.layers` with its element type (an nn.ModuleList is untyped)."""
        return cast("Sequence[DecoderLayer]", self.layers)

    # ------------------------------------------------------------------ weights
    def _param_targets(self) -> dict[str, tuple[Any, str | tuple[str, str]]]:
        t: dict[str, tuple[Any, str | tuple[str, str]]] = {"model.embed_tokens.weight": (self.embed_tokens, "weight"),
                                               "model.norm.weight": (self.norm, "weight")}
        if not self.tied:               # a tied head is loaded with the embedding (`load_weights`)
            t["lm_head.weight"] = (self, "lm_head") if self.head is None else (self.head, ("load", "lm_head"))
        for i, layer in enumerate(self.decoder_layers):
            p = f"model.layers.{i}."
            for fused, prefix in ((layer.qkv_proj, "self_attn."), (layer.o_proj, "self_attn."),
                                  (layer.gate_up_proj, "mlp."), (layer.down_proj, "mlp.")):
                for part in fused.parts:
                    t[p + f"{prefix}{part}.weight"] = (fused, ("load", part))
                    if fused.bias is not None:
                        t[p + f"{prefix}{part}.bias"] = (fused, ("load_bias", part))
            t[p + "input_layernorm.weight"] = (layer.input_layernorm, "weight")
            t[p + "post_attention_layernorm.weight"] = (layer.post_attention_layernorm, "weight")
            if layer.qk_norm:
                t[p + "self_attn.q_norm.weight"] = (layer.q_norm, "weight")
                t[p + "self_attn.k_norm.weight"] = (layer.k_norm, "weight")
        return t

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], strict: bool = True) -> dict:
        """Load HF-named tensors. Quantized linears are requantized (fresh per-channel scales).
        Returns {"loaded": n, "codes_changed": c, "codes_total": t}."""
        info = self.load_weights_queued(named_tensors, strict)
        return {**info, "codes_changed": int(info["codes_changed"])}

    @torch.no_grad()
    def load_weights_queued(self, named_tensors: Iterable[tuple[str, torch.Tensor]], strict: bool = True) -> dict:
        """`load_weights` without reading anything back: "codes_changed" is a count on the device
        (or 0), so the whole load can be captured in a CUDA graph (`weight_sync`)."""
        # names are checked before anything is copied, so a wrong set of tensors changes no weight
        named_tensors = [(n, w) for n, w in named_tensors
                         if not (n == "lm_head.weight" and self.tied) and not n.endswith("rotary_emb.inv_freq")]
        unknown = [n for n, _ in named_tensors if n not in self._targets]
        if unknown:
            raise KeyError(f"engine has no parameter for {unknown[0]!r} (model_type={self.config.model_type})")
        missing = set(self._targets) - {n for n, _ in named_tensors}
        if strict and missing:
            raise KeyError(f"weights missing for {sorted(missing)[:5]}{' ...' if len(missing) > 5 else ''}")
        # and shapes / dtypes: `copy_` broadcasts, so a [1, H] embedding or a [1] norm weight would
        # otherwise load silently into every row
        for name, w in named_tensors:
            want = self._target_shape(name)
            if tuple(w.shape) != want or not w.is_floating_point():
                raise WeightsRefused(f"{name}: the engine takes a floating-point tensor of shape {list(want)}, "
                                     f"got {w.dtype} {list(w.shape)}")
        seen, total = set(), 0
        changed: torch.Tensor | int = 0
        for name, w in named_tensors:
            mod, attr = self._targets[name]
            w = w.detach().to(self.device)
            if name == "model.embed_tokens.weight" and self.tied and self.head is not None:
                c, n = self.head.load(w, "lm_head")     # the tied head's codes, from the one device copy
                changed, total = changed + c, total + n
            if isinstance(attr, tuple) and attr[0] == "load":
                c, n = mod.load(w, attr[1])
                changed, total = changed + c, total + n
            elif isinstance(attr, tuple):
                mod.load_bias(w, attr[1])
            else:
                getattr(mod, attr).copy_(w.to(getattr(mod, attr).dtype))
            seen.add(name)
        return {"loaded": len(seen), "codes_changed": changed, "codes_total": total}

    def _target_shape(self, name: str) -> tuple[int, ...]:
        """The shape of HF tensor `name` (one of `_targets`) as the checkpoint holds it."""
        mod, attr = self._targets[name]
        if isinstance(attr, tuple):            # one projection of a fused linear: its rows
            rows = mod.parts[attr[1]]
            return (rows, mod.in_features) if attr[0] == "load" else (rows,)
        return tuple(getattr(mod, attr).shape)

    # ------------------------------------------------------------------ forward
    def rope_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of every position [max_len, D] in the model dtype, from the HF rotary class.
        Each entry is one product inv_freq · position followed by cos/sin, so indexing the table
        gives the bits a per-call computation gives."""
        rope = getattr(self, "_rope", None)
        if rope is None or rope[0].shape[0] < self._rope_len:
            pos = torch.arange(self._rope_len, device=self.device)[None]
            x = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(x, pos)
            rope = self._rope = (cos[0].contiguous(), sin[0].contiguous())
        return rope

    def set_max_len(self, max_len: int) -> None:
        self._rope_len, self._rope = max_len, None

    def prefill_capturable(self, cache: KVCache) -> bool:
        """Whether a prefill chunk's forward (T > 1, `key_len` given) is free of host syncs, so a
        CUDA graph can hold it: q/k-norm + RoPE write the valid tokens' K/V (no `nonzero` for
        their addresses) and the prefill kernel reads the cache in place."""
        return (PREFILL_KV_WRITE and self.norm.fused and cache.fused_write_args(0) is not None
                and attn_ops.prefill_kernel_available(cache.device, cache.dtype, cache.head_dim))

    @torch.no_grad()
    def decode_step(self, input_ids: torch.Tensor, slots: torch.Tensor, new_lens: torch.Tensor,
                    cache: KVCache) -> torch.Tensor:
        """One token per row: input_ids / slots / new_lens [B] → fp32 logits [B, V]. Writes the
        tokens' K/V at position new_lens - 1 of each slot. Free of host syncs on the kernel path."""
        d = DecodeContext(cache, slots, new_lens)
        x = self.embed_tokens(input_ids[:, None])
        if d.use_kernel:         # a table lookup: no host-side work to replay in a CUDA graph
            cos_t, sin_t = self.rope_table()
            cos, sin = cos_t[d.positions].unsqueeze(1), sin_t[d.positions].unsqueeze(1)     # [B, 1, D]
        else:                    # CPU/fp32: the very call `forward` makes (pinned bits)
            cos, sin = self.rotary(x, d.positions[:, None])
        delta = None
        for layer in self.decoder_layers:
            x, delta = layer.decode(x, delta, cos, sin, d)
        return self.logits(x, delta, first_token=True)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, slots: torch.Tensor,
                new_lens: torch.Tensor, cache: KVCache, logit_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
                allow_decode_kernel: bool = True, key_len: int | None = None) -> torch.Tensor:
        """input_ids/positions/valid [B, T]; slots/new_lens [B] (slot length after this chunk);
        key_len: max(new_lens) or a bound above it, if the caller knows one (else a host sync).

        Returns fp32 logits for `logit_rows` = (b_idx, t_idx) pairs, or for every position."""
        ctx = ForwardContext(cache, slots, positions, valid, new_lens, allow_decode_kernel, key_len)
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(x, positions)
        delta = None
        for layer in self.decoder_layers:
            x, delta = layer(x, delta, cos, sin, ctx)
        if logit_rows is not None:
            x, delta = x[logit_rows], None if delta is None else delta[logit_rows]
        return self.logits(x, delta)

    def logits(self, x: torch.Tensor, delta: torch.Tensor | PartialSums | None,
               first_token: bool = False) -> torch.Tensor:
        """The last residual add, the final norm and the LM head: fp32 logits [..., V] (of token 0
        of each row of x [B, T, H] with `first_token`). A W8A8 head takes its input codes from the
        fused norm (`EngineLinear.act_quant`)."""
        _, h = self.norm.add_and_norm(x, delta, None if self.head is None else self.head.act_quant())
        if first_token:
            h = (h[0][:, 0], h[1][:, 0]) if isinstance(h, tuple) else h[:, 0]
        if self.head is not None:
            out = self.head(h)
            assert isinstance(out, torch.Tensor)             # one part, no partial sums
            return out.float()
        w = self.embed_tokens.weight if self.tied else self.lm_head
        return F.linear(h, w).float()
