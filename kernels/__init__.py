"""agentq.kernels: quantization numerics (QuantSpec), W8A8 linears, KV8 attention, Triton kernels."""
from . import cpu_gemm
from .quant_spec import PRESETS, QuantSpec

__all__ = ["PRESETS", "QuantSpec", "cpu_gemm"]
