"""Fused elementwise kernels of the engine's decoder layer (Triton), for bf16/fp16 models on CUDA.

A decode step of a 36-layer model runs ~1,000 tiny torch kernels for its RMSNorms alone (upcast,
square, mean, add, rsqrt, multiply, downcast, weight: ~7 launches per norm, 4 norms per layer);
these kernels do each norm, and the SiLU·mul of the MLP, in one launch.

* `rms_norm(x, w, eps)`: HF's Llama/Qwen RMSNorm, ``w * (x_f32 * rsqrt(mean(x_f32²) + eps)).to(dt)``,
  with the weight product rounded like torch's (bf16 × bf16 is exact in fp32, then one rounding).
  The mean is a tree sum in another order than torch's reduction, so it can differ from torch in the
  last fp32 bit; outputs agree to one bf16 rounding step at the very most (tested).
* `silu_mul(gate, up)`: ``silu(gate) * up`` as torch computes it in that dtype: silu in fp32
  rounded to the dtype, then the product rounded to the dtype (Triton's exp may differ from
  torch's in the last fp32 bit, so a result can differ by one rounding step of the dtype).

fp32 models (the CPU-exact mode) and CPUs keep the torch code (`model.RMSNorm`); the engine uses
these only where the decode kernel runs (`EngineModel` decides once).
"""
from __future__ import annotations

import torch

from ._interp import HAVE_TRITON, interpreting, require_triton, runs_interpreted

INTERPRETED = interpreting()

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .triton_quant import cast_for_store, store_view

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, N, stride_x, stride_o, eps,
                         BLOCK: tl.constexpr, BF16_BITS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        var = tl.reduce(x * x, 0, tl.standard._sum_combine) / N      # (tl.sum breaks the reloaded interpreter)
        h = x * tl.math.rsqrt(var + eps)
        # h.to(dt) then weight * h in dt: both roundings as torch does them
        if BF16_BITS:
            h = _bf16_round(h)
        else:
            h = h.to(o_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(o_ptr + row * stride_o + offs, cast_for_store(w * h, o_ptr.dtype.element_ty, BF16_BITS), mask=mask)

    @triton.jit
    def _bf16_round(y):
        """fp32 → nearest-even bf16 value, as fp32 (the interpreter's casts truncate)."""
        bits = y.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, N, stride_g, stride_u, stride_o,
                         BLOCK: tl.constexpr, BF16_BITS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.0).to(tl.float32)
        s = g / (1.0 + tl.exp(-g))
        if BF16_BITS:
            s = _bf16_round(s)
        else:
            s = s.to(o_ptr.dtype.element_ty).to(tl.float32)
        tl.store(o_ptr + row * stride_o + offs, cast_for_store(s * u, o_ptr.dtype.element_ty, BF16_BITS), mask=mask)


