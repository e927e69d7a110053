"""Token log-probs of a causal LM's logits without an fp32 copy of them (Triton, CUDA).

`logprob_forward(logits [B, L, V], targets [B, L], T)` → (log-probs fp32 [B, L], lse fp32 [B, L]):

    lse_t = logsumexp(x_t / T),   log p_t = x_t[target_t] / T − lse_t

one program per row, streaming the vocabulary once in the logits' own dtype: each lane keeps a
running max and a sum of exponentials relative to it in fp32 (one exponential per element), the
lanes are combined at the end, and the target logit is read on the side. `logprob_backward` is the
gradient of Σ g_t · log p_t, written in the logits' dtype with one read of the logits:

    dx_t[v] = g_t / T · (1[v = target_t] − exp(x_t[v] / T − lse_t))

one program per (row, block of the vocabulary). Against torch's `logsumexp` of `logits.float() / T`
the elementwise values are the same (x / T is an IEEE division, as torch's); only the order of the
sum of exponentials differs, so log-probs differ in the last fp32 bits (~1e-6 relative). No [N, V]
fp32 tensor is materialised in either direction. A target outside [0, V) gives a NaN log-prob (the
kernel cannot raise, and checking on the host would sync the device).
"""
from __future__ import annotations

import torch

from ._interp import HAVE_TRITON, interpreting, require_triton, runs_interpreted
from ._launch import launch_kernel

INTERPRETED = interpreting()
#: vocabulary block of one loop step (forward) and of one program (backward)
BLOCK_V = 4096

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .triton_quant import cast_for_store, store_view

    @triton.jit
    def _load_scaled(ptrs, mask, temperature, SCALED: tl.constexpr):
        """Logits as fp32 (masked lanes −inf), divided by T when SCALED (IEEE division, as torch's)."""
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        if SCALED:
            x = tl.math.div_rn(x, temperature)
        return tl.where(mask, x, float("-inf"))

    @triton.jit
    def _logprob_fwd_kernel(x_ptr, tgt_ptr, lp_ptr, lse_ptr, L, V, stride_b, stride_l, temperature,
                            SCALED: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + (row // L) * stride_b + (row % L) * stride_l
        offs = tl.arange(0, BLOCK)
        m_v = tl.full([BLOCK], float("-inf"), tl.float32)
        s_v = tl.full([BLOCK], 0, tl.float32)
        for v0 in range(0, V, BLOCK):
            x = _load_scaled(base + v0 + offs, v0 + offs < V, temperature, SCALED)
            m_new = tl.maximum(m_v, x)
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # both −inf: add exp(−inf) = 0
            # one exponential per element: the smaller of (running max, x) against the larger
            e = tl.exp(tl.minimum(m_v, x) - safe)
            s_v = tl.where(x > m_v, s_v * e + 1.0, s_v + e)
            m_v = m_new
        m = tl.reduce(m_v, 0, tl.standard._elementwise_max)   # (tl.max/tl.sum break the reloaded interpreter)
        s = tl.reduce(s_v * tl.exp(m_v - m), 0, tl.standard._sum_combine)
        lse = m + tl.log(s)
        tgt = tl.load(tgt_ptr + row)
        ok = (tgt >= 0) & (tgt < V)
        x_t = tl.load(base + tl.where(ok, tgt, 0)).to(tl.float32)
        if SCALED:
            x_t = tl.math.div_rn(x_t, temperature)
        tl.store(lp_ptr + row, tl.where(ok, x_t - lse, float("nan")))
        tl.store(lse_ptr + row, lse)

    @triton.jit
    def _logprob_bwd_kernel(x_ptr, tgt_ptr, lse_ptr, g_ptr, dx_ptr, L, V, stride_b, stride_l, temperature,
                            SCALED: tl.constexpr, BLOCK: tl.constexpr, BF16_BITS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < V
        x = _load_scaled(x_ptr + (row // L) * stride_b + (row % L) * stride_l + offs, mask, temperature, SCALED)
        g = tl.load(g_ptr + row)
        if SCALED:
            g = tl.math.div_rn(g, temperature)
        p = tl.exp(x - tl.load(lse_ptr + row))
        dx = g * (tl.where(offs == tl.load(tgt_ptr + row), 1.0, 0.0) - p)
        tl.store(dx_ptr + row * V + offs, cast_for_store(dx, dx_ptr.dtype.element_ty, BF16_BITS), mask=mask)


def _check(logits: torch.Tensor, targets: torch.Tensor) -> None:
    if logits.dim() != 3 or logits.stride(-1) != 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(f"logits must be [B, L, V] with a contiguous last dim and targets [B, L]; got logits "
                         f"{tuple(logits.shape)} strides {logits.stride()}, targets {tuple(targets.shape)}")


def logprob_forward(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                    block_v: int = BLOCK_V) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target) fp32 [B, L], logsumexp(logits / T) fp32 [B, L]) (module docstring).

    Args:
        logits: [B, L, V] bf16 / fp16 / fp32; any strides for B and L, V contiguous (a slice such
            as `logits[:, :-1]` is read in place). targets: [B, L] integer token ids.
        temperature: T > 0. block_v: vocabulary block per loop step (a power of two).
    """
    require_triton("triton_logprob.logprob_forward")
    _check(logits, targets)
    b, l, v = logits.shape
    lp = torch.empty((b, l), dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(lp)
    if lp.numel():
        launch_kernel(_logprob_fwd_kernel, (b * l,), logits, targets.contiguous(), lp, lse, l, v, logits.stride(0),
                      logits.stride(1), float(temperature), SCALED=temperature != 1.0,
                      BLOCK=block_v, num_warps=8)
    return lp, lse


def logprob_backward(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor,
                     temperature: float = 1.0, block_v: int = BLOCK_V) -> torch.Tensor:
    """d(Σ grad · log p(target)) / d logits: [B, L, V] contiguous, in the logits' dtype.

    Args:
        logits, targets, temperature: as given to `logprob_forward`; lse: its logsumexp output;
        grad: [B, L] gradient of the log-probs. block_v: vocabulary block per program.
    """
    require_triton("triton_logprob.logprob_backward")
    _check(logits, targets)
    b, l, v = logits.shape
    dx = torch.empty((b, l, v), dtype=logits.dtype, device=logits.device)
    if dx.numel():
        dx_arg, bits = store_view(dx, runs_interpreted(_logprob_bwd_kernel))
        launch_kernel(_logprob_bwd_kernel, (b * l, triton.cdiv(v, block_v)),
            logits, targets.contiguous(), lse.contiguous(), grad.float().contiguous(), dx_arg, l, v,
            logits.stride(0), logits.stride(1), float(temperature), SCALED=temperature != 1.0,
            BLOCK=block_v, BF16_BITS=bits, num_warps=8)
    return dx


__all__ = ["BLOCK_V", "logprob_backward", "logprob_forward"]
