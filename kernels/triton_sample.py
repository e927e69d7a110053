"""The counter-based sampler's temperature-only draw as Triton launches over vocabulary splits (CUDA).

`counter_sample(logits [B, V] fp32, keys [B], vkeys [V], temperature)` → (tokens [B], log-probs [B])
computes what `rollout.torch_engine.sampler.sample_counter` computes for top_k = -1, top_p = 1:

    x = logits / T,   logp = (x - max x) - log(sum exp(x - max x))      (log_softmax)
    u = ((hash32(key ^ vkey) >> 8) + 0.5) / 2^24,   token = argmax(logp - log(-log u))

in three launches instead of ~40 torch kernels over [B, V] int64 / fp32 tensors. The vocabulary is
cut into splits of `SPLIT_V` entries, so a step has B x splits programs (one program per row
streamed a 151,936-entry row twice on 64 of the 132 SMs: 144 µs per step at B 64): each split's
max and sum of exponentials, then each split's noisy argmax of logp (every program first merges
the row's partials into m and log_s), then the best split per row. The hash and the uniforms are
the same bits (pure integer arithmetic); the sum of exponentials is reduced in another order than
torch's, so a log-prob can differ from torch's in the last fp32 bits and an exact tie in the argmax
may resolve differently (the first index wins here). The split count depends on V alone: a row's
result does not depend on the batch. T = 0 (greedy) takes the argmax of logp.
"""
from __future__ import annotations

import torch

from ._interp import HAVE_TRITON, interpreting, require_triton
from ._launch import launch_kernel
from .triton_quant import use_pdl

