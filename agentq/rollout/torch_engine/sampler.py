"""fp32 sampling with exact behaviour log-probs.

logits/T → optional top-k / top-p truncation → log_softmax (renormalised over what is kept) →
Gumbel-max draw → the log-prob of the sampled token under that same distribution.

Two sources of Gumbel noise, both making a row's token independent of the other rows in the batch:

* `sample`: the episode's own `torch.Generator` (CPU draws; the CPU engine's default);
* `sample_counter`: a counter-based draw, a pure integer hash of (episode seed, token position,
  vocabulary index). It runs wherever the logits are (on the GPU: no CPU draw over the vocabulary
  and no host sync, so it can sit inside a CUDA graph), and gives the same bits on CPU and GPU.
"""
from __future__ import annotations

import torch

from agentq.rollout.backend import SamplingParams


def processed_logprobs(logits: torch.Tensor, p: SamplingParams,
                       temperature: torch.Tensor | None = None) -> torch.Tensor:
    """[B, V] fp32 logits → log-probs of the distribution actually sampled from.
    `temperature`: an optional 0-d fp32 tensor holding p.temperature (same quotient bits)."""
    x = logits.float()
    if p.temperature > 0:
        x = x / (p.temperature if temperature is None else temperature)
    if p.top_k > 0 and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop_sorted = (probs.cumsum(-1) - probs) >= p.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x · c) mod 2³² for x in [0, 2³²) held in int64, without int64 overflow (16-bit halves)."""
    lo, hi = x & 0xFFFF, x >> 16
    return ((((hi * c) & 0xFFFF) << 16) + lo * c) & 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer mix (the "lowbias32" xorshift-multiply finaliser), int64 in/out."""
    x = x & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from its episode seed (any int64) and the sampled token's position.
    On CUDA one Triton launch computes it (`triton_sample.row_keys`, the same integers) instead of
    ~70 int64 torch ops, each a launch in every decode step."""
    fused = _triton_sampler() if seeds.is_cuda else None
    if fused is not None:
        return fused.row_keys(seeds, positions)
    s = hash32(hash32(seeds & 0xFFFFFFFF) ^ ((seeds >> 32) & 0xFFFFFFFF))
    return hash32(s ^ hash32(positions + 0x9E3779B9))


def vocab_keys(vocab: int, device: torch.device | str) -> torch.Tensor:
    """Per-vocabulary-index hashes (computed once per engine and reused every step)."""
    return hash32(torch.arange(vocab, dtype=torch.int64, device=device) * 2 + 1)


def counter_uniform(keys: torch.Tensor, vkeys: torch.Tensor) -> torch.Tensor:
    """[B] row keys × [V] vocabulary keys → fp32 uniforms in (0, 1), 24 random bits each."""
    bits = hash32(keys[:, None] ^ vkeys[None, :]) >> 8
    return (bits.float() + 0.5) * (1.0 / (1 << 24))


def sample_counter(logits: torch.Tensor, params: SamplingParams, keys: torch.Tensor, vkeys: torch.Tensor,
                   temperature: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Counter-based `sample`: (token ids [B], their log-probs [B]) with Gumbel noise from
    `counter_uniform(keys, vkeys)`. `temperature` (a 0-d tensor) replaces params.temperature when
    given, so a captured CUDA graph can serve any temperature > 0. On CUDA, temperature-only
    sampling (no top-k / top-p) runs as three Triton launches (`kernels.triton_sample`)."""
    if _fused_applies(logits, params, temperature):
        from agentq.kernels.triton_sample import counter_sample
        assert temperature is not None
        return counter_sample(logits.float(), keys, vkeys, temperature, greedy=params.temperature == 0)
    logp = processed_logprobs(logits, params, temperature)
    if params.temperature == 0:
        tokens = logp.argmax(-1)
    else:
        gumbel = -torch.log(-torch.log(counter_uniform(keys, vkeys)))
        tokens = (logp + gumbel).argmax(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _triton_sampler():
    """`kernels.triton_sample` where Triton imports (and AGENTQ_FUSED_SAMPLER is not 0), else None."""
    import os

    from agentq.kernels._interp import HAVE_TRITON
    if not HAVE_TRITON or os.environ.get("AGENTQ_FUSED_SAMPLER", "1") == "0":
        return None
    from agentq.kernels import triton_sample
    return triton_sample


def _fused_applies(logits: torch.Tensor, params: SamplingParams, temperature: torch.Tensor | None) -> bool:
    """The fused Triton draw: CUDA logits, Triton importable, temperature-only sampling, a device
    temperature (what the decode runner passes). AGENTQ_FUSED_SAMPLER=0 keeps the torch ops."""
    return (logits.is_cuda and temperature is not None and params.top_p >= 1.0
            and not 0 < params.top_k < logits.shape[-1] and _triton_sampler() is not None)


def sample(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (token ids [B], their log-probs [B])."""
    logp = processed_logprobs(logits, params)
    if params.temperature == 0:
        tokens = logp.argmax(-1)
    else:
        u = torch.stack([torch.rand(logp.shape[-1], generator=g, device="cpu") for g in generators]).to(logp.device)
        gumbel = -torch.log(-torch.log(u.clamp(min=1e-20, max=1.0 - 1e-7)))
        tokens = (logp + gumbel).argmax(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
