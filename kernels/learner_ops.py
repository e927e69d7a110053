"""The learner's fused elementwise ops: RMSNorm and SiLU·mul in one Triton launch each, with
autograd, optionally also emitting the int8 codes the next W8A8 linear reads.

HF's eager RMSNorm runs ~7 kernels per norm (upcast, square, mean, add, rsqrt, multiply, downcast,
weight) and keeps fp32 copies for its backward; four to five norms per decoder layer made this the
largest non-GEMM cost of the learner's forwards on the GPU (`docs/kernels-history.md`, round 4). Here:

* `rms_norm(x, w, eps, quant)`: forward = `triton_norm.rms_norm` (HF's formula, each rounding
  where torch rounds; the mean's tree sum may differ from torch's in the last fp32 bit, so an
  output can differ by one bf16 step at most, as in the engine, which runs the same kernel);
  with `quant` the same launch also returns the per-token codes (`triton_norm.rms_norm_and_codes`).
  Backward from the saved input, each row in fp32: dx = r·g − r³·x·mean(g·x) with g = dy·w,
  r = rsqrt(mean(x²) + ε), rounded once to x's dtype; dw = Σ_rows dy·h in fp32, h = (x·r) rounded to
  the dtype, rounded once to w's dtype. One Triton launch (`triton_norm.rms_norm_backward`: dx, and
  per-program fp32 partials of dw that one torch sum adds up, deterministic) instead of ~20 torch
  kernels over [tokens, N] fp32 temporaries; `rms_norm_backward` here is the same formula in torch
  (the reference, and the path for rows over `triton_norm.BWD_MAX_N`).
* `silu_mul(gate, up, quant)`: forward = `triton_norm.silu_mul` (or `silu_mul_and_codes`); backward
  = what torch's autograd computes for `F.silu(gate) * up` (silu(gate) recomputed), in one launch
  (`triton_norm.silu_mul_backward`; torch's four kernels over strided halves of a grouped gate_up
  output ran at ~1.4 TB/s) or, off the fused path, torch's ops. `silu_mul_stacked(gu, n, quant)`
  takes the grouped output itself, so its gradient is written whole instead of concatenated.
* `rope(q, k, cos, sin)`: HF's `apply_rotary_pos_emb` (the engine's RoPE kernel without the norm),
  forward and backward bit-identical to torch's eager ops; HF's version builds `rotate_half` with a
  `cat` of strided halves, the slowest of its ops on the GPU.

Only for bf16 / fp16 on CUDA (`fused_applies`); fp32 models (the CPU-exact mode) keep HF's torch
code, so CPU numerics are unchanged. `AGENTQ_FUSED=0` turns the path off (as for the engine).
"""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from ._interp import HAVE_TRITON, cuda_half
from .grad_mode import records_graph

Codes = tuple[torch.Tensor, torch.Tensor]


def fused_applies(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
    """Whether the fused ops run for activations x (and a norm weight of x's dtype)."""
    return (cuda_half(x.device, x.dtype) and HAVE_TRITON
            and (weight is None or weight.dtype == x.dtype) and os.environ.get("AGENTQ_FUSED", "1") != "0")


def _outputs(ctx: Any, y: torch.Tensor, codes: Codes | None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A fused Function's outputs (y, codes, scales): the codes carry no gradient."""
    if codes is None:
        return y, None, None
    ctx.mark_non_differentiable(*codes)
    return y, codes[0], codes[1]


def _rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: tuple[float, str] | None
                     ) -> tuple[torch.Tensor, Codes | None]:
    from . import triton_norm
    if quant is None:
        return triton_norm.rms_norm(x, weight, eps), None
    return triton_norm.rms_norm_and_codes(x, weight, eps, *quant)


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, quant):
        y, codes = _rms_norm_forward(x, weight, eps, quant)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return _outputs(ctx, y, codes)

    @staticmethod
    def backward(ctx, gy, _g_codes, _g_scales):
        from . import triton_norm
        x, weight = ctx.saved_tensors
        if fused_applies(x, weight) and x.shape[-1] <= triton_norm.BWD_MAX_N:
            gx, gw = triton_norm.rms_norm_backward(x, weight, ctx.eps, gy)
        else:
            gx, gw = rms_norm_backward(x, weight, ctx.eps, gy)
        return (gx if ctx.needs_input_grad[0] else None), (gw if ctx.needs_input_grad[1] else None), None, None


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, eps: float, gy: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of y = w · dtype(x·rsqrt(mean(x²) + ε)), in fp32, rounded once to x's / w's dtype: the
    torch formula `triton_norm.rms_norm_backward` computes in one launch (see the module docstring)."""
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    h = (xf * r).to(x.dtype).float()
    gyf = gy.float()
    gw = (gyf * h).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    g = gyf * weight.float()
    gx = r * g - (r ** 3) * xf * (g * xf).mean(-1, keepdim=True)
    return gx.to(x.dtype), gw


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: tuple[float, str] | None = None
             ) -> tuple[torch.Tensor, Codes | None]:
    """Fused RMSNorm with autograd (see module docstring).

    Args:
        x: [..., N] bf16/fp16 activations; weight: [N] of x's dtype; eps: the norm's ε.
        quant: (scale floor, rounding) to also return the output's per-token int8 codes.
    Returns:
        (y [..., N], (codes int8 [..., N], scales fp32 [...]) or None)."""
    if not records_graph(x, weight):
        return _rms_norm_forward(x, weight, float(eps), quant)
    y, codes, scales = _RMSNormFn.apply(x, weight, float(eps), quant)
    return y, (None if codes is None else (codes, scales))


def _silu_mul_forward(gate: torch.Tensor, up: torch.Tensor, quant: tuple[float, str] | None
                      ) -> tuple[torch.Tensor, Codes | None]:
    from . import triton_norm
    if quant is None:
        return triton_norm.silu_mul(gate, up), None
    return triton_norm.silu_mul_and_codes(gate, up, *quant)


def silu_mul_backward(gy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                      out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(d gate, d up) of silu(gate) · up: one launch where the fused ops apply
    (`triton_norm.silu_mul_backward`), else the ops torch's autograd runs for `F.silu(gate) * up`
    (MulBackward, then SiluBackward). `out`: tensors to write them into."""
    if fused_applies(gy):
        from . import triton_norm
        return triton_norm.silu_mul_backward(gy, gate, up, out)
    dg, du = torch.ops.aten.silu_backward(gy * up, gate), gy * F.silu(gate)
    if out is None:
        return dg, du
    out[0].copy_(dg)
    out[1].copy_(du)
    return out


