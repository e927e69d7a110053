"""Reference numerics (torch) for every quantizer in `QuantSpec` (the learner's straight-through
versions live in `ste.py`).

Everything else (Triton kernels, the engine's int8 linears and KV cache, checkpoint export) must
produce exactly these codes and scales; `tests/kernels` checks it bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cpu_gemm
from .quant_spec import QuantSpec

QMAX = 127.0
QMIN = -128.0
FP8_MAX = 448.0
#: scale floor of the learner's per-token int8 gradient rows (grad_input="int8"). Gradients lie many
#: decades below activations, where the activations' 1e-8 floor would coarsen or zero whole rows; this
#: only keeps an all-zero row from dividing by zero. A subnormal value (which a GPU may flush) over a
#: scale of at least 1e-30 always rounds to code 0, so CPU and GPU give the same codes.
GRAD_SCALE_FLOOR = 1e-30


def round_half(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Round to integers: 'half_even' (torch.round, CUDA rn) or 'half_away' (C's roundf).

    half_away is computed from the exact fractional part, not floor(|x| + 0.5), which rounds
    0.49999997 up because |x| + 0.5 is not representable in fp32.
    """
    if mode == "half_even":
        return torch.round(x)
    if mode == "half_away":
        a = x.abs()
        fl = torch.floor(a)
        return torch.copysign(fl + (a - fl >= 0.5).to(x.dtype), x)
    raise ValueError(f"unknown rounding mode {mode!r}; valid: ['half_even', 'half_away']")


def _absmax_scale(x: torch.Tensor, floor: float) -> torch.Tensor:
    """Symmetric int8 scale over the last dim: max(absmax / 127, floor), fp32, shape x.shape[:-1]."""
    amax = x.detach().float().abs().amax(dim=-1)
    # a tensor divisor: with a Python scalar, CUDA torch multiplies by the reciprocal instead (1 ulp off)
    return torch.clamp(amax / torch.full_like(amax, QMAX), min=floor)


