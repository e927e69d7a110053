"""W8A8 linear dispatch: the engine calls `w8a8_linear`; the backend is chosen per device.

* CUDA: Triton fused per-token quant + int8 GEMM with fused rescale (`triton_gemm`), when Triton
  is importable; otherwise quant + `torch._int_mm` (padded to its shape rules) + rescale.
* CPU: torch reference numerics (`quant.w8a8_linear`; the int GEMM path per CPU: `cpu_gemm`).

All paths give identical int32 accumulators; the fp32 epilogue order is fixed by the spec.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING

import torch

from . import quant
from .quant_spec import QuantSpec

if TYPE_CHECKING:
    from .triton_gemm import GemmConfig


def _triton_linear():
    try:
        from .triton_gemm import w8a8_linear as fn
    except Exception:   # triton missing or too old: the torch path is always correct
        return None
    return fn


def quantize_weight(w: torch.Tensor, spec: QuantSpec, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quant.quantize_weight`, bit for bit (the codes the learner's `ste.WeightCache` computes):
    one Triton launch on CUDA, where the torch ops are ~6 full-size passes and launches a weight
    and an engine's weight sync requantizes every weight (~200 for a 1.7B model). backend: as in
    `ste.triton_path` ("triton" runs the kernel under the interpreter on CPU)."""
    from .ste import quantize_rows

    return quantize_rows(w, spec.weight_scale_floor, spec.weight_rounding, backend)


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                spec: QuantSpec) -> torch.Tensor:
    if x.is_cuda:
        fn = _triton_linear()
        if fn is not None:
            return fn(x, w_q, s_w, bias, spec)
    return quant.w8a8_linear(x, w_q, s_w, bias, spec)


def w8a8_linear_codes(x_q: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                      bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """The GEMM + epilogue of `w8a8_linear` for activations already quantized per token (a fused
    norm / SiLU·mul kernel produced x_q [..., K] int8 and s_x [...] fp32): the same result as
    `w8a8_linear` on the activations those codes came from."""
    shape = x_q.shape
    x2, s2 = x_q.reshape(-1, shape[-1]), s_x.reshape(-1)
    if x_q.is_cuda and _triton_linear() is not None:
        from .triton_gemm import int8_gemm
        y = int8_gemm(x2, s2, w_q, s_w, bias, out_dtype)
    else:
        y = quant.w8a8_epilogue(quant.int8_matmul(x2, w_q), s2, s_w, bias, out_dtype)
    return y.reshape(*shape[:-1], w_q.shape[0])


#: a decode step's o and down projections split K and hand int32 partial sums to the norm after
#: them (`w8a8_linear_partials`) where the H200 table measured that faster; AGENTQ_PARTIAL_SUMS=0
#: keeps the GEMM with its epilogue (the same bits, kept for A/B runs).
PARTIAL_SUMS = os.environ.get("AGENTQ_PARTIAL_SUMS", "1") != "0"


def partials_config(rows: int, w_q: torch.Tensor) -> GemmConfig | None:
    """`triton_gemm.int8_gemm_partials`'s launch for `rows` rows through W_q [N, K], or None: the
    table has no row for the shape, the weight is not on CUDA, or `PARTIAL_SUMS` is off."""
    if not (PARTIAL_SUMS and w_q.is_cuda and _triton_linear() is not None):
        return None
    from .triton_gemm import partials_config as table_config
    return table_config(rows, *w_q.shape)


def w8a8_linear_partials(x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], w_q: torch.Tensor,
                         s_w: torch.Tensor, bias: torch.Tensor | None, spec: QuantSpec, out_dtype: torch.dtype
                         ) -> torch.Tensor | quant.PartialSums:
    """A W8A8 linear whose output only a fused residual add + RMSNorm reads
    (`triton_norm.add_rms_norm`): its partial sums (`quant.PartialSums`, leading dims of x) where
    `partials_config` has a split launch for the shape, else the output itself. x: rows in the
    model dtype (quantized per token here) or (codes, scales) from a fused kernel."""
    lead = tuple((x[0] if isinstance(x, tuple) else x).shape[:-1])
    rows = math.prod(lead)
    cfg = partials_config(rows, w_q)
    if cfg is None:
        if isinstance(x, tuple):
            return w8a8_linear_codes(x[0], x[1], w_q, s_w, bias, out_dtype)
        return w8a8_linear(x, w_q, s_w, bias, spec)
    from .triton_gemm import int8_gemm_partials
    from .triton_quant import quantize_per_token
    k = w_q.shape[1]
    if isinstance(x, tuple):
        x_q, s_x = x[0].reshape(rows, k), x[1].reshape(rows)
    else:
        x_q, s_x = quantize_per_token(x.reshape(rows, k), spec)
    return dataclasses.replace(int8_gemm_partials(x_q, s_x, w_q, s_w, bias, out_dtype, cfg), lead=lead)


#: gate_up linears on CUDA store their gate and up rows paired and run the GEMM with SiLU·mul in
#: its epilogue (`w8a8_glu_codes`) at every row count; AGENTQ_GLU_GEMM=0 keeps the stacked rows and
#: the two-launch path (gate_up GEMM, then SiLU·mul + codes; the same bits, kept for A/B runs).
#: Read when an engine is built: the weight layout follows it.
GLU_GEMM = os.environ.get("AGENTQ_GLU_GEMM", "1") != "0"


def glu_layout(quantized: bool, device: torch.device | str) -> bool:
    """Whether a gate_up linear built now on `device` pairs its rows (`triton_gemm.glu_pair_rows`)
    and runs `w8a8_glu_codes`: quantized, on CUDA with Triton, while `GLU_GEMM` is on."""
    return (bool(GLU_GEMM) and quantized and torch.device(device).type == "cuda"
            and _triton_linear() is not None)


def w8a8_glu_codes(x_q: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                   bias: torch.Tensor | None, out_dtype: torch.dtype, act_quant: tuple[float, str] | None
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """silu(gate) · up of a gate_up W8A8 linear (W_q [2N, K], s_w, bias: gate and up rows paired,
    `triton_gemm.glu_pair_rows`) on per-token codes x_q [..., K] / s_x [...]: the rows [..., N],
    or with `act_quant` = (scale floor, rounding) their per-token codes and scales for the down
    projection. The same bits as the stacked gate_up GEMM + `triton_norm.silu_mul` (+
    `quantize_rows`), in two launches (`glu_layout`)."""
    from .triton_gemm import int8_gemm_glu
    from .triton_quant import quantize_rows_from_amax
    shape = x_q.shape
    h, amax = int8_gemm_glu(x_q.reshape(-1, shape[-1]), s_x.reshape(-1), w_q, s_w, bias, out_dtype)
    lead = shape[:-1]
    if act_quant is None:
        return h.reshape(*lead, h.shape[-1])
    codes, scales = quantize_rows_from_amax(h, amax, *act_quant)
    return codes.reshape(*lead, h.shape[-1]), scales.reshape(lead)
