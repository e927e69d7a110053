"""agentq.kernels: quantization numerics (QuantSpec), W8A8 linears, KV8 attention, Triton kernels.

The top-level folder `kernels/`, installed as `agentq.kernels` (setup.py maps it); the lowest layer
with `agentq.envs`: it imports torch and triton, nothing else of agentq (ARCHITECTURE.md)."""
from . import cpu_gemm
from .quant_spec import PRESETS, QuantSpec

__all__ = ["PRESETS", "QuantSpec", "cpu_gemm"]
