"""Fused dynamic int8 quantization kernels (Triton), bit-identical to `quant.quantize_rows`.

* `quantize_per_token(x[M, K], spec) -> (int8 [M, K], fp32 [M])`: activations, per token.
* `quantize_rows(x, floor, rounding, col_scale=s)`: the rows of x · s (s per column) in one pass,
  for the learner's int8 dX (dY · s_w).
* `quantize_kv(x[..., D], spec) -> (int8 [..., D], fp32 [...])`: K or V, per token per KV head.
* `quantize_kv_to_cache(...)`: the same, scattered straight into a slot-based KV cache.

Numerics (exactly those of the torch reference, for every input):
``scale = max(absmax / 127, floor)`` with an IEEE division, ``code = clamp(round(x / scale), -128, 127)``
with an IEEE division (`tl.math.div_rn`, never a plain reciprocal multiply), and `round` either
half-to-even or half-away-from-zero, both computed from the exact fractional part with `floor`
(no libdevice call, so the interpreter and CUDA run the same arithmetic). By default the same
quotient comes from a row's reciprocal with fma corrections and half-even rounding from an add pair
(`_codes_values`; tests/kernels/test_fast_codes.py); `AGENTQ_FAST_CODES=0` divides per element.
"""
from __future__ import annotations

import os

import torch

from . import quant
from ._interp import (HAVE_TRITON, capability, interpreter_fma_rounds_once, interpreting, require_triton,
                      runs_interpreted)
from ._launch import launch_kernel
from .quant_spec import QuantSpec

INTERPRETED = interpreting()
#: rows up to this length are quantized in one pass held in registers; longer rows loop twice
MAX_SINGLE_PASS = 16384

#: every code writer divides by a row's reciprocal with fma corrections and rounds half-even by one
#: add pair, instead of a per-element IEEE division and a floor-based rounding: the same bits
#: (`_codes_values`), 1.2-1.5x faster memory-bound code launches on the H200 (round 32).
#: AGENTQ_FAST_CODES=0 brings back the division.
FAST_CODES_ENV = "AGENTQ_FAST_CODES"

