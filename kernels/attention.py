"""Attention over a cached (possibly quantized) context: the torch reference used on CPU and for
prefill, and the dispatch to the Triton int8-KV decode kernel on CUDA."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_accum_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """fp32 models compute attention in fp64 in no-grad passes (CPU and CUDA).

    Why: attention is the one reduction whose order depends on batch shape (how many keys are
    padded, how many queries share a call). In fp32 that changes the last bits of its output,
    which flips an occasional int8 activation code downstream, so a turn decoded token by token
    and the same turn re-scored in one pass (the learner) would differ by ~1e-3 nats. In fp64 the
    order-dependent error is far below fp32 resolution, and engine and learner agree to ~1e-6.
    The passes that are compared run without gradients: the engine, and the learner's π_old /
    π_ref log-probs. Gradient passes keep fp32 (2× faster backward on CPU); at θ_old their ratio
    to π_old is 1 up to that same ~1e-3, far inside PPO's clip range.
    bf16/fp16 models keep their dtype: their own rounding (≈0.4 %) already moves int8 codes, so
    exactness is not reachable there (measured on an H200: tests/rollout/test_engine_cuda.py).
    """
    exact = dtype == torch.float32 and not torch.is_grad_enabled()
    return torch.float64 if exact else dtype


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, L, D], allowed [B, T, L] bool → [B, Hq, T, D].

    SDPA with GQA (query head h reads KV head h // (Hq/Hkv), HF's repeat_kv order, without
    materialising repeated K/V), in `attention_accum_dtype` (fp64 for no-grad fp32 passes).
    Every query row must allow at least one key (padding rows allow key 0)."""
    acc = attention_accum_dtype(q.dtype, q.device)
    group = q.shape[1] // k.shape[1]
    if q.is_cuda and acc in (torch.bfloat16, torch.float16) and group > 1:
        # SDPA's fused kernels that take a mask do not take GQA (it would fall back to the math
        # kernel, which materialises every score): repeat K/V heads in HF's repeat_kv order instead
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        group = 1
    out = F.scaled_dot_product_attention(q.to(acc), k.to(acc), v.to(acc), attn_mask=allowed[:, None], scale=scale,
                                         enable_gqa=group > 1)
    return out.to(q.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, T, D] → [B, Hq, T, D]: causal self-attention (query i reads
    keys 0..i), GQA as in `masked_attention`, in `attention_accum_dtype`.

    Bit-identical to `masked_attention` with a lower-triangular mask (tests/kernels/test_attention.py)
    and faster: SDPA's causal kernel skips the key blocks above the diagonal, which an explicit
    mask makes it compute (on a CPU 1.4–1.8× faster at 1–2k tokens); the blocks it computes see
    the same scores in the same order, and a fully masked block only adds zeros and rescales by 1."""
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"causal_attention: {q.shape[2]} queries over {k.shape[2]} keys; it is self-attention "
                         "(queries after a cached prefix take masked_attention)")
    acc = attention_accum_dtype(q.dtype, q.device)
    out = F.scaled_dot_product_attention(q.to(acc), k.to(acc), v.to(acc), is_causal=True, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.to(q.dtype)


def _triton_decode():
    try:
        from .triton_attention import decode_attention as fn
    except Exception:
        return None
    return fn


def decode_attention_available(device: torch.device) -> bool:
    return device.type == "cuda" and _triton_decode() is not None


def decode_attention(q, k_cache, k_scale, v_cache, v_scale, slot_ids, lens, sm_scale):
    """One query token per sequence over the engine's cache layout (CUDA Triton kernel)."""
    return _triton_decode()(q, k_cache, k_scale, v_cache, v_scale, slot_ids, lens, sm_scale)


def prefill_kernel_available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether prefill chunks read the cache in place (`triton_prefill`): CUDA, a bf16/fp16 model
    (fp32 keeps the exact torch path), a power-of-two head dim; `AGENTQ_PREFILL_KERNEL=0` turns
    it off (the read-back + masked SDPA path)."""
    import os

    from ._interp import HAVE_TRITON, cuda_half
    return (cuda_half(device, dtype) and HAVE_TRITON
            and head_dim >= 16 and head_dim & (head_dim - 1) == 0
            and os.environ.get("AGENTQ_PREFILL_KERNEL", "1") != "0")


def prefill_cache_read(k_cache: torch.Tensor, b: int, t: int, key_len: int) -> str:
    """How `prefill_attention` reads the cache for a [B, T] chunk over key_len positions
    (`triton_prefill.cache_read`)."""
    from .triton_prefill import cache_read
    return cache_read(k_cache, b, t, key_len)


def prefill_attention(q, k_cache, k_scale, v_cache, v_scale, slots, n_new, new_lens, sm_scale, key_len=None):
    """A prefill chunk's attention over the engine's cache layout, read in place (CUDA Triton
    kernel; `triton_prefill.prefill_attention`; key_len = max(new_lens) when known)."""
    from .triton_prefill import prefill_attention as fn
    return fn(q, k_cache, k_scale, v_cache, v_scale, slots, n_new, new_lens, sm_scale, key_len=key_len)
