"""agentq.kernels: quantization numerics (QuantSpec), W8A8 linears, KV8 attention, Triton kernels."""
from .quant_spec import PRESETS, QuantSpec

__all__ = ["PRESETS", "QuantSpec"]