if HAVE_TRITON:
    import triton
    import triton.language as tl

    # under an interpreter whose fma rounds twice (Triton < 3.9) the corrections would not be exact
    FAST_CODES: tl.constexpr = tl.constexpr(os.environ.get(FAST_CODES_ENV, "1") != "0"
                                            and (not INTERPRETED or interpreter_fma_rounds_once()))

    @triton.jit
    def _quotient_rn(x, scale):
        """x / scale rounded to nearest, without a division per element: r = RN(1 / scale) once on
        scale's shape (a row's scalar, or [R, 1]), q = RN(x · r), then two corrections
        q ← RN(q + (x − q·scale) · r), the residual by an fma. With r correctly rounded and q within
        an ulp of x / scale (the first correction's job), the second gives RN(x / scale) whenever
        the residual does not underflow (Markstein); where it could (|x / scale| tiny against
        scale ≥ the spec's floor), the quotient is far below 0.5 and its code is 0 either way.
        An infinite scale (an inf in the row) has r = 0: the corrections would give NaN (0 · inf),
        so there q = x · 0, which is x / inf (±0, and NaN for x = ±inf or NaN) as the division gives."""
        r = tl.math.div_rn(1.0, scale)
        q0 = x * r
        q = tl.fma(tl.fma(-q0, scale, x), r, q0)
        q = tl.fma(tl.fma(-q, scale, x), r, q)
        return tl.where(r == 0.0, q0, q)

    @triton.jit
    def _rint_even(v):
        """Round fp32 `v` (|v| < 2**22) to the nearest integer, ties to even: adding 1.5 · 2**23
        lands in [2**23, 2**24), where the fp32 spacing is 1, so the IEEE add itself rounds (half
        to even, 1.5 · 2**23 being even); subtracting it back is exact."""
        big = 12582912.0
        return (v + big) - big

    @triton.jit
    def _round_half(v, HALF_AWAY: tl.constexpr):
        """Round fp32 `v` (|v| < 2**22) to an integer-valued fp32, ties by the chosen rule."""
        if HALF_AWAY:
            a = tl.abs(v)
            fl = tl.floor(a)
            r = fl + tl.where(a - fl >= 0.5, 1.0, 0.0)   # a - fl is exact
            out = tl.where(v < 0, -r, r)
        else:
            fl = tl.floor(v)
            frac = v - fl                                   # exact, in [0, 1)
            odd = (fl - 2.0 * tl.floor(fl * 0.5)) != 0.0    # fl is odd
            up = (frac > 0.5) | ((frac == 0.5) & odd)
            out = fl + tl.where(up, 1.0, 0.0)
        return out

    @triton.jit
    def cast_for_store(y, OUT_DTYPE: tl.constexpr, BF16_BITS: tl.constexpr):
        """`y.to(OUT_DTYPE)`; with BF16_BITS, the int16 bit pattern of bf16(y) rounded to nearest
        even, computed by hand (the interpreter's fp32->bf16 cast truncates; store through an int16
        view of the bf16 output). Non-finite values are not handled on that path."""
        if BF16_BITS:
            bits = y.to(tl.int32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)
            out = (bits >> 16).to(tl.int16)
        else:
            out = y.to(OUT_DTYPE)
        return out

    @triton.jit
    def bf16_round(y):
        """fp32 → nearest-even bf16 value, as fp32 (the interpreter's casts truncate)."""
        bits = y.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def round_to(y, OUT_DTYPE: tl.constexpr, BF16_BITS: tl.constexpr):
        """Round fp32 to the output dtype and back (the rounding torch does after each op)."""
        if BF16_BITS:
            r = bf16_round(y)
        else:
            r = y.to(OUT_DTYPE).to(tl.float32)
        return r

    @triton.jit
    def w8a8_values(acc, sx, sw, bias_ptr, offs_n, mask_n, HAS_BIAS: tl.constexpr):
        """fp32 (acc · s_x) · s_w (+ bias) of int32 sums, unrounded: `quant.w8a8_epilogue` before
        its final cast. sx / sw come broadcastable to acc ([BM, 1] / [1, BN] in a GEMM tile; a row's
        scalar / [BLOCK] in a norm that reads partial sums); the bias is loaded at offs_n. The one
        home of this arithmetic: the GEMM epilogues and `triton_norm`'s partial-sums reader."""
        y = acc.to(tl.float32) * sx
        y = y * sw
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        return y

    @triton.jit
    def silu_mul_values(g, u, OUT_DTYPE: tl.constexpr, BF16_BITS: tl.constexpr):
        """silu(g) · u of fp32 values of the dtype, each op rounded to it as torch's
        `F.silu(g) * u` rounds (silu in fp32, then one rounding; the product, then another). The
        one home of this arithmetic: the SiLU·mul kernels and the gate_up GEMM's GLU epilogue."""
        s = round_to(g / (1.0 + tl.exp(-g)), OUT_DTYPE, BF16_BITS)
        return round_to(s * u, OUT_DTYPE, BF16_BITS)

    @triton.jit
    def _codes_values(x, scale, HALF_AWAY: tl.constexpr, FAST: tl.constexpr):
        """clamp(round(x / scale), -128, 127) as integer-valued fp32, round(x / scale) being the
        IEEE quotient rounded by the chosen rule. FAST: `_quotient_rn` and, for half-even,
        `_rint_even` (the same values; 21 instead of 38 sm_90 instructions an element in the GLU
        codes kernel: `sass_loop --codes`)."""
        if FAST:
            v = _quotient_rn(x, scale)
            if HALF_AWAY:
                q = _round_half(v, True)
            else:
                q = _rint_even(v)
        else:
            q = _round_half(tl.math.div_rn(x, scale), HALF_AWAY)
        return tl.minimum(tl.maximum(q, -128.0), 127.0)

    @triton.jit
    def _codes_f32(x, scale, HALF_AWAY: tl.constexpr):
        """`_codes_values` with `FAST_CODES` (the process's switch)."""
        return _codes_values(x, scale, HALF_AWAY, FAST_CODES)

    @triton.jit
    def _quant_block(x, scale, HALF_AWAY: tl.constexpr):
        return _codes_f32(x, scale, HALF_AWAY).to(tl.int8)

    @triton.jit
    def _absmax_to_scale(amax, floor):
        """A row's (or row tile's) scale from its absmax: max(absmax / 127, floor), IEEE division."""
        return tl.maximum(tl.math.div_rn(amax, 127.0), floor)

    @triton.jit
    def _store_row_codes(y, q_row, s_out, offs, mask, floor, HALF_AWAY: tl.constexpr):
        """A row held in registers (fp32 values; masked lanes ignored) -> its int8 codes at q_row
        and its fp32 scale at s_out: scale = max(absmax / 127, floor), codes = round(y / scale)."""
        amax = tl.reduce(tl.where(mask, tl.abs(y), 0.0), 0, tl.standard._elementwise_max)
        scale = _absmax_to_scale(amax, floor)
        tl.store(q_row + offs, _quant_block(y, scale, HALF_AWAY), mask=mask)
        tl.store(s_out, scale)

    @triton.jit
    def _store_rows_codes(y, q_rows, s_out, offs, mask, row_mask, floor, HALF_AWAY: tl.constexpr):
        """`_store_row_codes` for a [R, BLOCK] block of rows held in registers (fp32 values;
        masked lanes ignored), each row on its own: its int8 codes at q_rows[r] + offs and its fp32
        scale at s_out[r] (rows off `row_mask` not written), with the same arithmetic helpers
        (`_absmax_to_scale`, `_quant_block`; the absmax is a max, exact in any order)."""
        amax = tl.reduce(tl.where(mask, tl.abs(y), 0.0), 1, tl.standard._elementwise_max)
        scale = _absmax_to_scale(amax, floor)
        tl.store(q_rows + offs[None, :], _quant_block(y, scale[:, None], HALF_AWAY), mask=mask)
        tl.store(s_out, scale, mask=row_mask)

    @triton.jit
    def _load_row_f32(x_row, cs_ptr, offs, mask, COL_SCALE: tl.constexpr):
        """A row's values in fp32; with COL_SCALE each times its column's fp32 scale (one rounding)."""
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        if COL_SCALE:
            x = x * tl.load(cs_ptr + offs, mask=mask, other=0.0)
        return x

    @triton.jit
    def pdl_start(PDL: tl.constexpr):
        """First statement of a kernel that may be launched with programmatic dependent launch
        (Hopper): wait until the kernel before it in the stream has finished and its writes are
        visible (nothing is read or written before this), then let the next kernel launch, so
        its launch and prologue overlap this kernel instead of following it."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, cs_ptr, K, stride_x, stride_q, floor,
                           HALF_AWAY: tl.constexpr, BLOCK_K: tl.constexpr, SINGLE_PASS: tl.constexpr,
                           PDL: tl.constexpr, COL_SCALE: tl.constexpr):
        """One program per row: scale = max(absmax/127, floor); codes = round(x/scale). COL_SCALE:
        of x[:, k] · cs[k] instead (the learner's int8 dX: dY · s_w, never written out)."""
        pdl_start(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_K)
        x_row = x_ptr + row * stride_x
        q_row = q_ptr + row * stride_q
        if SINGLE_PASS:
            mask = offs < K
            x = _load_row_f32(x_row, cs_ptr, offs, mask, COL_SCALE)
            _store_row_codes(x, q_row, s_ptr + row, offs, mask, floor, HALF_AWAY)
        else:
            amax_v = tl.full([BLOCK_K], 0, dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                mask = k0 + offs < K
                x = _load_row_f32(x_row, cs_ptr, k0 + offs, mask, COL_SCALE)
                amax_v = tl.maximum(amax_v, tl.abs(x))
            amax = tl.reduce(amax_v, 0, tl.standard._elementwise_max)
            scale = _absmax_to_scale(amax, floor)
            for k0 in range(0, K, BLOCK_K):
                mask = k0 + offs < K
                x = _load_row_f32(x_row, cs_ptr, k0 + offs, mask, COL_SCALE)
                tl.store(q_row + k0 + offs, _quant_block(x, scale, HALF_AWAY), mask=mask)
            tl.store(s_ptr + row, scale)

    @triton.jit
    def _load_rows_f32(x_rows, cs_ptr, cols, col_mask, mask, COL_SCALE: tl.constexpr):
        """`_load_row_f32` for a tile of rows (x_rows [R, 1] pointers, cols [B]): each column's
        scale loaded once for the R rows."""
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if COL_SCALE:
            x = x * tl.load(cs_ptr + cols, mask=col_mask, other=0.0)[None, :]
        return x

    @triton.jit
    def _quant_row_chunks_kernel(x_ptr, q_ptr, s_ptr, cs_ptr, M, K, stride_x, stride_q, floor,
                                 HALF_AWAY: tl.constexpr, COL_SCALE: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        """BLOCK_M long rows per program, BLOCK_K columns at a time, twice (absmax, then the codes
        of the same values): `_quant_rows_kernel`'s arithmetic with a small register tile, so many
        programs per SM keep the loads in flight where a whole row per program (many rows, long
        rows: the learner's dY · s_w) left the SMs waiting. COL_SCALE as there; each column block
        of cs is read once per BLOCK_M rows."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs = tl.arange(0, BLOCK_K)
        mask_m = rows < M
        x_rows = x_ptr + rows[:, None] * stride_x
        amax_v = tl.full([BLOCK_M, BLOCK_K], 0, dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + offs
            mask = mask_m[:, None] & (cols < K)[None, :]
            x = _load_rows_f32(x_rows, cs_ptr, cols, cols < K, mask, COL_SCALE)
            amax_v = tl.maximum(amax_v, tl.abs(x))
        scale = _absmax_to_scale(tl.reduce(amax_v, 1, tl.standard._elementwise_max), floor)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + offs
            mask = mask_m[:, None] & (cols < K)[None, :]
            x = _load_rows_f32(x_rows, cs_ptr, cols, cols < K, mask, COL_SCALE)
            tl.store(q_ptr + rows[:, None] * stride_q + cols[None, :], _quant_block(x, scale[:, None], HALF_AWAY),
                     mask=mask)
        tl.store(s_ptr + rows, scale, mask=mask_m)

    @triton.jit
    def _quant_rows_amax_kernel(x_ptr, amax_ptr, q_ptr, s_ptr, M, K, P, stride_x, stride_q, floor,
                                HALF_AWAY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                BLOCK_P: tl.constexpr, PDL: tl.constexpr):
        """Program (row block, column block): each of BLOCK_M rows' scale from its P partial
        absmaxes (the GLU GEMM's epilogue wrote them), then the codes of one [BLOCK_M, BLOCK_K]
        tile: each element read once, a row spread over ⌈K / BLOCK_K⌉ programs (two rows a program
        measured 9 % faster than one at prefill rows: `AMAX_ROWS`)."""
        pdl_start(PDL)
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        blk = tl.program_id(1)
        mask_m = rows < M
        offs_p = tl.arange(0, BLOCK_P)
        parts = tl.load(amax_ptr + rows[:, None] * P + offs_p[None, :],
                        mask=mask_m[:, None] & (offs_p < P)[None, :], other=0.0)
        scale = _absmax_to_scale(tl.reduce(parts, 1, tl.standard._elementwise_max), floor)
        offs = blk * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = mask_m[:, None] & (offs < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(q_ptr + rows[:, None] * stride_q + offs[None, :], _quant_block(x, scale[:, None], HALF_AWAY),
                 mask=mask)
        if blk == 0:
            tl.store(s_ptr + rows, scale, mask=mask_m)

    @triton.jit
    def _quant_row_tiles_kernel(x_ptr, q_ptr, s_ptr, o_ptr, M, K, N1, N2, stride_x0, stride_x1, stride_x2,
                                stride_o0, stride_o1, stride_o2, floor,
                                HALF_AWAY: tl.constexpr, DEQUANT: tl.constexpr, BF16_BITS: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        """BLOCK_M short rows per program (one row each would leave most lanes of a program idle).

        Row r of the logical [M, K] view is x[r // (N1·N2), (r // N2) % N1, r % N2, :], so a strided
        (e.g. transposed) input is read in place. DEQUANT: write code · scale in o's dtype (what the
        KV cache reads back) to o, row r at the same index with o's strides (o may keep x's layout);
        else the int8 codes to q [M, K] and the fp32 scales to s [M]."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs = tl.arange(0, BLOCK_K)
        mask_m = rows < M
        mask = mask_m[:, None] & (offs[None, :] < K)
        i0, i1, i2 = rows // (N1 * N2), (rows // N2) % N1, rows % N2
        base = i0 * stride_x0 + i1 * stride_x1 + i2 * stride_x2
        x = tl.load(x_ptr + base[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.reduce(tl.where(mask, tl.abs(x), 0.0), 1, tl.standard._elementwise_max)
        scale = _absmax_to_scale(amax, floor)
        codes = _codes_f32(x, scale[:, None], HALF_AWAY)
        if DEQUANT:
            dst = (i0 * stride_o0 + i1 * stride_o1 + i2 * stride_o2)[:, None] + offs[None, :]
            tl.store(o_ptr + dst, cast_for_store(codes * scale[:, None], o_ptr.dtype.element_ty, BF16_BITS), mask=mask)
        else:
            dst = rows[:, None] * K + offs[None, :]
            tl.store(q_ptr + dst, codes.to(tl.int8), mask=mask)
            tl.store(s_ptr + rows, scale, mask=mask_m)

    @triton.jit
    def _dequant_rows_kernel(q_ptr, s_ptr, o_ptr, M, K, BF16_BITS: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_K: tl.constexpr):
        """o[r, k] = dtype(float(q[r, k]) · s[r]) over one [BLOCK_M, BLOCK_K] tile (contiguous rows)."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_m = rows < M
        mask = mask_m[:, None] & (offs[None, :] < K)
        idx = rows[:, None] * K + offs[None, :]
        dequant_tile(q_ptr + idx, s_ptr + rows, o_ptr + idx, mask, mask_m, BF16_BITS)

    @triton.jit
    def dequant_tile(codes, scales, out, mask, row_mask, BF16_BITS: tl.constexpr):
        """out = dtype(float(codes) · scale of the row) over a [rows, cols] tile of pointers (the
        arithmetic of `quant.dequantize_rows`); `scales` and `row_mask` are per row."""
        x = tl.load(codes, mask=mask, other=0).to(tl.float32)
        x = x * tl.load(scales, mask=row_mask, other=0.0)[:, None]
        tl.store(out, cast_for_store(x, out.dtype.element_ty, BF16_BITS), mask=mask)

    @triton.jit
    def _quant_kv_cache_kernel(x_ptr, slot_ptr, pos_ptr, c_ptr, cs_ptr, D, H,
                               stride_xt, stride_xh, stride_cs, stride_ch, stride_cl,
                               stride_ss, stride_sh, floor,
                               HALF_AWAY: tl.constexpr, BLOCK_D: tl.constexpr):
        """One program per (token, kv head): quantize x[t, h, :] into cache[slot[t], h, pos[t], :]."""
        pid = tl.program_id(0)
        t = pid // H
        h = pid % H
        slot = tl.load(slot_ptr + t).to(tl.int64)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        offs = tl.arange(0, BLOCK_D)
        mask = offs < D
        x = tl.load(x_ptr + t.to(tl.int64) * stride_xt + h * stride_xh + offs, mask=mask, other=0.0).to(tl.float32)
        _store_row_codes(x, c_ptr + slot * stride_cs + h * stride_ch + pos * stride_cl,
                         cs_ptr + slot * stride_ss + h * stride_sh + pos, offs, mask, floor, HALF_AWAY)


def use_pdl(kernel, device: torch.device, rows: int) -> bool:
    """Programmatic dependent launch (Hopper+): the decode step's Triton kernels launch while the
    kernel before them still runs and wait (`pdl_start`) before touching memory. For launches over
    at most `PDL_MAX_ROWS` rows; off under the interpreter, before sm_90, and with AGENTQ_PDL=0."""
    if (rows > PDL_MAX_ROWS or runs_interpreted(kernel) or device.type != "cuda"
            or os.environ.get("AGENTQ_PDL", "1") == "0"):
        return False
    return capability(device)[0] >= 9


def store_view(out: torch.Tensor, interpreted: bool) -> tuple[torch.Tensor, bool]:
    """(tensor to pass as the kernel's output, BF16_BITS) for `cast_for_store`."""
    if interpreted and out.dtype == torch.bfloat16:
        return out.view(torch.int16), True
    return out, False


def _check_mode(rounding: str) -> bool:
    if rounding not in ("half_even", "half_away"):
        raise ValueError(f"unknown rounding mode {rounding!r}; valid: ['half_even', 'half_away']")
    return rounding == "half_away"


#: (max rows, max K) -> (BLOCK_K, single pass, num_warps); first match wins, measured on an H200
#: (`python -m agentq.eval.bench_kernels --tune quant`); other shapes use the default rule in `_row_launch_params`.
H200_QUANT: list[tuple[int, int, tuple[int, bool, int]]] = [
    (64, 4096, (4096, True, 16)), (64, 16384, (16384, True, 32)),
    (256, 4096, (4096, True, 16)), (256, 16384, (2048, False, 8)),
]

#: rows up to this many let a following kernel start early (programmatic dependent launch); with
#: many rows the waiting GEMM programs would hold SMs that the quant programs need (256 rows, round
#: 2); 128 since round 14: the decode step at B 128 measured faster with it in 9 of 10 passes
#: (docs/kernels-history.md, round 14)
PDL_MAX_ROWS = 128


def _row_launch_params(m: int, k: int, interpreted: bool) -> tuple[int, bool, int]:
    """(BLOCK_K, single pass?, num_warps) for m rows of length k."""
    if not interpreted:
        for max_m, max_k, params in H200_QUANT:
            if m <= max_m and k <= max_k and (params[1] is False or params[0] >= k):
                return params
    if k <= MAX_SINGLE_PASS:
        block = triton.next_power_of_2(max(k, 16))
        return block, True, (1 if interpreted else max(1, min(16, block // 512)))
    return 4096, False, 8


#: rows of at most this many elements, in calls of more than TILE_MIN_ROWS rows (beyond the decode
#: shapes `H200_QUANT` was tuned on), are quantized BLOCK_M at a time (`_quant_row_tiles_kernel`)
TILE_MAX_K = 1024
TILE_MIN_ROWS = 257
#: (BLOCK_M, BLOCK_K, num_warps) of `_quant_row_chunks_kernel` for the learner's dY · s_w rows longer
#: than CHUNK_MIN_K (col_scale calls of ≥ TILE_MIN_ROWS rows): on the H200 at 8,192 rows it took 93 /
#: 190 / 374 µs where the per-row kernel took 146 / 286-304 / 361-385 µs (rows of 6,144 / 12,288 /
#: 24,576: Qwen3-8B qkv, 1.7B gate_up, 8B gate_up), and lost to it at 2,048-4,096 (round 22,
#: `bench_kernels --grad-input`, which sweeps it). AGENTQ_QUANT_CHUNKS="M,K,W" overrides it
CHUNK_LAUNCH = tuple(int(v) for v in os.environ.get("AGENTQ_QUANT_CHUNKS", "2,1024,4").split(","))
CHUNK_MIN_K = 4096
#: elements per program of the tiled kernels (BLOCK_M = this // BLOCK_K, at most 64 rows)
TILE_ELEMS = 4096
#: the widest column tile of `dequantize_rows` (longer rows take several programs)
DEQUANT_MAX_BLOCK_K = 1024


def tiles_enabled() -> bool:
    """The tiled launches (`_quant_row_tiles_kernel`, `kv_roundtrip`, `dequantize_rows`; round 4)
    are on unless AGENTQ_QUANT_TILES=0, which brings back the row kernel and torch's dequantization."""
    return os.environ.get("AGENTQ_QUANT_TILES", "1") != "0"


def _rows_per_program(k: int) -> int:
    """BLOCK_M of the tiled kernel: a power of two, about TILE_ELEMS elements, 1 to 64 rows."""
    rows = max(1, min(64, TILE_ELEMS // triton.next_power_of_2(max(k, 16))))
    return 1 << (rows.bit_length() - 1)


def _launch_row_tiles(x: torch.Tensor, floor: float, half_away: bool, q: torch.Tensor | None,
                      s: torch.Tensor | None, o: torch.Tensor | None) -> None:
    """`_quant_row_tiles_kernel` over x [..., K] (≤ 3 leading dims, any strides, K contiguous):
    codes into q [M, K] and scales into s [M], or (o given) the dequantized rows into o."""
    k = x.shape[-1]
    lead = list(x.shape[:-1])
    strides = list(x.stride()[:-1])
    o_strides = list(o.stride()[:-1]) if o is not None else [0] * len(strides)
    assert o is None or (o.shape == x.shape and o.stride(-1) == 1), (tuple(o.shape), o.stride())
    while len(lead) < 3:
        lead.insert(0, 1)
        strides.insert(0, 0)
        o_strides.insert(0, 0)
    m = lead[0] * lead[1] * lead[2]
    bm = _rows_per_program(k)
    dequant = o is not None
    o_arg, bf16_bits = store_view(o, runs_interpreted(_quant_row_tiles_kernel)) if o is not None else (x, False)
    launch_kernel(_quant_row_tiles_kernel, (triton.cdiv(m, bm),),
        x, q if q is not None else o_arg, s if s is not None else o_arg, o_arg, m, k, lead[1], lead[2], *strides,
        *o_strides, float(floor), HALF_AWAY=half_away, DEQUANT=dequant, BF16_BITS=bf16_bits, BLOCK_M=bm,
        BLOCK_K=triton.next_power_of_2(max(k, 16)), num_warps=4, enable_fp_fusion=False)


def quantize_rows(x: torch.Tensor, floor: float, rounding: str, launch: tuple[int, bool, int] | None = None,
                  col_scale: torch.Tensor | None = None, chunks: tuple[int, int, int] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `quant.quantize_rows`: symmetric int8 over the last dim, one fp32 scale per row.
    `launch` = (BLOCK_K, single pass, num_warps) overrides the table (tuning) with the row kernel;
    `chunks` = (BLOCK_M, BLOCK_K, num_warps) runs `_quant_row_chunks_kernel` instead (tuning; with
    `CHUNK_LAUNCH` it is what col_scale calls of ≥ TILE_MIN_ROWS rows longer than CHUNK_MIN_K take).
    `col_scale` (fp32 [K]): the codes of fp32(x) · col_scale instead, in the same launch
    (`quant.quantize_scaled_rows`, same bits)."""
    require_triton("triton_quant.quantize_rows")
    half_away = _check_mode(rounding)
    shape = x.shape
    k = shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if col_scale is not None:
        assert col_scale.shape == (k,) and col_scale.dtype == torch.float32, (col_scale.shape, col_scale.dtype)
        col_scale = col_scale.contiguous()
    m = x2.shape[0]
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    s = torch.empty((m,), dtype=torch.float32, device=x.device)
    if launch is None and col_scale is None and k <= TILE_MAX_K and m >= TILE_MIN_ROWS and tiles_enabled():
        _launch_row_tiles(x2, floor, half_away, q, s, None)
    elif chunks or (launch is None and col_scale is not None and m >= TILE_MIN_ROWS and k > CHUNK_MIN_K
                    and tiles_enabled()):
        bm, bk, warps = chunks or CHUNK_LAUNCH
        interp = runs_interpreted(_quant_row_chunks_kernel)
        launch_kernel(_quant_row_chunks_kernel, (triton.cdiv(m, bm),),
            x2, q, s, col_scale if col_scale is not None else s, m, k, x2.stride(0), q.stride(0), float(floor),
            HALF_AWAY=half_away, COL_SCALE=col_scale is not None, BLOCK_M=bm, BLOCK_K=bk,
            num_warps=1 if interp else warps, enable_fp_fusion=False)
    elif m > 0:
        block, single, warps = launch or _row_launch_params(m, k, runs_interpreted(_quant_rows_kernel))
        pdl = use_pdl(_quant_rows_kernel, x.device, m)
        launch_kernel(_quant_rows_kernel, (m,),
            x2, q, s, col_scale if col_scale is not None else s, k, x2.stride(0), q.stride(0),
            float(floor), HALF_AWAY=half_away, BLOCK_K=block, SINGLE_PASS=single,
            PDL=pdl, COL_SCALE=col_scale is not None, num_warps=warps, enable_fp_fusion=False,
            launch_pdl=pdl)
    return q.reshape(shape), s.reshape(shape[:-1])


#: columns per program of `quantize_rows_from_amax`
AMAX_BLOCK_K = 2048
#: (from this many rows, rows per program) of `quantize_rows_from_amax`; below, one row a program.
#: H200, round 31 (32,768 × 6,144 bf16): 309 µs at one row a program, 281 at 2, 283 at 4, 335 at 8
AMAX_ROWS = (1024, 2)


def quantize_rows_from_amax(x: torch.Tensor, amax: torch.Tensor, floor: float, rounding: str,
                            launch: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows(x, floor, rounding)` for rows x [M, K] whose absmax is already known as the
    max of P partials amax [M, P] (the GLU GEMM's epilogue): the same codes and scales (max is
    exact, and the scale and code formulas are the same), with x read once and each row split
    over ⌈K / BLOCK_K⌉ programs of BLOCK_M rows. `launch` = (BLOCK_M, BLOCK_K, num_warps)
    overrides the default (tuning; the bits never depend on it)."""
    require_triton("triton_quant.quantize_rows_from_amax")
    half_away = _check_mode(rounding)
    m, k = x.shape
    assert amax.shape[0] == m and amax.dtype == torch.float32 and x.stride(-1) == 1
    amax = amax.contiguous()
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    s = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m and not k:
        s.fill_(float(floor))          # an empty row's absmax is 0 (`quant.quantize_rows`)
    if m and k:
        interp = runs_interpreted(_quant_rows_amax_kernel)
        if launch is None:
            block = min(AMAX_BLOCK_K, triton.next_power_of_2(max(k, 16)))
            rows = AMAX_ROWS[1] if m >= AMAX_ROWS[0] else 1
            launch = (rows, block, max(1, min(8, rows * block // 256)))
        bm, block, warps = launch
        pdl = use_pdl(_quant_rows_amax_kernel, x.device, m)
        launch_kernel(_quant_rows_amax_kernel, (triton.cdiv(m, bm), triton.cdiv(k, block)),
            x, amax, q, s, m, k, amax.shape[1], x.stride(0), q.stride(0), float(floor), HALF_AWAY=half_away,
            BLOCK_M=bm, BLOCK_K=block, BLOCK_P=max(2, triton.next_power_of_2(amax.shape[1])), PDL=pdl,
            launch_pdl=pdl, num_warps=1 if interp else warps, enable_fp_fusion=False)
    return q, s


def quantize_per_token(x: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations X[..., K] -> (int8 [..., K], fp32 [...]); == `quant.quantize_act` bit for bit."""
    return quantize_rows(x, spec.act_scale_floor, spec.act_rounding)


def quantize_kv(x: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """K or V [..., head_dim] -> (int8, fp32 [...]); == `quant.quantize_kv` bit for bit."""
    return quantize_rows(x, spec.kv_scale_floor, spec.kv_rounding)


def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Triton `quant.dequantize_rows` (same bits: the product in fp32, one rounding to `dtype`):
    codes int8 [..., K], scale fp32 [...] -> [..., K] in `dtype`, one read of the codes."""
    require_triton("triton_quant.dequantize_rows")
    k = codes.shape[-1]
    q2, s2 = codes.reshape(-1, k).contiguous(), scale.reshape(-1).contiguous().float()
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    m = q2.shape[0]
    if out.numel():
        bk = min(triton.next_power_of_2(max(k, 16)), DEQUANT_MAX_BLOCK_K)
        bm = max(1, TILE_ELEMS // bk)
        o_arg, bf16_bits = store_view(out.view(m, k), runs_interpreted(_dequant_rows_kernel))
        launch_kernel(_dequant_rows_kernel, (triton.cdiv(m, bm), triton.cdiv(k, bk)),
            q2, s2, o_arg, m, k, BF16_BITS=bf16_bits, BLOCK_M=bm, BLOCK_K=bk, num_warps=4, enable_fp_fusion=False)
    return out


def kv_roundtrip(x: torch.Tensor, floor: float, rounding: str) -> torch.Tensor:
    """dequantize(quantize_rows(x)) in x's dtype, in one launch reading x in place (any strides with
    the last dim contiguous, ≤ 4 dims): what the KV cache gives back, the learner's K/V round trip.
    Same bits as `quant.dequantize_rows(*quant.quantize_rows(x, floor, rounding), x.dtype)`.

    Returns:
        A dense tensor of x's shape with x's dimension order (`torch.empty_like`): HF hands
        attention K/V as [B, H, L, D] views of [B, L, H, D] projections, and flash attention reads
        them as [L, H, D], so a contiguous result would cost that read a transposing copy."""
    require_triton("triton_quant.kv_roundtrip")
    half_away = _check_mode(rounding)
    if x.dim() > 4 or x.shape[-1] > TILE_ELEMS:
        codes, scale = quantize_rows(x, floor, rounding)
        return quant.dequantize_rows(codes, scale, x.dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty_like(x)        # x's dimension order, dense
    if out.stride(-1) != 1:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        _launch_row_tiles(x, floor, half_away, None, None, out)
    return out


def quantize_kv_to_cache(x: torch.Tensor, cache: torch.Tensor, scale_cache: torch.Tensor,
                         slot_ids: torch.Tensor, positions: torch.Tensor, spec: QuantSpec) -> None:
    """Quantize-on-write: x[T, Hkv, D] -> cache[slot_ids[t], :, positions[t], :] (int8) and
    scale_cache[slot_ids[t], :, positions[t]] (fp32), per token per KV head, in one launch.

    cache: int8 [S, Hkv, Lmax, D] (D contiguous); scale_cache: fp32 [S, Hkv, Lmax] (Lmax contiguous).
    """
    require_triton("triton_quant.quantize_kv_to_cache")
    half_away = _check_mode(spec.kv_rounding)
    t, h, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert cache.dtype == torch.int8 and cache.stride(-1) == 1 and scale_cache.stride(-1) == 1
    assert cache.shape[1] == h and cache.shape[3] == d
    if t == 0:
        return
    launch_kernel(_quant_kv_cache_kernel, (t * h,),
        x, slot_ids, positions, cache, scale_cache, d, h,
        x.stride(0), x.stride(1), cache.stride(0), cache.stride(1), cache.stride(2),
        scale_cache.stride(0), scale_cache.stride(1), float(spec.kv_scale_floor),
        HALF_AWAY=half_away, BLOCK_D=triton.next_power_of_2(max(d, 16)),
        num_warps=1, enable_fp_fusion=False)


def quantize_kv_to_cache_ref(x, cache, scale_cache, slot_ids, positions, spec: QuantSpec) -> None:
    """Torch reference of `quantize_kv_to_cache` (the engine's CPU path)."""
    codes, scales = quant.quantize_kv(x, spec)
    s, p = slot_ids.long(), positions.long()
    cache[s, :, p, :] = codes
    scale_cache[s, :, p] = scales
