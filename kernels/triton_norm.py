"""Fused elementwise kernels of the engine's decoder layer (Triton), for bf16/fp16 models on CUDA.

A decode step of a 36-layer model runs ~1,000 tiny torch kernels for its RMSNorms alone (upcast,
square, mean, add, rsqrt, multiply, downcast, weight: ~7 launches per norm, 4 norms per layer);
these kernels do each norm, and the SiLU·mul of the MLP, in one launch.

* `rms_norm(x, w, eps)`: HF's Llama/Qwen RMSNorm, ``w * (x_f32 * rsqrt(mean(x_f32²) + eps)).to(dt)``,
  with the weight product rounded like torch's (bf16 × bf16 is exact in fp32, then one rounding).
  The mean is a tree sum in another order than torch's reduction, so it can differ from torch in the
  last fp32 bit; outputs agree to one bf16 rounding step at the very most (tested).
  Short aligned rows (N ≤ 1,024) go several to a program with each row in the one-row kernel's
  threads and warps, so with the same bits (`_rms_norm_rows_kernel`).
* `rms_norm_backward(x, w, eps, gy)`: the learner's RMSNorm backward (`learner_ops`), each row in
  fp32 registers, dw from per-program fp32 partials (deterministic).
* `silu_mul(gate, up)`: ``silu(gate) * up`` as torch computes it in that dtype: silu in fp32
  rounded to the dtype, then the product rounded to the dtype (Triton's exp may differ from
  torch's in the last fp32 bit, so a result can differ by one rounding step of the dtype).

fp32 models (the CPU-exact mode) and CPUs keep the torch code (`model.RMSNorm`); the engine uses
these only where the decode kernel runs (`EngineModel` decides once).
"""
from __future__ import annotations

import os

import torch

from ._interp import HAVE_TRITON, interpreting, num_sms, require_triton, runs_interpreted
from ._launch import launch_kernel
from .quant import PartialSums
from .triton_quant import _check_mode, quantize_rows, use_pdl