INTERPRETED = interpreting()

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .triton_quant import pdl_start

    @triton.jit
    def _hash32(x):
        """`sampler.hash32` (lowbias32) on uint32 values: uint32 arithmetic wraps mod 2³² by itself
        (the int64 products masked to 32 bits cost several times more per vocabulary entry)."""
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        return x ^ (x >> 16)

    @triton.jit
    def _row_keys_kernel(seeds_ptr, pos_ptr, out_ptr, B, BLOCK: tl.constexpr):
        """`sampler.row_keys` for B rows in one launch (its ~70 int64 torch ops each a launch):
        hash32(hash32(hash32(lo(seed)) ^ hi(seed)) ^ hash32(pos + 0x9E3779B9)), 32-bit halves."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < B
        seeds = tl.load(seeds_ptr + offs, mask=mask, other=0).to(tl.int64)
        pos = tl.load(pos_ptr + offs, mask=mask, other=0).to(tl.int64)
        lo = (seeds & 0xFFFFFFFF).to(tl.uint32)
        hi = ((seeds >> 32) & 0xFFFFFFFF).to(tl.uint32)
        p = ((pos + 0x9E3779B9) & 0xFFFFFFFF).to(tl.uint32)
        key = _hash32(_hash32(_hash32(lo) ^ hi) ^ _hash32(p))
        tl.store(out_ptr + offs, key.to(tl.int64), mask=mask)

    @triton.jit
    def _first_max(values, indices):
        """(max of values, the smallest index among the entries that reach it): ties go to the
        first vocabulary entry, in a split and across splits alike."""
        top = tl.reduce(values, 0, tl.standard._elementwise_max)   # (tl.max breaks the reloaded interpreter)
        return top, tl.reduce(tl.where(values == top, indices, 2147483647), 0, tl.standard._elementwise_min)

    @triton.jit
    def _split_max_sum_kernel(logits_ptr, temp_ptr, pm_ptr, ps_ptr, V, stride_l, chunk, num_splits,
                              BLOCK_V: tl.constexpr, PDL: tl.constexpr):
        """Program (row, split): max m_s of x = logits / T over the split's slice of the vocabulary,
        and the sum s_s of exp(x - m_s) there."""
        pdl_start(PDL)
        row, sp = tl.program_id(0).to(tl.int64), tl.program_id(1)
        offs = tl.arange(0, BLOCK_V)
        base = logits_ptr + row * stride_l
        t = tl.load(temp_ptr)
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, V)
        m_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        s_v = tl.full([BLOCK_V], 0, tl.float32)
        for v0 in range(lo, hi, BLOCK_V):
            mask = v0 + offs < hi
            x = tl.load(base + v0 + offs, mask=mask, other=float("-inf")) / t
            m_new = tl.maximum(m_v, x)
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_v = s_v * tl.exp(m_v - safe) + tl.exp(x - safe)
            m_v = m_new
        m = tl.reduce(m_v, 0, tl.standard._elementwise_max)   # (tl.max/tl.sum break the reloaded interpreter)
        safe_m = tl.where(m == float("-inf"), 0.0, m)
        s = tl.reduce(s_v * tl.exp(m_v - safe_m), 0, tl.standard._sum_combine)
        tl.store(pm_ptr + row * num_splits + sp, m)
        tl.store(ps_ptr + row * num_splits + sp, s)

    @triton.jit
    def _split_argmax_kernel(logits_ptr, keys_ptr, vkeys_ptr, temp_ptr, pm_ptr, ps_ptr, pv_ptr, pi_ptr, norm_ptr,
                             V, stride_l, chunk, num_splits,
                             GREEDY: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
        """Program (row, split): the row's max m and log-sum log_s from the splits' partials, then
        the split's best score (x - m) - log_s (+ Gumbel noise) and its first index."""
        pdl_start(PDL)
        row, sp = tl.program_id(0).to(tl.int64), tl.program_id(1)
        offs = tl.arange(0, BLOCK_V)
        base = logits_ptr + row * stride_l
        t = tl.load(temp_ptr)
        offs_s = tl.arange(0, BLOCK_S)
        mask_s = offs_s < num_splits
        pm = tl.load(pm_ptr + row * num_splits + offs_s, mask=mask_s, other=float("-inf"))
        ps = tl.load(ps_ptr + row * num_splits + offs_s, mask=mask_s, other=0.0)
        m = tl.reduce(pm, 0, tl.standard._elementwise_max)
        w = tl.where(pm == float("-inf"), 0.0, tl.exp(pm - m))
        log_s = tl.log(tl.reduce(ps * w, 0, tl.standard._sum_combine))
        if sp == 0:                     # the pick kernel's log-prob uses exactly these two values
            tl.store(norm_ptr + row * 2, m)
            tl.store(norm_ptr + row * 2 + 1, log_s)
        key = tl.load(keys_ptr + row)
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, V)
        best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK_V], 2147483647, tl.int32)
        for v0 in range(lo, hi, BLOCK_V):
            idx = v0 + offs
            mask = idx < hi
            x = tl.load(base + idx, mask=mask, other=float("-inf")) / t
            score = (x - m) - log_s
            if not GREEDY:
                vk = tl.load(vkeys_ptr + idx, mask=mask, other=0)
                bits = _hash32(((key ^ vk) & 0xFFFFFFFF).to(tl.uint32)) >> 8
                u = (bits.to(tl.float32) + 0.5) * (1.0 / 16777216.0)
                score = score + (-tl.log(-tl.log(u)))
            score = tl.where(mask, score, float("-inf"))
            better = score > best_v                    # strictly: an earlier index keeps a tie
            best_i = tl.where(better, idx.to(tl.int32), best_i)
            best_v = tl.where(better, score, best_v)
        top, top_i = _first_max(best_v, best_i)
        tl.store(pv_ptr + row * num_splits + sp, top)
        tl.store(pi_ptr + row * num_splits + sp, top_i)

    @triton.jit
    def _pick_kernel(logits_ptr, temp_ptr, pv_ptr, pi_ptr, norm_ptr, tok_ptr, lp_ptr, stride_l, num_splits,
                     BLOCK_S: tl.constexpr, PDL: tl.constexpr):
        """Program per row: the best split's token (the first index among equal scores) and its log-prob."""
        pdl_start(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs_s = tl.arange(0, BLOCK_S)
        mask_s = offs_s < num_splits
        pv = tl.load(pv_ptr + row * num_splits + offs_s, mask=mask_s, other=float("-inf"))
        pi = tl.load(pi_ptr + row * num_splits + offs_s, mask=mask_s, other=2147483647)
        _, tok = _first_max(pv, pi)
        x_tok = tl.load(logits_ptr + row * stride_l + tok) / tl.load(temp_ptr)
        tl.store(tok_ptr + row, tok.to(tl.int64))
        tl.store(lp_ptr + row, (x_tok - tl.load(norm_ptr + row * 2)) - tl.load(norm_ptr + row * 2 + 1))


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`sampler.row_keys(seeds, positions)` (int64 [B] each → int64 keys in [0, 2³²)) in one
    launch: the same integer arithmetic, so the same keys."""
    require_triton("triton_sample.row_keys")
    assert seeds.shape == positions.shape and seeds.dim() == 1
    out = torch.empty_like(seeds, dtype=torch.int64)
    if seeds.numel():
        block = max(16, min(1024, triton.next_power_of_2(seeds.numel())))
        launch_kernel(_row_keys_kernel, (triton.cdiv(seeds.numel(), block),),
            seeds.contiguous(), positions.contiguous(), out,
            seeds.numel(), BLOCK=block, num_warps=1)
    return out


#: vocabulary entries per split: the split count depends on V only, so a row's result (max,
#: log-sum order included) never depends on the batch it is sampled in
SPLIT_V = 8192


def counter_sample(logits: torch.Tensor, keys: torch.Tensor, vkeys: torch.Tensor, temperature: torch.Tensor,
                   greedy: bool, block_v: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [B], log-probs fp32 [B]) of the temperature-only counter draw (module docstring).

    Args:
        logits: [B, V] fp32 (V contiguous). keys: [B] int64 row keys (`sampler.row_keys`).
        vkeys: [V] int64 vocabulary keys (`sampler.vocab_keys`). temperature: a 1-element fp32
            tensor (1.0 when greedy), read on the device so a CUDA graph serves any temperature.
        greedy: T = 0 (no noise).
        block_v: vocabulary entries per loop iteration (and the split size's granule).
    """
    require_triton("triton_sample.counter_sample")
    b, v = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    dev = logits.device
    tokens = torch.empty(b, dtype=torch.int64, device=dev)
    logps = torch.empty(b, dtype=torch.float32, device=dev)
    if not b:
        return tokens, logps
    chunk = -(-min(SPLIT_V, v) // block_v) * block_v
    splits = -(-v // chunk)
    pm, ps, pv = (torch.empty(b, splits, dtype=torch.float32, device=dev) for _ in range(3))
    pi = torch.empty(b, splits, dtype=torch.int32, device=dev)
    norm = torch.empty(b, 2, dtype=torch.float32, device=dev)
    t = temperature.reshape(1)
    pdl = use_pdl(_pick_kernel, dev, b)
    block_s = max(2, triton.next_power_of_2(splits))
    launch_kernel(_split_max_sum_kernel, (b, splits), logits, t, pm, ps, v, logits.stride(0), chunk, splits,
                  BLOCK_V=block_v, PDL=pdl, launch_pdl=pdl, num_warps=4)
    launch_kernel(_split_argmax_kernel, (b, splits),
        logits, keys.contiguous(), vkeys, t, pm, ps, pv, pi, norm, v, logits.stride(0),
        chunk, splits, GREEDY=greedy, BLOCK_V=block_v, BLOCK_S=block_s, PDL=pdl,
        launch_pdl=pdl, num_warps=4)
    launch_kernel(_pick_kernel, (b,),
        logits, t, pv, pi, norm, tokens, logps, logits.stride(0), splits, BLOCK_S=block_s, PDL=pdl,
        launch_pdl=pdl, num_warps=1)
    return tokens, logps


__all__ = ["counter_sample", "row_keys"]