class _SiLUMulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, quant):
        y, codes = _silu_mul_forward(gate, up, quant)
        ctx.save_for_backward(gate, up)
        return _outputs(ctx, y, codes)

    @staticmethod
    def backward(ctx, gy, _g_codes, _g_scales):
        gate, up = ctx.saved_tensors
        if not any(ctx.needs_input_grad[:2]):
            return None, None, None
        g_gate, g_up = silu_mul_backward(gy, gate, up)
        return (g_gate if ctx.needs_input_grad[0] else None), (g_up if ctx.needs_input_grad[1] else None), None


class _SiLUMulStackedFn(torch.autograd.Function):
    """silu(gu[..., :n]) · gu[..., n:] over one grouped gate_up output: the backward writes the
    gradient of gu as one tensor, where two views' gradients would be concatenated by autograd
    (a copy of [tokens, 2n]) after elementwise ops over strided halves."""

    @staticmethod
    def forward(ctx, gu, n, quant):
        y, codes = _silu_mul_forward(gu[..., :n], gu[..., n:], quant)
        ctx.save_for_backward(gu)
        ctx.n = n
        return _outputs(ctx, y, codes)

    @staticmethod
    def backward(ctx, gy, _g_codes, _g_scales):
        (gu,) = ctx.saved_tensors
        n = ctx.n
        g = torch.empty(gu.shape, dtype=gu.dtype, device=gu.device)
        silu_mul_backward(gy, gu[..., :n], gu[..., n:], (g[..., :n], g[..., n:]))
        return g, None, None


def silu_mul(gate: torch.Tensor, up: torch.Tensor, quant: tuple[float, str] | None = None
             ) -> tuple[torch.Tensor, Codes | None]:
    """Fused silu(gate) · up with autograd; `quant` as in `rms_norm`. Returns (y, codes or None)."""
    if not records_graph(gate, up):
        return _silu_mul_forward(gate, up, quant)
    y, codes, scales = _SiLUMulFn.apply(gate, up, quant)
    return y, (None if codes is None else (codes, scales))


def silu_mul_stacked(gu: torch.Tensor, n: int, quant: tuple[float, str] | None = None
                     ) -> tuple[torch.Tensor, Codes | None]:
    """`silu_mul(gu[..., :n], gu[..., n:], quant)` for gate and up side by side in one tensor (a
    grouped gate_up projection's output), with the gradient of gu written as one tensor."""
    if not records_graph(gu):
        return _silu_mul_forward(gu[..., :n], gu[..., n:], quant)
    y, codes, scales = _SiLUMulStackedFn.apply(gu, n, quant)
    return y, (None if codes is None else (codes, scales))


def rope_applies(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether `rope` runs fused: half-precision CUDA q/k, cos/sin [B, T, D] of their dtype and
    without gradient (HF computes them from a buffer), an even head dim."""
    return (fused_applies(q) and k.dtype == q.dtype == cos.dtype == sin.dtype and cos.dim() == 3
            and q.dim() == 4 and q.shape[-1] % 2 == 0 and not (cos.requires_grad or sin.requires_grad))


class _RoPEFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope_launch(q, k, cos, sin)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        # y = x·cos + rotate_half(x)·sin has dx = dy·cos + rotate_halfᵀ(dy·sin); rotate_halfᵀ(z) =
        # (z₂, −z₁) is rotate_half with the sign on the other half, so the same launch with
        # sin' = −(sin₂, sin₁) computes it, with torch autograd's roundings
        half = sin.shape[-1] // 2
        sin_t = -torch.cat((sin[..., half:], sin[..., :half]), dim=-1)
        dq, dk = _rope_launch(gq, gk, cos, sin_t)
        return dq, dk, None, None


def _rope_launch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """`triton_norm.rope` on HF's [B, H, T, D] layout (views in, views out)."""
    from . import triton_norm
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    qt = qt if qt.stride(-1) == 1 else qt.contiguous()
    kt = kt if kt.stride(-1) == 1 else kt.contiguous()
    oq, ok = triton_norm.rope(qt, kt, cos, sin)
    return oq.transpose(1, 2), ok.transpose(1, 2)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's `apply_rotary_pos_emb(q, k, cos, sin)` in one launch each way, with the same bits:
    x·cos + rotate_half(x)·sin, each product and the sum rounded to the dtype as torch rounds them;
    the backward is torch autograd's to the bit as well.

    Args:
        q: [B, Hq, T, D], k: [B, Hkv, T, D] (HF's transposed views are read in place);
        cos, sin: [B, T, D] (broadcast over heads).
    Returns:
        (q_embed, k_embed) of q's and k's shapes."""
    if not records_graph(q, k):
        return _rope_launch(q, k, cos, sin)
    return _RoPEFn.apply(q, k, cos, sin)


__all__ = ["fused_applies", "rms_norm", "rms_norm_backward", "rope", "rope_applies", "silu_mul"]
