"""W8A8 linear dispatch: the engine calls `w8a8_linear`; the backend is chosen per device.

* CUDA: Triton fused per-token quant + int8 GEMM with fused rescale (`triton_gemm`), when Triton
  is importable; otherwise quant + `torch._int_mm` (padded to its shape rules) + rescale.
* CPU: torch reference numerics (`quant.w8a8_linear`; the int GEMM path per CPU: `cpu_gemm`).

All paths give identical int32 accumulators; the fp32 epilogue order is fixed by the spec.
"""
from __future__ import annotations

import torch

from . import quant
from .quant_spec import QuantSpec


def _triton_linear():
    try:
        from .triton_gemm import w8a8_linear as fn
    except Exception:   # triton missing or too old: the torch path is always correct
        return None
    return fn


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                spec: QuantSpec) -> torch.Tensor:
    if x.is_cuda:
        fn = _triton_linear()
        if fn is not None:
            return fn(x, w_q, s_w, bias, spec)
    return quant.w8a8_linear(x, w_q, s_w, bias, spec)