INTERPRETED = interpreting()

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .triton_quant import (_absmax_to_scale, _quant_block, _store_row_codes, _store_rows_codes, cast_for_store,
                               pdl_start, silu_mul_values, store_view, w8a8_values)
    from .triton_quant import bf16_round as _bf16_round
    from .triton_quant import round_to as _round_to

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, N, stride_x, stride_o, eps, inner, stride_xi,
                         BLOCK: tl.constexpr, BF16_BITS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        x = tl.load(x_ptr + _row_offset(row, inner, stride_x, stride_xi) + offs, mask=mask, other=0.0).to(tl.float32)
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
    def _rms_norm_rows_kernel(x_ptr, w_ptr, o_ptr, M, N, stride_x, stride_o, eps, inner, stride_xi,
                              ROWS: tl.constexpr, BLOCK: tl.constexpr, BF16_BITS: tl.constexpr):
        """`_rms_norm_kernel` for ROWS rows per program as a [ROWS, BLOCK] block. Launched with ROWS
        times the one-row kernel's warps on 16-byte-aligned rows (`_multi_row_fits`), each row gets
        the one-row layout (the same elements per thread, lanes and warps; checked by
        tests/kernels/test_compile_sm90.py), so its sum of squares adds up in the same order: the
        same bits as `_rms_norm_kernel` and `_add_rms_norm_kernel`."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        offs = tl.arange(0, BLOCK)
        cmask = offs < N
        mask = (rows < M)[:, None] & cmask[None, :]
        x = tl.load(x_ptr + _row_offset(rows, inner, stride_x, stride_xi)[:, None] + offs[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        var = tl.reduce(x * x, 1, tl.standard._sum_combine) / N    # (tl.sum breaks the reloaded interpreter)
        # h.to(dt) then weight * h in dt: both roundings as torch does them
        h = _round_to(x * tl.math.rsqrt(var + eps)[:, None], o_ptr.dtype.element_ty, BF16_BITS)
        w = tl.load(w_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
        tl.store(o_ptr + rows[:, None] * stride_o + offs[None, :],
                 cast_for_store(w[None, :] * h, o_ptr.dtype.element_ty, BF16_BITS), mask=mask)

    @triton.jit
    def _rms_norm_bwd_kernel(x_ptr, w_ptr, gy_ptr, dx_ptr, dwp_ptr, M, N, n_blocks, stride_x, stride_gy,
                             stride_dx, eps, inner, stride_xi, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                             STAGES: tl.constexpr, BF16_BITS: tl.constexpr):
        """RMSNorm backward (`rms_norm_backward`). Program p takes the blocks of ROWS rows p, p + P,
        p + 2P, ... (P programs; n_blocks = ⌈M / ROWS⌉; STAGES > 1 prefetches the next block's rows
        while this one computes): dx of each row, rounded once to the dtype, and Σ gy·h over its
        rows in fp32 into dwp[p] (the caller sums the P partials: no atomics, same bits every run)."""
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        cmask = offs < N
        w = tl.load(w_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
        acc = tl.full([ROWS, BLOCK], 0.0, tl.float32)       # Σ gy·h per (row slot, column), reduced once at the end
        for blk in tl.range(pid, n_blocks, tl.num_programs(0), num_stages=STAGES):
            rows = (blk * ROWS + tl.arange(0, ROWS)).to(tl.int64)     # blk·ROWS < M fits int32
            mask = (rows < M)[:, None] & cmask[None, :]
            x = tl.load(x_ptr + _row_offset(rows, inner, stride_x, stride_xi)[:, None] + offs[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            gy = tl.load(gy_ptr + rows[:, None] * stride_gy + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            r = tl.math.rsqrt(tl.reduce(x * x, 1, tl.standard._sum_combine) / N + eps)[:, None]
            acc += gy * _round_to(x * r, dx_ptr.dtype.element_ty, BF16_BITS)
            g = gy * w[None, :]
            mean_gx = tl.reduce(g * x, 1, tl.standard._sum_combine) / N
            dx = r * g - ((r * r * r) * x) * mean_gx[:, None]       # torch's order: (r³·x)·mean
            tl.store(dx_ptr + rows[:, None] * stride_dx + offs[None, :],
                     cast_for_store(dx, dx_ptr.dtype.element_ty, BF16_BITS), mask=mask)
        tl.store(dwp_ptr + pid.to(tl.int64) * N + offs, tl.reduce(acc, 0, tl.standard._sum_combine), mask=cmask)

    @triton.jit
    def _row_offset(rows, inner, stride_outer, stride_inner):
        """Element offset of rows laid out as [outer, inner] with two strides (`_row_layout`);
        inner = 1 is the plain [rows, N] layout (Triton specializes the 1: no division)."""
        return (rows // inner) * stride_outer + (rows % inner) * stride_inner

    @triton.jit
    def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, N, stride_g, stride_u, stride_o,
                         BLOCK: tl.constexpr, BF16_BITS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.0).to(tl.float32)
        y = silu_mul_values(g, u, o_ptr.dtype.element_ty, BF16_BITS)
        tl.store(o_ptr + row * stride_o + offs, cast_for_store(y, o_ptr.dtype.element_ty, BF16_BITS), mask=mask)


    @triton.jit
    def _silu_mul_bwd_kernel(gy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, N, stride_gy, stride_g, stride_u, stride_dg,
                             stride_du, BLOCK: tl.constexpr, BF16_BITS: tl.constexpr):
        """The backward of y = silu(g) · u as torch autograd computes it, one pass over a row tile:
        du = dy · silu(g) (silu rounded to the dtype as `F.silu` rounds it, then the product), dg =
        silu_backward(dy · u, g) (dy · u rounded first, then torch's opmath formula
        dy·s·(1 + g·(1 − s)), s = 1 / (1 + exp(−g)), rounded once). g / u / dg / du may be column
        slices of wider rows (a grouped gate_up output and its gradient)."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        dt = dg_ptr.dtype.element_ty
        gy = tl.load(gy_ptr + row * stride_gy + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.0).to(tl.float32)
        du = silu_mul_values(g, gy, dt, BF16_BITS)        # F.silu(g) rounded, times dy, rounded
        dyu = _round_to(gy * u, dt, BF16_BITS)
        s = 1.0 / (1.0 + tl.exp(-g))
        dg = dyu * s * (1.0 + g * (1.0 - s))
        tl.store(dg_ptr + row * stride_dg + offs, cast_for_store(dg, dt, BF16_BITS), mask=mask)
        tl.store(du_ptr + row * stride_du + offs, cast_for_store(du, dt, BF16_BITS), mask=mask)

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, s_ptr, o_ptr, q_ptr, qs_ptr, psx_ptr, psw_ptr, pb_ptr, N,
                             stride_x, stride_d, stride_s, stride_o, stride_q, p_slab, eps, floor,
                             HAS_DELTA: tl.constexpr, QUANT: tl.constexpr, STORE_NORMED: tl.constexpr,
                             HALF_AWAY: tl.constexpr, BLOCK: tl.constexpr, BF16_BITS: tl.constexpr,
                             PDL: tl.constexpr, PARTIALS: tl.constexpr = 0, P_BIAS: tl.constexpr = False):
        """One program per row: s = x + delta (rounded to the dtype, stored), h = RMSNorm(s) as
        `_rms_norm_kernel`, then h stored (STORE_NORMED) and/or h's per-row int8 codes + scale
        (QUANT; `_quant_rows_kernel`'s arithmetic on the rounded h). PARTIALS > 0: delta is a W8A8
        linear's int32 partial sums (`quant.PartialSums`: PARTIALS slices `p_slab` apart at d_ptr,
        scales at psx / psw, bias at pb), added up here and put through the GEMM's epilogue and
        output rounding, so delta has the bits the GEMM would have stored."""
        pdl_start(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_DELTA:
            if PARTIALS > 0:
                acc = tl.load(d_ptr + row * stride_d + offs, mask=mask, other=0)
                for sl in tl.static_range(1, PARTIALS):
                    acc += tl.load(d_ptr + sl * p_slab + row * stride_d + offs, mask=mask, other=0)
                sw = tl.load(psw_ptr + offs, mask=mask, other=0.0)
                d = w8a8_values(acc, tl.load(psx_ptr + row), sw, pb_ptr, offs, mask, P_BIAS)
                x = x + _round_to(d, s_ptr.dtype.element_ty, BF16_BITS)
            else:
                x = x + tl.load(d_ptr + row * stride_d + offs, mask=mask, other=0.0).to(tl.float32)
            x = _round_to(x, s_ptr.dtype.element_ty, BF16_BITS)
            tl.store(s_ptr + row * stride_s + offs, cast_for_store(x, s_ptr.dtype.element_ty, BF16_BITS), mask=mask)
        var = tl.reduce(x * x, 0, tl.standard._sum_combine) / N
        h = _round_to(x * tl.math.rsqrt(var + eps), s_ptr.dtype.element_ty, BF16_BITS)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = _round_to(w * h, s_ptr.dtype.element_ty, BF16_BITS)
        if QUANT:
            _store_row_codes(y, q_ptr + row * stride_q, qs_ptr + row, offs, mask, floor, HALF_AWAY)
        if STORE_NORMED:
            tl.store(o_ptr + row * stride_o + offs, cast_for_store(y, o_ptr.dtype.element_ty, BF16_BITS), mask=mask)

    @triton.jit
    def _silu_mul_quant_kernel(g_ptr, u_ptr, q_ptr, qs_ptr, y_ptr, N, stride_g, stride_u, stride_q, stride_y, floor,
                               HALF_AWAY: tl.constexpr, BLOCK: tl.constexpr, BF16_BITS: tl.constexpr,
                               OUT_DTYPE: tl.constexpr, STORE_Y: tl.constexpr, PDL: tl.constexpr,
                               CHUNKED: tl.constexpr):
        """One program per row: y = silu(gate) * up as `_silu_mul_kernel` rounds it, then its codes +
        scale (and y itself with STORE_Y). CHUNKED: the row in BLOCK-wide chunks, twice (absmax,
        then y again and its codes; the same y both times, so the same bits) instead of held whole
        in registers: many rows (prefill, the learner) then keep more programs per SM in flight."""
        pdl_start(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        g_row, u_row, y_row = g_ptr + row * stride_g, u_ptr + row * stride_u, y_ptr + row * stride_y
        if CHUNKED:
            amax_v = tl.full([BLOCK], 0, dtype=tl.float32)
            for n0 in range(0, N, BLOCK):
                mask = n0 + offs < N
                y = _silu_mul_row_part(g_row + n0, u_row + n0, offs, mask, OUT_DTYPE, BF16_BITS)
                amax_v = tl.maximum(amax_v, tl.where(mask, tl.abs(y), 0.0))
                if STORE_Y:
                    tl.store(y_row + n0 + offs, cast_for_store(y, OUT_DTYPE, BF16_BITS), mask=mask)
            amax = tl.reduce(amax_v, 0, tl.standard._elementwise_max)
            scale = _absmax_to_scale(amax, floor)
            for n0 in range(0, N, BLOCK):
                mask = n0 + offs < N
                y = _silu_mul_row_part(g_row + n0, u_row + n0, offs, mask, OUT_DTYPE, BF16_BITS)
                tl.store(q_ptr + row * stride_q + n0 + offs, _quant_block(y, scale, HALF_AWAY), mask=mask)
            tl.store(qs_ptr + row, scale)
        else:
            mask = offs < N
            y = _silu_mul_row_part(g_row, u_row, offs, mask, OUT_DTYPE, BF16_BITS)
            _store_row_codes(y, q_ptr + row * stride_q, qs_ptr + row, offs, mask, floor, HALF_AWAY)
            if STORE_Y:
                tl.store(y_row + offs, cast_for_store(y, OUT_DTYPE, BF16_BITS), mask=mask)

    @triton.jit
    def _silu_mul_row_part(g_row, u_row, offs, mask, OUT_DTYPE: tl.constexpr, BF16_BITS: tl.constexpr):
        """silu(gate) · up over one block of a row, fp32 values of the dtype, rounded as torch does."""
        g = tl.load(g_row + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_row + offs, mask=mask, other=0.0).to(tl.float32)
        return silu_mul_values(g, u, OUT_DTYPE, BF16_BITS)

    @triton.jit
    def _next_token(b, t, T):
        """(b, t) of the token after (b, t) in rows of T tokens, without a division."""
        t += 1
        return tl.where(t == T, b + 1, b), tl.where(t == T, 0, t)

    @triton.jit
    def _qk_norm_rope_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr,
                             kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr, pos_ptr, nnew_ptr,
                             BT, T, HQ, HKV, D, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sc_b, sc_t, eps,
                             sc_s, sc_h, sc_l, ss_s, ss_h, floor,
                             NORM: tl.constexpr, WRITE_KV: tl.constexpr, RAGGED: tl.constexpr,
                             KV_INT8: tl.constexpr, HALF_AWAY: tl.constexpr, HEADS: tl.constexpr,
                             TOKENS: tl.constexpr, BLOCK_D: tl.constexpr, BF16_BITS: tl.constexpr,
                             PDL: tl.constexpr):
        """One program per (TOKENS consecutive tokens of the BT = B·T, group of HEADS heads) of q, of
        k (and of v with WRITE_KV; a group never mixes them: program (·, j) takes q heads j·HEADS..
        while j < ⌈HQ / HEADS⌉, then k heads, then v heads; heads past the count are masked), each
        token as a [HEADS, BLOCK_D] block: optional per-head RMSNorm (reduced along axis 1), then
        RoPE (x·cos + rotate_half(x)·sin), each op rounded to the model dtype as torch rounds it.
        Launched with HEADS warps, each head gets the one-head program's layout (checked by
        tests/kernels/test_compile_sm90.py), so its sum of squares adds up in the same order: the
        same bits for every HEADS and TOKENS (the tokens of a program are done one after another,
        each as the one-token program does it; the head group's setup and norm weights are read
        once for all of them). WRITE_KV: k and v of token (b, t) go straight into the slot cache at
        (slot[b], pos[b·T + t]) — int8 codes + per-token-head scale with KV_INT8
        (`quantize_kv_to_cache`'s arithmetic on the rounded values), else the values — and only q
        is returned; RAGGED (prefill chunks): only each row's first nnew[b] tokens are written."""
        pdl_start(PDL)
        bt0 = tl.program_id(0).to(tl.int64) * TOKENS
        j = tl.program_id(1)
        nq = (HQ + HEADS - 1) // HEADS
        nk = (HKV + HEADS - 1) // HEADS
        offs = tl.arange(0, BLOCK_D)
        dmask = offs < D
        b = bt0 // T                  # (b, t) of the program's first token, then stepped along
        t = bt0 % T
        if j >= nq + nk:            # WRITE_KV only: v heads, stored as they are
            hs = (j - nq - nk) * HEADS + tl.arange(0, HEADS)
            mask = (hs < HKV)[:, None] & dmask[None, :]
            rows = v_ptr + hs[:, None].to(tl.int64) * sv_h + offs[None, :]
            for i in tl.static_range(TOKENS):
                bt = bt0 + i
                if bt < BT:
                    y = tl.load(rows + b * sv_b + t * sv_t, mask=mask, other=0.0).to(tl.float32)
                    _store_kv_rows(y, vc_ptr, vs_ptr, slot_ptr, pos_ptr, nnew_ptr, b, t, bt, hs, HKV, offs, mask,
                                   sc_s, sc_h, sc_l, ss_s, ss_h, floor, RAGGED, KV_INT8, HALF_AWAY, BF16_BITS)
                b, t = _next_token(b, t, T)
        else:
            is_q = j < nq
            hs = tl.where(is_q, j, j - nq) * HEADS + tl.arange(0, HEADS)
            half = D // 2
            rot = tl.where(offs < half, offs + half, offs - half)
            sign = tl.where(offs < half, -1.0, 1.0)
            if is_q:
                heads = q_ptr + hs[:, None].to(tl.int64) * sq_h
                s_b, s_t = sq_b, sq_t
                w_ptr = qw_ptr
                hmask = hs < HQ
            else:
                heads = k_ptr + hs[:, None].to(tl.int64) * sk_h
                s_b, s_t = sk_b, sk_t
                w_ptr = kw_ptr
                hmask = hs < HKV
            mask = hmask[:, None] & dmask[None, :]
            # the weights, cos and sin as whole [HEADS, BLOCK_D] blocks (a warp's copy per head, as a
            # broadcast costs): aligned, their vector loads then set the block's layout as they set
            # the one-head program's (tests/kernels/test_compile_sm90.py)
            cols = tl.full([HEADS, 1], 0, tl.int32) + offs[None, :]
            cols_r = tl.full([HEADS, 1], 0, tl.int32) + rot[None, :]
            dmask2 = cols < D
            if NORM:
                w = tl.load(w_ptr + cols, mask=dmask2, other=0.0).to(tl.float32)
                wr = tl.load(w_ptr + cols_r, mask=dmask2, other=0.0).to(tl.float32)
            for i in tl.static_range(TOKENS):
                bt = bt0 + i
                if bt < BT:
                    base = heads + b * s_b + t * s_t
                    x = tl.load(base + offs[None, :], mask=mask, other=0.0).to(tl.float32)
                    xr = tl.load(base + rot[None, :], mask=mask, other=0.0).to(tl.float32)
                    if NORM:
                        var = tl.reduce(x * x, 1, tl.standard._sum_combine) / D
                        inv = tl.math.rsqrt(var + eps)[:, None]
                        x = _round_to(w * _round_to(x * inv, oq_ptr.dtype.element_ty, BF16_BITS),
                                      oq_ptr.dtype.element_ty, BF16_BITS)
                        xr = _round_to(wr * _round_to(xr * inv, oq_ptr.dtype.element_ty, BF16_BITS),
                                       oq_ptr.dtype.element_ty, BF16_BITS)
                    c = tl.load(cos_ptr + b * sc_b + t * sc_t + cols, mask=dmask2, other=0.0).to(tl.float32)
                    s = tl.load(sin_ptr + b * sc_b + t * sc_t + cols, mask=dmask2, other=0.0).to(tl.float32)
                    a = _round_to(x * c, oq_ptr.dtype.element_ty, BF16_BITS)
                    r = _round_to((sign[None, :] * xr) * s, oq_ptr.dtype.element_ty, BF16_BITS)
                    if is_q:
                        tl.store(oq_ptr + (bt * HQ + hs[:, None]) * D + offs[None, :],
                                 cast_for_store(a + r, oq_ptr.dtype.element_ty, BF16_BITS), mask=mask)
                    elif WRITE_KV:
                        _store_kv_rows(_round_to(a + r, oq_ptr.dtype.element_ty, BF16_BITS), kc_ptr, ks_ptr,
                                       slot_ptr, pos_ptr, nnew_ptr, b, t, bt, hs, HKV, offs, mask, sc_s, sc_h, sc_l,
                                       ss_s, ss_h, floor, RAGGED, KV_INT8, HALF_AWAY, BF16_BITS)
                    else:
                        tl.store(ok_ptr + (bt * HKV + hs[:, None]) * D + offs[None, :],
                                 cast_for_store(a + r, oq_ptr.dtype.element_ty, BF16_BITS), mask=mask)
                b, t = _next_token(b, t, T)

    @triton.jit
    def _rope_heads_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, T, HQ, HKV, D,
                           sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sc_b, sc_t,
                           HB: tl.constexpr, BLOCK_D: tl.constexpr, BF16_BITS: tl.constexpr):
        """RoPE alone (`_qk_norm_rope_kernel` without norm or cache, the same roundings) over a
        [HB heads, D] tile per program: program (token, j) takes q heads j·HB.. while j < cdiv(HQ, HB),
        else k heads. The learner's sequences have tokens × heads rows of 256 bytes; one warp per
        row kept the GPU waiting on latency (134 µs where the bytes need ~50)."""
        bt = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        b = bt // T
        t = bt % T
        nq = (HQ + HB - 1) // HB
        is_q = j < nq
        hs = tl.where(is_q, j, j - nq) * HB + tl.arange(0, HB)
        offs = tl.arange(0, BLOCK_D)
        half = D // 2
        rot = tl.where(offs < half, offs + half, offs - half)
        sign = tl.where(offs < half, -1.0, 1.0)
        if is_q:
            rows = q_ptr + b * sq_b + t * sq_t + hs[:, None].to(tl.int64) * sq_h
            dst = oq_ptr + (bt * HQ + hs[:, None].to(tl.int64)) * D
            mask = (hs[:, None] < HQ) & (offs[None, :] < D)
        else:
            rows = k_ptr + b * sk_b + t * sk_t + hs[:, None].to(tl.int64) * sk_h
            dst = ok_ptr + (bt * HKV + hs[:, None].to(tl.int64)) * D
            mask = (hs[:, None] < HKV) & (offs[None, :] < D)
        x = tl.load(rows + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        xr = tl.load(rows + rot[None, :], mask=mask, other=0.0).to(tl.float32)
        dmask = offs < D
        c = tl.load(cos_ptr + b * sc_b + t * sc_t + offs, mask=dmask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + b * sc_b + t * sc_t + offs, mask=dmask, other=0.0).to(tl.float32)
        a = _round_to(x * c[None, :], oq_ptr.dtype.element_ty, BF16_BITS)
        r = _round_to((sign[None, :] * xr) * s[None, :], oq_ptr.dtype.element_ty, BF16_BITS)
        tl.store(dst + offs[None, :], cast_for_store(a + r, oq_ptr.dtype.element_ty, BF16_BITS), mask=mask)

    @triton.jit
    def _store_kv_rows(y, c_ptr, cs_ptr, slot_ptr, pos_ptr, nnew_ptr, b, t, bt, hs, H, offs, mask, sc_s, sc_h, sc_l,
                       ss_s, ss_h, floor, RAGGED: tl.constexpr, KV_INT8: tl.constexpr, HALF_AWAY: tl.constexpr,
                       BF16_BITS: tl.constexpr):
        """Token t of row b (flat index bt), K or V heads hs (a [len(hs), BLOCK_D] block of fp32
        values of the model dtype; heads ≥ H and `mask`'s other lanes are not written), into the
        slot cache at (slot[b], pos[bt]); RAGGED: only if t < nnew[b] (padding is not written)."""
        live = True                   # a constexpr: decode compiles no branch
        if RAGGED:
            live = t < tl.load(nnew_ptr + b)
        if live:
            slot = tl.load(slot_ptr + b).to(tl.int64)
            pos = tl.load(pos_ptr + bt).to(tl.int64)
            h = hs.to(tl.int64)
            dst = c_ptr + slot * sc_s + h[:, None] * sc_h + pos * sc_l
            if KV_INT8:
                _store_rows_codes(y, dst, cs_ptr + slot * ss_s + h * ss_h + pos, offs, mask, hs < H, floor,
                                  HALF_AWAY)
            else:
                tl.store(dst + offs[None, :], cast_for_store(y, c_ptr.dtype.element_ty, BF16_BITS), mask=mask)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight, k_weight, cos: torch.Tensor, sin: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, Hq, D], k [B, T, Hkv, D] (any strides, D contiguous), cos/sin [B, T, D] →
    (q, k) as contiguous [B, T, H, D]: per-head RMSNorm (when weights are given, Qwen3's q/k norm)
    then RoPE, in one launch; the torch code's roundings (see the module docstring for the norm)."""
    require_triton("triton_norm.qk_norm_rope")
    b, t, hq, d = q.shape
    ok = torch.empty((b, t, k.shape[2], d), dtype=k.dtype, device=k.device)
    oq = _launch_qk_norm_rope(q, k, None, q_weight, k_weight, cos, sin, eps, ok, None)
    return oq, ok


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         heads_per_program: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """`qk_norm_rope` without the norm (the same bits) for long sequences: `heads_per_program`
    heads of one token per program instead of one. q [B, T, Hq, D], k [B, T, Hkv, D] (any
    strides, D contiguous), cos/sin [B, T, D] → (q, k) contiguous [B, T, H, D]."""
    require_triton("triton_norm.rope")
    assert heads_per_program >= 1 and heads_per_program & (heads_per_program - 1) == 0, "a power of two"
    cos, sin, oq = _rope_operands(q, k, cos, sin)
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    ok = torch.empty((b, t, hkv, d), dtype=k.dtype, device=k.device)
    if b * t:
        interp = runs_interpreted(_rope_heads_kernel)
        (oq_arg, bits), ok_arg = store_view(oq, interp), store_view(ok, interp)[0]
        hb = min(heads_per_program, triton.next_power_of_2(max(hq, hkv)))
        block_d = triton.next_power_of_2(d)
        launch_kernel(_rope_heads_kernel, (b * t, triton.cdiv(hq, hb) + triton.cdiv(hkv, hb)),
            q, k, cos, sin, oq_arg, ok_arg, t, hq, hkv, d, q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2), cos.stride(0), cos.stride(1),
            HB=hb, BLOCK_D=block_d, BF16_BITS=bits, num_warps=max(1, min(8, hb * block_d // 256)),
            enable_fp_fusion=False)   # no FMA: each op rounds as torch's
    return oq, ok


def qk_norm_rope_to_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight, k_weight,
                          cos: torch.Tensor, sin: torch.Tensor, eps: float, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
                          slots: torch.Tensor, positions: torch.Tensor, kv_quant: tuple[float, str] | None,
                          n_new: torch.Tensor | None = None) -> torch.Tensor:
    """`qk_norm_rope`, with the tokens' K (after norm + RoPE) and V written straight into the slot
    cache instead of returned — one launch for what took three (a decode step, T = 1, or a
    prefill chunk, whose attention then reads K/V from the cache).

    Args:
        q, k, v: [B, T, H, D] views of the fused qkv projection; cos/sin [B, T, D].
        k_cache, v_cache: [S, Hkv, Lmax, D] int8 codes (with k_scale / v_scale [S, Hkv, Lmax] fp32
            and `kv_quant` = (scale floor, rounding) of the KV spec) or model-dtype values (scales
            and kv_quant None).
        slots: [B] each row's slot; positions: [B, T] (or [B] when T = 1) each token's position in it.
        n_new: [B] valid tokens per row, its first n_new[b]; the rest are padding and leave the
            cache untouched. None: every token is written.
    Returns:
        q after norm + RoPE, contiguous [B, T, Hq, D] (padding tokens included): `qk_norm_rope`'s
        q. The cache holds exactly what `qk_norm_rope` + `triton_quant.quantize_kv_to_cache` (or a
        plain copy) of the valid tokens would store.
    """
    require_triton("triton_norm.qk_norm_rope_to_cache")
    b, t = q.shape[:2]
    assert v.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert (k_cache.dtype == torch.int8) == (kv_quant is not None) == (k_scale is not None)
    # the kernel reads token (b, t)'s position at b·T + t (a view when positions are contiguous)
    return _launch_qk_norm_rope(q, k, v, q_weight, k_weight, cos, sin, eps, None,
                                (k_cache, v_cache, k_scale, v_scale, slots, positions.reshape(b * t), n_new,
                                 kv_quant))


def _rope_operands(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The RoPE launches' shared checks: q [B, T, Hq, D] / k [B, T, Hkv, D] with D contiguous and
    even; cos / sin broadcast to [B, T, D]. Returns (cos, sin, the [B, T, Hq, D] q output)."""
    b, t, hq, d = q.shape
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and d % 2 == 0
    cos, sin = cos.expand(b, t, d), sin.expand(b, t, d)
    assert cos.stride(-1) == 1 and sin.stride() == cos.stride()
    return cos, sin, torch.empty((b, t, hq, d), dtype=q.dtype, device=q.device)


#: heads of one token per `_qk_norm_rope_kernel` program above `ROPE_DECODE_MAX_ROWS` tokens
#: (prefill chunks): one [heads, D] block in as many warps, a warp per head (the one-head program's
#: layout, so the same bits). One warp per (token, head) was 1.57M programs for a 32768-token chunk
#: of Qwen3-8B (32 + 8 + 8 heads): 950 µs with the int8 K/V write on the H200, 484 µs at 4 or 8
#: heads per program (`bench_kernels --rope`, docs/bench/h200-r11/rope.log)
ROPE_HEADS_PER_PROGRAM = 8
#: ...and up to this many tokens (decode steps: B ≤ 256 rows of one token), `ROPE_DECODE_HEADS`:
#: 5.9 µs at B 64 against 7.6 µs with one head per program (6.2-6.9 µs at 4-16)
ROPE_DECODE_MAX_ROWS = 256
ROPE_DECODE_HEADS = 2
#: environment variable that overrides the choice (a power of two ≤ 32; A/B runs on the GPU)
ROPE_HEADS_ENV = "AGENTQ_ROPE_HEADS"


def rope_heads_per_program(rows: int) -> int:
    """Heads per `_qk_norm_rope_kernel` program for a launch over `rows` = B·T tokens:
    `ROPE_DECODE_HEADS` up to `ROPE_DECODE_MAX_ROWS` (decode), `ROPE_HEADS_PER_PROGRAM` above
    (prefill), or the value of $AGENTQ_ROPE_HEADS when set. Every choice stores the same bits; only
    the speed differs."""
    env = os.environ.get(ROPE_HEADS_ENV, "").strip()
    heads = int(env) if env else (ROPE_DECODE_HEADS if rows <= ROPE_DECODE_MAX_ROWS else ROPE_HEADS_PER_PROGRAM)
    if not 1 <= heads <= 32 or heads & (heads - 1):
        raise ValueError(f"{ROPE_HEADS_ENV}={heads}: heads per program must be a power of two in [1, 32]")
    return heads


#: consecutive tokens per `_qk_norm_rope_kernel` program above `ROPE_DECODE_MAX_ROWS` tokens
#: (prefill chunks; decode keeps one token a program, the grid being small already). Each token
#: is done as the one-token program does it, so every choice stores the same bits; the launch
#: looked issue-bound at prefill rows, most of a program's instructions being its setup (round
#: 33's SASS reading), which several tokens share. `bench_kernels --rope` on an H100 (round 41,
#: docs/bench/h100-r41/rope.log, 8 heads, 32,768 tokens): into the int8 cache 351 → 317 µs
#: (Qwen3-1.7B heads) and 494 → 447 µs (8B) at 8 tokens against 1; q and k returned 221 → 185 and
#: 364 → 302 µs. The 1B engine's tokens/s moved within its noise (1.50× / 1.54× either way)
ROPE_TOKENS_PER_PROGRAM = 8
#: environment variable that overrides it (a power of two ≤ 16; A/B runs on the GPU)
ROPE_TOKENS_ENV = "AGENTQ_ROPE_TOKENS"


def rope_tokens_per_program(rows: int) -> int:
    """Tokens per `_qk_norm_rope_kernel` program for a launch over `rows` = B·T tokens: 1 up to
    `ROPE_DECODE_MAX_ROWS` (decode), else `ROPE_TOKENS_PER_PROGRAM` or the value of
    $AGENTQ_ROPE_TOKENS when set. Every choice stores the same bits; only the speed differs."""
    env = os.environ.get(ROPE_TOKENS_ENV, "").strip()
    if env and not (env.isascii() and env.isdigit()):
        raise ValueError(f"{ROPE_TOKENS_ENV}={env!r}: tokens per program must be a power of two in [1, 16]")
    tokens = int(env) if env else ROPE_TOKENS_PER_PROGRAM
    if not 1 <= tokens <= 16 or tokens & (tokens - 1):
        raise ValueError(f"{ROPE_TOKENS_ENV}={tokens}: tokens per program must be a power of two in [1, 16]")
    return 1 if rows <= ROPE_DECODE_MAX_ROWS else tokens


def _heads_fit(q: torch.Tensor, k: torch.Tensor, d: int) -> bool:
    """Whether `_qk_norm_rope_kernel` can take several heads per program and keep the one-head
    program's bits: q and k 16-byte-aligned with 16-divisible strides and head dim, which Triton
    specializes on (vector loads), so each head's row gets the one-head layout (compared in
    tests/kernels/test_compile_sm90.py); unaligned rows could be split across warps instead."""
    return d % 16 == 0 and all(x.data_ptr() % 16 == 0 and all(st % 16 == 0 for st in x.stride()[:-1])
                               for x in (q, k))


def _launch_qk_norm_rope(q, k, v, q_weight, k_weight, cos, sin, eps, ok, cache) -> torch.Tensor:
    """The one launch behind `qk_norm_rope` (ok given) and `qk_norm_rope_to_cache` (cache given):
    `rope_heads_per_program` heads per program (at most the larger head count, rounded up to a
    power of two; 1 unless `_heads_fit`), one warp each."""
    cos, sin, oq = _rope_operands(q, k, cos, sin)
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    if not b * t:
        return oq
    interp = runs_interpreted(_qk_norm_rope_kernel)
    oq_arg, bits = store_view(oq, interp)
    hb = min(rope_heads_per_program(b * t), triton.next_power_of_2(max(hq, hkv))) if _heads_fit(q, k, d) else 1
    groups = triton.cdiv(hq, hb) + triton.cdiv(hkv, hb) * (1 if cache is None else 2)     # q, k (, v) groups
    if cache is None:
        ok_arg = store_view(ok, interp)[0]
        kc = vc = ks = vs = slots = pos = oq_arg
        cstr, sstr, floor, int8, half_away, v, n_new = (0, 0, 0), (0, 0), 0.0, False, False, k, None
    else:
        kc, vc, ks, vs, slots, pos, n_new, kv_quant = cache
        int8 = kv_quant is not None
        if not int8:
            kc, vc = store_view(kc, interp)[0], store_view(vc, interp)[0]
            ks = vs = kc
        ok_arg, cstr = oq_arg, (kc.stride(0), kc.stride(1), kc.stride(2))
        sstr = (ks.stride(0), ks.stride(1)) if int8 else (0, 0)
        floor = float(kv_quant[0]) if int8 else 0.0
        half_away = _check_mode(kv_quant[1]) if int8 else False
    norm = q_weight is not None
    pdl = use_pdl(_qk_norm_rope_kernel, q.device, b * t)
    tokens = rope_tokens_per_program(b * t)
    launch_kernel(_qk_norm_rope_kernel, (triton.cdiv(b * t, tokens), groups),
        q, k, v, q_weight if norm else q, k_weight if norm else k, cos, sin, oq_arg, ok_arg,
        kc, vc, ks, vs, slots, pos, slots if n_new is None else n_new,     # (n_new read only when RAGGED)
        b * t, t, hq, hkv, d, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), cos.stride(0), cos.stride(1), float(eps), *cstr, *sstr, floor,
        NORM=norm, WRITE_KV=cache is not None, RAGGED=n_new is not None, KV_INT8=int8, HALF_AWAY=half_away,
        HEADS=hb, TOKENS=tokens, BLOCK_D=triton.next_power_of_2(d), BF16_BITS=bits, PDL=pdl, launch_pdl=pdl, num_warps=hb,
        enable_fp_fusion=False)   # no FMA: each op rounds as torch's
    return oq


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _row_layout(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int, int]:
    """(tensor, rows, inner, stride_outer, stride_inner) addressing x's rows (last dim, stride 1)
    without a copy where two strides reach them: row r starts at (r // inner)·stride_outer +
    (r % inner)·stride_inner. That covers per-head views of a wider projection output (Qwen3's q/k
    norms read [B, T, H, D] column slices of the grouped q/k/v GEMM's output, `qat.ProjectionGroup`);
    anything else is copied to plain rows."""
    n = x.shape[-1]
    if x.stride(-1) == 1:
        try:
            x2 = x.view(-1, n)
            return x2, x2.shape[0], 1, x2.stride(0), 0
        except RuntimeError:
            pass
        if x.dim() >= 3:
            try:
                x3 = x.view(-1, x.shape[-2], n)
                return x3, x3.shape[0] * x3.shape[1], x3.shape[1], x3.stride(0), x3.stride(1)
            except RuntimeError:
                pass
    x2 = _rows(x)
    return x2, x2.shape[0], 1, x2.stride(0), 0


#: rows of up to this block (power of two ≥ N) are normalized ROWS = FWD_ELEMS // block per program
FWD_MAX_MULTI_ROW = 1024
FWD_ELEMS = 2048
#: the backward's launch: blocks of about BWD_ELEMS elements (ROWS·BLOCK) in BWD_WARPS warps, one
#: program per row block up to BWD_PROGRAMS_PER_SM per multiprocessor (each then loops over blocks,
#: loading the next ones while computing one, BWD_STAGES deep): the grid is one wave. The best of
#: the six launches `bench_kernels --learner-norms` swept on the H200 (round 5, bf16): 49.9 µs at
#: 10240 × 2048 (2.5 TB/s) and 77.7 µs at 327680 × 128 (3.2 TB/s; the torch formula 1,909 µs);
#: the first default (4096 elements, 2 per SM, 8 warps, 2 stages) took 98.4 µs at 327680 × 128.
BWD_ELEMS = 8192
BWD_WARPS = 16
BWD_PROGRAMS_PER_SM = 1
BWD_STAGES = 3
#: rows longer than this keep the torch backward (a row must fit one program's registers)
BWD_MAX_N = 16384


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, multi_row: bool = True) -> torch.Tensor:
    """RMSNorm over the last dim of x (bf16 / fp16).

    Args:
        x: [..., N]; weight: [N]; eps: the norm's ε.
        multi_row: short rows (N ≤ `FWD_MAX_MULTI_ROW`, e.g. Qwen3's q/k norms, N = 128) go
            `FWD_ELEMS` // N rows to a program instead of one (fewer, fuller programs; the same
            bits, see `_rms_norm_rows_kernel`); False: one row per program always (benchmarks).
    Returns:
        the normed rows, x's shape and dtype."""
    require_triton("triton_norm.rms_norm")
    x2, m, inner, s_outer, s_inner = _row_layout(x)
    n = x.shape[-1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if not m:
        return out.reshape(x.shape)
    interp = runs_interpreted(_rms_norm_kernel)
    o_arg, bits = store_view(out, interp)
    block = triton.next_power_of_2(n)
    fits = _multi_row_fits(x2, weight, block) and s_outer % 16 == 0 and s_inner % 16 == 0
    rows = min(16, FWD_ELEMS // block) if multi_row and fits else 1
    if rows > 1:      # each row keeps the one-row kernel's warps (and with them its summation order)
        launch_kernel(_rms_norm_rows_kernel, (triton.cdiv(m, rows),),
            x2, weight, o_arg, m, n, s_outer, out.stride(0), float(eps), inner, s_inner, ROWS=rows, BLOCK=block,
            BF16_BITS=bits, num_warps=rows * _norm_warps(block), enable_fp_fusion=False)
    else:
        launch_kernel(_rms_norm_kernel, (m,),
            x2, weight, o_arg, n, s_outer, out.stride(0), float(eps), inner, s_inner, BLOCK=block,
            BF16_BITS=bits, num_warps=_norm_warps(block), enable_fp_fusion=False)
    return out.reshape(x.shape)


def _multi_row_fits(x2: torch.Tensor, weight: torch.Tensor, block: int) -> bool:
    """Whether `_rms_norm_rows_kernel` gives each row the one-row kernel's layout: short rows, and
    16-byte-aligned pointers and 16-divisible sizes, which Triton specializes on (vector loads; the
    layouts were compared for these, tests/kernels/test_compile_sm90.py)."""
    n = x2.shape[-1]
    return (block <= FWD_MAX_MULTI_ROW and n % 16 == 0 and x2.stride(0) % 16 == 0
            and x2.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0)


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, eps: float, gy: torch.Tensor,
                      launch: tuple[int, int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of y = w · dtype(x·rsqrt(mean(x²) + ε)) (`rms_norm`), each row in fp32: r = rsqrt(mean(x²) + ε),
    h = dtype(x·r), g = gy·w, dx = r·g − r³·x·mean(g·x) rounded once to x's dtype; dw = Σ_rows gy·h
    in fp32 (per-program partials summed by torch), rounded once to w's dtype.

    Args:
        x: the forward's input [..., N] (bf16 / fp16, N ≤ `BWD_MAX_N`); weight: [N]; eps: the norm's ε;
        gy: the gradient of y, x's shape.
        launch: (elements per block, programs per multiprocessor, warps, stages) overriding
            `BWD_ELEMS`, `BWD_PROGRAMS_PER_SM`, `BWD_WARPS`, `BWD_STAGES` (tuning; dw's fp32 sum
            order follows the block and program counts).
    Returns:
        (dx of x's shape and dtype, dw [N] of weight's dtype). The sums run in another order than
        torch's, so values can differ from the torch formula by fp32 rounding (tested)."""
    require_triton("triton_norm.rms_norm_backward")
    (x2, m, inner, s_outer, s_inner), gy2 = _row_layout(x), _rows(gy)
    n = x.shape[-1]
    if n > BWD_MAX_N:
        raise ValueError(f"rms_norm_backward: rows of {n} elements are over BWD_MAX_N = {BWD_MAX_N}")
    elems, per_sm, warps, stages = launch or (BWD_ELEMS, BWD_PROGRAMS_PER_SM, BWD_WARPS, BWD_STAGES)
    block = triton.next_power_of_2(n)
    rows = triton.next_power_of_2(max(1, elems // block))
    blocks = triton.cdiv(m, rows)
    programs = max(1, min(blocks, per_sm * num_sms(x.device)))
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    # every program writes its row of partials (zeros only when there is no row to launch for)
    partial = (torch.empty if m else torch.zeros)((programs, n), dtype=torch.float32, device=x.device)
    if m:
        dx_arg, bits = store_view(dx, runs_interpreted(_rms_norm_bwd_kernel))
        launch_kernel(_rms_norm_bwd_kernel, (programs,),
            x2, weight, gy2, dx_arg, partial, m, n, blocks, s_outer, gy2.stride(0), dx.stride(0), float(eps),
            inner, s_inner, ROWS=rows, BLOCK=block, STAGES=stages, BF16_BITS=bits, num_warps=warps,
            enable_fp_fusion=False)   # no FMA: each op rounds as the torch formula's
    return dx.reshape(x.shape), partial.sum(0).to(weight.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in the inputs' dtype (torch's `F.silu(gate) * up` to one rounding step)."""
    require_triton("triton_norm.silu_mul")
    g2, u2 = _rows(gate), _rows(up)
    m, n = g2.shape
    out = torch.empty((m, n), dtype=gate.dtype, device=gate.device)
    if m:
        o_arg, bits = store_view(out, runs_interpreted(_silu_mul_kernel))
        block = 1024
        launch_kernel(_silu_mul_kernel, (m, triton.cdiv(n, block)),
            g2, u2, o_arg, n, g2.stride(0), u2.stride(0), out.stride(0),
            BLOCK=block, BF16_BITS=bits, num_warps=4,
            enable_fp_fusion=False)
    return out.reshape(gate.shape)


def silu_mul_backward(gy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                      out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(d gate, d up) of y = silu(gate) · up for the gradient gy, in one launch: torch autograd's
    `silu_backward(gy · up, gate)` and `gy · F.silu(gate)` with its roundings (the exponential and
    division as the forward kernels take them; torch's own kernel may contract g·(1 − s) + 1 into
    an FMA or not, so d gate can differ from it in the last bit). `out`: where to write them (e.g.
    the two column halves of one grouped gate_up gradient); gate and up may be column slices."""
    require_triton("triton_norm.silu_mul_backward")
    g2, u2, gy2 = _rows(gate), _rows(up), _rows(gy)
    m, n = g2.shape
    dg, du = out if out is not None else (torch.empty_like(gate), torch.empty_like(up))
    dg2, du2 = dg.reshape(-1, n), du.reshape(-1, n)
    if dg2.stride(-1) != 1 or du2.stride(-1) != 1 or dg2.data_ptr() != dg.data_ptr() or du2.data_ptr() != du.data_ptr():
        raise ValueError("silu_mul_backward: out tensors need rows of stride-1 elements addressable as [M, N] views")
    if m:
        interp = runs_interpreted(_silu_mul_bwd_kernel)
        dg_arg, bits = store_view(dg2, interp)
        du_arg = store_view(du2, interp)[0]
        block = 1024
        launch_kernel(_silu_mul_bwd_kernel, (m, triton.cdiv(n, block)),
            gy2, g2, u2, dg_arg, du_arg, n, gy2.stride(0), g2.stride(0), u2.stride(0), dg2.stride(0), du2.stride(0),
            BLOCK=block, BF16_BITS=bits, num_warps=4)
    return dg, du


def _norm_warps(block: int) -> int:
    return max(1, min(16, block // 256))


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | PartialSums | None, weight: torch.Tensor, eps: float,
                 quant: tuple[float, str] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """The residual add and the pre-norm of the next block in one launch (bf16 / fp16 rows).

    Args:
        x: the residual stream [..., N]; delta: the block output to add to it (None: nothing to
            add), or that output still as a W8A8 linear's partial sums (`quant.PartialSums`, one
            row per row of x, its dtype x's), whose epilogue then runs here with the same bits.
        weight, eps: the RMSNorm's.
        quant: (scale floor, rounding) to return the normed rows as per-token int8 codes for a
            W8A8 linear (`triton_quant.quantize_rows`'s arithmetic), or None for the normed rows.
    Returns:
        (s, h): s = x + delta rounded to the dtype (x itself when delta is None); h = RMSNorm(s)
        as `rms_norm` computes it, or (codes int8 [..., N], scales fp32 [...]) of that h.
    """
    require_triton("triton_norm.add_rms_norm")
    s, normed, codes = _launch_add_rms_norm(x, delta, weight, eps, quant, keep_normed=quant is None)
    if codes is None:
        assert normed is not None
        return s, normed
    return s, codes


def rms_norm_and_codes(x: torch.Tensor, weight: torch.Tensor, eps: float, floor: float, rounding: str
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """`rms_norm(x)` and its per-row int8 codes + fp32 scales (`quantize_rows` of it, same bits)
    from one launch: the learner's pre-norm, whose output both autograd and a W8A8 linear read."""
    require_triton("triton_norm.rms_norm_and_codes")
    _, normed, codes = _launch_add_rms_norm(x, None, weight, eps, (floor, rounding), keep_normed=True)
    assert normed is not None and codes is not None
    return normed, codes


def _launch_add_rms_norm(x, delta, weight, eps, quant, keep_normed: bool):
    """`_add_rms_norm_kernel` over the rows of x: (s, normed or None, (codes, scales) or None)."""
    x2 = _rows(x)
    m, n = x2.shape
    partials = isinstance(delta, PartialSums)
    if partials:
        if delta.sums.shape[1:] != (m, n) or delta.dtype != x.dtype:
            raise ValueError(f"partial sums {tuple(delta.sums.shape)} of {delta.dtype} for {m} rows of {n} "
                             f"{x.dtype}: one [M, N] slice per split, in x's dtype")
        d2, psx, psw = delta.sums.contiguous(), delta.s_x.contiguous(), delta.s_w.contiguous()
        pb = delta.bias if delta.bias is not None else psw
    else:
        d2 = _rows(delta) if delta is not None else x2
        psx = psw = pb = weight                       # unused
    s = torch.empty((m, n), dtype=x.dtype, device=x.device) if delta is not None else x2
    interp = runs_interpreted(_add_rms_norm_kernel)
    s_arg, bits = store_view(s, interp)
    normed = codes = scales = None
    o_arg = q_arg = qs_arg = s_arg
    if keep_normed:
        normed = torch.empty((m, n), dtype=x.dtype, device=x.device)
        o_arg = store_view(normed, interp)[0]
    if quant is not None:
        codes = torch.empty((m, n), dtype=torch.int8, device=x.device)
        scales = torch.empty((m,), dtype=torch.float32, device=x.device)
        q_arg, qs_arg = codes, scales
    if m:
        block = triton.next_power_of_2(n)
        pdl = use_pdl(_add_rms_norm_kernel, x.device, m)
        launch_kernel(_add_rms_norm_kernel, (m,),
            x2, d2, weight, s_arg, o_arg, q_arg, qs_arg, psx, psw, pb, n, x2.stride(0), d2.stride(-2), s.stride(0), n,
            q_arg.stride(0), m * n, float(eps), float(quant[0]) if quant else 0.0,
            HAS_DELTA=delta is not None, QUANT=quant is not None, STORE_NORMED=keep_normed,
            HALF_AWAY=_check_mode(quant[1]) if quant else False, BLOCK=block, BF16_BITS=bits, PDL=pdl,
            PARTIALS=d2.shape[0] if partials else 0, P_BIAS=partials and delta.bias is not None,
            launch_pdl=pdl, num_warps=_norm_warps(block), enable_fp_fusion=False)
    shape = x.shape
    out_codes = (codes.reshape(shape), scales.reshape(shape[:-1])) if codes is not None and scales is not None else None
    return s.reshape(shape), normed.reshape(shape) if normed is not None else None, out_codes


#: rows up to this long are held in registers by `silu_mul_quant`; longer ones take two kernels
SILU_QUANT_MAX = 16384
#: from this many rows on, `silu_mul_quant` reads each row in chunks of `SILU_QUANT_CHUNK`, twice
#: (a whole 12288-wide row per 32-warp program ran at ~40 % of the bandwidth at 10k rows on the H200)
SILU_QUANT_CHUNKED_ROWS = 256
SILU_QUANT_CHUNK = 2048


def silu_mul_quant(gate: torch.Tensor, up: torch.Tensor, floor: float, rounding: str
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of `silu_mul(gate, up)` per row, in one launch for rows up to `SILU_QUANT_MAX`."""
    require_triton("triton_norm.silu_mul_quant")
    return _launch_silu_mul_quant(gate, up, floor, rounding, keep_product=False)[1]


def silu_mul_and_codes(gate: torch.Tensor, up: torch.Tensor, floor: float, rounding: str
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """`silu_mul(gate, up)` and its per-row codes + scales (one launch for rows up to
    `SILU_QUANT_MAX`): the learner's MLP product, which autograd and the down projection read."""
    require_triton("triton_norm.silu_mul_and_codes")
    y, codes = _launch_silu_mul_quant(gate, up, floor, rounding, keep_product=True)
    assert y is not None
    return y, codes


def silu_quant_warps(block: int) -> int:
    """Warps of `_silu_mul_quant_kernel` for a row block of `block` (a power of two)."""
    return min(32, max(4, block // 512))


def _launch_silu_mul_quant(gate, up, floor, rounding, keep_product: bool):
    """(silu·mul product or None, (codes, scales)) of the rows of gate and up."""
    n = gate.shape[-1]
    if n > SILU_QUANT_MAX:
        prod = silu_mul(gate, up)
        return (prod if keep_product else None), quantize_rows(prod, floor, rounding)
    g2, u2 = _rows(gate), _rows(up)
    m = g2.shape[0]
    codes = torch.empty((m, n), dtype=torch.int8, device=gate.device)
    scales = torch.empty((m,), dtype=torch.float32, device=gate.device)
    y = torch.empty((m, n), dtype=gate.dtype, device=gate.device) if keep_product else None
    if m:
        interp = runs_interpreted(_silu_mul_quant_kernel)
        bits = interp and gate.dtype == torch.bfloat16
        out_dt = tl.float16 if gate.dtype == torch.float16 else tl.bfloat16
        y_arg = store_view(y, interp)[0] if y is not None else codes
        chunked = m >= SILU_QUANT_CHUNKED_ROWS
        block = min(SILU_QUANT_CHUNK, triton.next_power_of_2(n)) if chunked else triton.next_power_of_2(n)
        pdl = use_pdl(_silu_mul_quant_kernel, gate.device, m)
        launch_kernel(_silu_mul_quant_kernel, (m,),
            g2, u2, codes, scales, y_arg, n, g2.stride(0), u2.stride(0), codes.stride(0),
            y_arg.stride(0), float(floor), HALF_AWAY=_check_mode(rounding), BLOCK=block,
            BF16_BITS=bits, OUT_DTYPE=out_dt, STORE_Y=y is not None, PDL=pdl, CHUNKED=chunked,
            num_warps=1 if interp else silu_quant_warps(block), enable_fp_fusion=False,
            launch_pdl=pdl)
    y_out = y.reshape(gate.shape) if y is not None else None
    return y_out, (codes.reshape(gate.shape), scales.reshape(gate.shape[:-1]))


__all__ = ["add_rms_norm", "qk_norm_rope", "qk_norm_rope_to_cache", "rms_norm", "rms_norm_and_codes",
           "rms_norm_backward", "rope", "silu_mul", "silu_mul_and_codes", "silu_mul_quant"]