if HAVE_TRITON:
    @triton.jit
    def _round_to(y, OUT_DTYPE: tl.constexpr, BF16_BITS: tl.constexpr):
        """Round fp32 to the output dtype and back (the rounding torch does after each op)."""
        if BF16_BITS:
            r = _bf16_round(y)
        else:
            r = y.to(OUT_DTYPE).to(tl.float32)
        return r

    @triton.jit
    def _qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr,
                             T, HQ, HKV, D, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sc_b, sc_t, eps,
                             NORM: tl.constexpr, BLOCK_D: tl.constexpr, BF16_BITS: tl.constexpr):
        """One program per (token, head) of q and k: optional per-head RMSNorm, then RoPE
        (x·cos + rotate_half(x)·sin), each op rounded to the model dtype as torch rounds it."""
        bt = tl.program_id(0).to(tl.int64)
        hh = tl.program_id(1)
        b = bt // T
        t = bt % T
        is_q = hh < HQ
        h = tl.where(is_q, hh, hh - HQ)
        offs = tl.arange(0, BLOCK_D)
        mask = offs < D
        half = D // 2
        rot = tl.where(offs < half, offs + half, offs - half)
        sign = tl.where(offs < half, -1.0, 1.0)
        if is_q:
            base = q_ptr + b * sq_b + t * sq_t + h * sq_h
            w_ptr = qw_ptr
            o_ptr = oq_ptr + (bt * HQ + h) * D
        else:
            base = k_ptr + b * sk_b + t * sk_t + h * sk_h
            w_ptr = kw_ptr
            o_ptr = ok_ptr + (bt * HKV + h) * D
        x = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
        xr = tl.load(base + rot, mask=mask, other=0.0).to(tl.float32)
        if NORM:
            var = tl.reduce(x * x, 0, tl.standard._sum_combine) / D
            inv = tl.math.rsqrt(var + eps)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            wr = tl.load(w_ptr + rot, mask=mask, other=0.0).to(tl.float32)
            x = _round_to(w * _round_to(x * inv, oq_ptr.dtype.element_ty, BF16_BITS), oq_ptr.dtype.element_ty, BF16_BITS)
            xr = _round_to(wr * _round_to(xr * inv, oq_ptr.dtype.element_ty, BF16_BITS), oq_ptr.dtype.element_ty,
                           BF16_BITS)
        c = tl.load(cos_ptr + b * sc_b + t * sc_t + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + b * sc_b + t * sc_t + offs, mask=mask, other=0.0).to(tl.float32)
        a = _round_to(x * c, oq_ptr.dtype.element_ty, BF16_BITS)
        r = _round_to((sign * xr) * s, oq_ptr.dtype.element_ty, BF16_BITS)
        tl.store(o_ptr + offs, cast_for_store(a + r, oq_ptr.dtype.element_ty, BF16_BITS), mask=mask)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight, k_weight, cos: torch.Tensor, sin: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, Hq, D], k [B, T, Hkv, D] (any strides, D contiguous), cos/sin [B, T, D] →
    (q, k) as contiguous [B, T, H, D]: per-head RMSNorm (when weights are given, Qwen3's q/k norm)
    then RoPE, in one launch; the torch code's roundings (see the module docstring for the norm)."""
    require_triton("triton_norm.qk_norm_rope")
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and d % 2 == 0
    cos, sin = cos.expand(b, t, d), sin.expand(b, t, d)
    assert cos.stride(-1) == 1 and sin.stride() == cos.stride()
    oq = torch.empty((b, t, hq, d), dtype=q.dtype, device=q.device)
    ok = torch.empty((b, t, hkv, d), dtype=k.dtype, device=k.device)
    if b * t:
        oq_arg, bits = store_view(oq, runs_interpreted(_qk_norm_rope_kernel))
        ok_arg, _ = store_view(ok, runs_interpreted(_qk_norm_rope_kernel))
        norm = q_weight is not None
        _qk_norm_rope_kernel[(b * t, hq + hkv)](
            q, k, q_weight if norm else q, k_weight if norm else k, cos, sin, oq_arg, ok_arg,
            t, hq, hkv, d, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            cos.stride(0), cos.stride(1), float(eps), NORM=norm, BLOCK_D=triton.next_power_of_2(d),
            BF16_BITS=bits, num_warps=1, enable_fp_fusion=False)   # no FMA: each op rounds as torch's
    return oq, ok


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x (bf16 / fp16), one program per row."""
    require_triton("triton_norm.rms_norm")
    x2 = _rows(x)
    m, n = x2.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m:
        o_arg, bits = store_view(out, runs_interpreted(_rms_norm_kernel))
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(m,)](x2, weight, o_arg, n, x2.stride(0), out.stride(0), float(eps), BLOCK=block,
                               BF16_BITS=bits, num_warps=max(1, min(16, block // 256)), enable_fp_fusion=False)
    return out.reshape(x.shape)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in the inputs' dtype (torch's `F.silu(gate) * up` to one rounding step)."""
    require_triton("triton_norm.silu_mul")
    g2, u2 = _rows(gate), _rows(up)
    m, n = g2.shape
    out = torch.empty((m, n), dtype=gate.dtype, device=gate.device)
    if m:
        o_arg, bits = store_view(out, runs_interpreted(_silu_mul_kernel))
        block = 1024
        _silu_mul_kernel[(m, triton.cdiv(n, block))](g2, u2, o_arg, n, g2.stride(0), u2.stride(0), out.stride(0),
                                                     BLOCK=block, BF16_BITS=bits, num_warps=4,
                                                     enable_fp_fusion=False)
    return out.reshape(gate.shape)


__all__ = ["qk_norm_rope", "rms_norm", "silu_mul"]
