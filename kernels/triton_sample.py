"""The counter-based sampler's temperature-only draw in one Triton launch per step (CUDA).

`counter_sample(logits [B, V] fp32, keys [B], vkeys [V], temperature)` → (tokens [B], log-probs [B])
computes what `rollout.torch_engine.sampler.sample_counter` computes for top_k = -1, top_p = 1:

    x = logits / T,   logp = (x - max x) - log(sum exp(x - max x))      (log_softmax)
    u = ((hash32(key ^ vkey) >> 8) + 0.5) / 2^24,   token = argmax(logp - log(-log u))

with one program per row streaming the vocabulary twice (max / sum, then the noisy argmax), instead
of ~40 torch kernels over [B, V] int64 / fp32 tensors. The hash and the uniforms are the same bits
(pure integer arithmetic); the sum of exponentials is reduced in another order than torch's, so a
log-prob can differ from torch's in the last fp32 bits and an exact tie in the argmax may resolve
differently (the first index wins here). T = 0 (greedy) takes the argmax of logp.
"""
from __future__ import annotations

import torch

from ._interp import HAVE_TRITON, interpreting, require_triton

INTERPRETED = interpreting()

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _mul32(x, c):
        """(x · c) mod 2³² for int64 x in [0, 2³²): the low 32 bits survive int64 wrap-around."""
        return (x * c) & 0xFFFFFFFF

    @triton.jit
    def _hash32(x):
        """`sampler.hash32` (lowbias32) on int64 values in [0, 2³²)."""
        x = x ^ (x >> 16)
        x = _mul32(x, 0x7FEB352D)
        x = x ^ (x >> 15)
        x = _mul32(x, 0x846CA68B)
        return x ^ (x >> 16)

    @triton.jit
    def _counter_sample_kernel(logits_ptr, keys_ptr, vkeys_ptr, temp_ptr, tok_ptr, lp_ptr, V, stride_l,
                               GREEDY: tl.constexpr, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_V)
        base = logits_ptr + row * stride_l
        t = tl.load(temp_ptr)
        # pass 1: running max and sum of exp(x - max), per lane, then across lanes
        m_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        s_v = tl.full([BLOCK_V], 0, tl.float32)
        for v0 in range(0, V, BLOCK_V):
            mask = v0 + offs < V
            x = tl.load(base + v0 + offs, mask=mask, other=float("-inf")) / t
            m_new = tl.maximum(m_v, x)
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_v = s_v * tl.exp(m_v - safe) + tl.exp(x - safe)
            m_v = m_new
        m = tl.reduce(m_v, 0, tl.standard._elementwise_max)   # (tl.max/tl.sum break the reloaded interpreter)
        s = tl.reduce(s_v * tl.exp(m_v - m), 0, tl.standard._sum_combine)
        log_s = tl.log(s)
        # pass 2: argmax of logp (+ Gumbel noise), first index on ties
        key = tl.load(keys_ptr + row)
        best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK_V], 2147483647, tl.int32)
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + offs
            mask = idx < V
            x = tl.load(base + idx, mask=mask, other=float("-inf")) / t
            score = (x - m) - log_s
            if not GREEDY:
                vk = tl.load(vkeys_ptr + idx, mask=mask, other=0)
                bits = _hash32((key ^ vk) & 0xFFFFFFFF) >> 8
                u = (bits.to(tl.float32) + 0.5) * (1.0 / 16777216.0)
                score = score + (-tl.log(-tl.log(u)))
            score = tl.where(mask, score, float("-inf"))
            better = score > best_v                    # strictly: an earlier index keeps a tie
            best_i = tl.where(better, idx.to(tl.int32), best_i)
            best_v = tl.where(better, score, best_v)
        top = tl.reduce(best_v, 0, tl.standard._elementwise_max)
        tok = tl.reduce(tl.where(best_v == top, best_i, 2147483647), 0, tl.standard._elementwise_min)
        x_tok = tl.load(base + tok) / t
        tl.store(tok_ptr + row, tok.to(tl.int64))
        tl.store(lp_ptr + row, (x_tok - m) - log_s)


def counter_sample(logits: torch.Tensor, keys: torch.Tensor, vkeys: torch.Tensor, temperature: torch.Tensor,
                   greedy: bool, block_v: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [B], log-probs fp32 [B]) of the temperature-only counter draw (module docstring).

    Args:
        logits: [B, V] fp32 (V contiguous). keys: [B] int64 row keys (`sampler.row_keys`).
        vkeys: [V] int64 vocabulary keys (`sampler.vocab_keys`). temperature: a 1-element fp32
            tensor (1.0 when greedy), read on the device so a CUDA graph serves any temperature.
        greedy: T = 0 (no noise).
    """
    require_triton("triton_sample.counter_sample")
    b, v = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    tokens = torch.empty(b, dtype=torch.int64, device=logits.device)
    logps = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b:
        _counter_sample_kernel[(b,)](logits, keys.contiguous(), vkeys, temperature.reshape(1), tokens, logps,
                                     v, logits.stride(0), GREEDY=greedy, BLOCK_V=block_v, num_warps=8)
    return tokens, logps


__all__ = ["counter_sample"]