def quantize_rows(x: torch.Tensor, floor: float, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 over the last dim (one scale per row). Returns (codes int8, scales fp32 [...])."""
    codes, scale = quantize_rows_f32(x, floor, rounding)
    return codes.to(torch.int8), scale


def quantize_rows_f32(x: torch.Tensor, floor: float, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows` with the int8 codes held in fp32 (exact): for float GEMMs, which would cast them back."""
    scale = _absmax_scale(x, floor)
    codes = round_half(x.detach().float() / scale.unsqueeze(-1), rounding).clamp_(QMIN, QMAX)
    return codes, scale


def quantize_scaled_rows(x: torch.Tensor, col_scale: torch.Tensor, floor: float, rounding: str
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows(fp32(x) · col_scale[None, :])`: each column times its fp32 scale (one rounding
    per product), then symmetric int8 per row. The learner's int8 dX quantizes dY · s_w this way:
    s_w lies on that GEMM's reduction axis, so it must go into the codes (`ste`, grad_input="int8")."""
    return quantize_rows(x.detach().float() * col_scale, floor, rounding)


def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype = torch.float32, *,
                    out: torch.Tensor | None = None, work: torch.Tensor | None = None) -> torch.Tensor:
    """dtype(float(codes) · scale[..., None]): the product in fp32, one rounding to `dtype`.

    On CUDA one kernel (mul with an `out` of `dtype` computes in fp32 and casts on store), without
    the two full-size fp32 temporaries of `(codes.float() * scale[..., None]).to(dtype)`; on a CPU
    that expression itself, the same bits, which runs 1.5× faster there than the mixed-type `out`.
    With `out` (and `work`) a CPU writes the same bits into the given tensors and allocates none of
    the codes' size: codes into the fp32 scratch, times the scales in place, one rounding into
    `out` (the KV cache's reusable read buffers, `KVCache.reuse_reads`).

    Args:
        codes: the codes [..., n]: int8, fp8 (the fp8 KV cache), or int8 values held in fp32.
        scale: fp32 scales [...], one a row; or a float or 0-d tensor, one for every element (the
            fp8 cache's per-tensor scale).
        dtype: the result's dtype.
        out: where to write the result: codes' shape, `dtype`, codes' device; overlapping neither
            codes nor scale. None: a new tensor.
        work: fp32 scratch of codes' shape on codes' device, where the product is formed when the
            result is not itself fp32 (a CPU; on CUDA only fp8 codes or a scalar scale need it).
            None: a temporary where one is needed.

    Returns:
        The dequantized values: `out` itself when given.

    Raises:
        ValueError: `out` or `work` of another shape, dtype or device.
    """
    s = scale if not isinstance(scale, torch.Tensor) or scale.dim() == 0 else scale.unsqueeze(-1)
    if out is None and work is None:
        if codes.device.type == "cpu":
            return torch.mul(codes.float(), s).to(dtype)   # out of place: fp32 codes stay
        out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
        return torch.mul(_fp32_operand(codes, s, None), s, out=out)
    _check_like(codes, out, dtype, "out")
    _check_like(codes, work, torch.float32, "work")
    if out is None:
        out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    if codes.device.type != "cpu":
        return torch.mul(_fp32_operand(codes, s, work), s, out=out)
    f32 = out if dtype == torch.float32 else torch.empty_like(out, dtype=torch.float32) if work is None else work
    f32.copy_(codes).mul_(s)
    return f32 if f32 is out else out.copy_(f32)


def _fp32_operand(codes: torch.Tensor, scale: torch.Tensor | float, work: torch.Tensor | None) -> torch.Tensor:
    """The codes as CUDA's mixed-type mul needs them to multiply in fp32: as they are when integer
    and the scale a tensor of rows (the mul promotes to the scale's fp32); else in fp32 (in `work`
    when given): fp8 codes would multiply in fp8, int8 codes times a 0-d tensor in its dtype."""
    if not codes.is_floating_point() and isinstance(scale, torch.Tensor) and scale.dim() > 0:
        return codes
    if codes.dtype == torch.float32:
        return codes
    return codes.float() if work is None else work.copy_(codes)


def _check_like(codes: torch.Tensor, t: torch.Tensor | None, dtype: torch.dtype, name: str) -> None:
    """ValueError unless `t` is None or a tensor of codes' shape and device and of `dtype`."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"dequantize_rows: {name} must be a tensor, not {type(t).__name__}")
    if t.shape != codes.shape or t.dtype != dtype or t.device != codes.device:
        raise ValueError(f"dequantize_rows: {name} must be {dtype} of the codes' shape {tuple(codes.shape)} on "
                         f"{codes.device}; got {t.dtype} {tuple(t.shape)} on {t.device}")


# ---------------------------------------------------------------------- per tensor kind
def quantize_weight(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] → (W_q int8 [N, K], s_w fp32 [N]); per output channel."""
    return quantize_rows(w, spec.weight_scale_floor, spec.weight_rounding)


def quantize_act(x: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """X [..., K] → (X_q int8 [..., K], s_x fp32 [...]); per token, dynamic."""
    return quantize_rows(x, spec.act_scale_floor, spec.act_rounding)


def quantize_kv(x: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """K or V [..., head_dim] → (int8 codes, fp32 scales [...]); per token per KV head."""
    return quantize_rows(x, spec.kv_scale_floor, spec.kv_rounding)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """fp8 E4M3 codes of x/scale (saturating at ±448; torch's cast rounds to nearest even)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor calibration scale absmax/448 (floor 1e-12)."""
    return torch.clamp(x.detach().float().abs().amax() / FP8_MAX, min=1e-12)


def kv_roundtrip(x: torch.Tensor, spec: QuantSpec, fp8_scale_value: torch.Tensor | float | None = None) -> torch.Tensor:
    """What reading x back from the KV cache gives: dequant(quant(x)) in x's dtype (no gradient)."""
    if spec.kv == "none":
        return x
    if spec.kv == "int8_per_token_head_sym":
        codes, scale = quantize_kv(x, spec)
        return dequantize_rows(codes, scale, x.dtype)
    s = 1.0 if fp8_scale_value is None else fp8_scale_value
    return dequantize_rows(quantize_fp8(x, s), s, x.dtype)


# ---------------------------------------------------------------------- W8A8 GEMM
def int8_matmul_ref(x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """Exact int32 accumulation X_q[M,K] · W_q[N,K]ᵀ (slow; the reference). float64 holds every
    partial sum exactly (|acc| ≤ K·128² < 2⁵³) and, unlike int64, matmuls on CUDA too."""
    return (x_q.double() @ w_q.double().t()).to(torch.int32)


def int8_matmul(x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """X_q[M,K] int8 · W_q[N,K]ᵀ int8 → int32 [M,N]; exact on every path.

    CPU: `cpu_gemm` (torch._int_mm where the CPU has an int8 dot product, else an exact float-BLAS
    emulation; all give _int_mm's bits). CUDA: _int_mm needs M > 16 and K, N multiples of 8;
    smaller M is padded. Anything else falls back to the float64 reference.
    """
    if x_q.device.type == "cpu":
        return cpu_gemm.int8_matmul(x_q, w_q)
    m, k = x_q.shape
    n = w_q.shape[0]
    if k % 8 == 0 and n % 8 == 0:
        if m > 16:
            return torch._int_mm(x_q, w_q.t())
        pad = torch.zeros(17 - m, k, dtype=x_q.dtype, device=x_q.device)
        return torch._int_mm(torch.cat([x_q, pad]), w_q.t())[:m]
    return int8_matmul_ref(x_q, w_q)


def w8a8_epilogue(acc: torch.Tensor, s_x: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """Y = ((acc · s_x[m]) · s_w[n]) (+ bias) in fp32, then cast. The order is part of the spec."""
    y = (acc.float() * s_x.unsqueeze(-1)).mul_(s_w)      # in place on the temporary: same ops, same order
    if bias is not None:
        y = y.add_(bias.float())
    return y.to(out_dtype)


@dataclass(frozen=True)
class PartialSums:
    """A W8A8 linear's output before its epilogue, as int32 partial sums over K slices:

        Y = w8a8_epilogue(sums.sum(0), s_x, s_w, bias, dtype).reshape(*lead, N)

    sums [S, M, N] (M = prod(lead)), s_x [M], s_w [N] fp32, bias [N] or None. Integer addition is
    associative, so Y does not depend on S or on how K was sliced. A kernel that reads Y anyway
    (the next residual add + RMSNorm, `triton_norm.add_rms_norm`) adds the slices and runs the
    epilogue itself: the GEMM splits K with neither atomics nor a reduction launch
    (`triton_gemm.int8_gemm_partials`)."""

    sums: torch.Tensor
    s_x: torch.Tensor
    s_w: torch.Tensor
    bias: torch.Tensor | None
    dtype: torch.dtype
    lead: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.lead, self.sums.shape[-1])

    def value(self) -> torch.Tensor:
        """Y itself (torch ops; the same bits as the GEMM with its epilogue)."""
        acc = self.sums.sum(0, dtype=torch.int32)
        return w8a8_epilogue(acc, self.s_x, self.s_w, self.bias, self.dtype).reshape(self.shape)


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                spec: QuantSpec) -> torch.Tensor:
    """Quantized linear: per-token int8 X, per-channel int8 W, int32 accumulate, fp32 rescale."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    x_c, s_x = quantize_rows_f32(x2, spec.act_scale_floor, spec.act_rounding)
    y = w8a8_epilogue(codes_matmul(x_c, w_q), s_x, s_w, bias, x.dtype)
    return y.reshape(*shape[:-1], w_q.shape[0])


def codes_matmul(x_c: torch.Tensor, w_c: torch.Tensor) -> torch.Tensor:
    """int8_matmul(x_c, w_c).float() for codes held as int8 or fp32 (CPU: without needless casts)."""
    if x_c.device.type == "cpu":
        return cpu_gemm.int8_matmul_as_float(x_c, w_c)
    return int8_matmul(x_c.to(torch.int8), w_c.to(torch.int8)).float()
