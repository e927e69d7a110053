"""fp32 sampling with exact behaviour log-probs.

logits/T → optional top-k / top-p truncation → log_softmax (renormalised over what is kept) →
sample with the episode's own generator (Gumbel-max, so a row's draw does not depend on the
other rows in the batch) → the log-prob of the sampled token under that same distribution.
"""
from __future__ import annotations

import torch

from agentq.rollout.backend import SamplingParams


def processed_logprobs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """[B, V] fp32 logits → log-probs of the distribution actually sampled from."""
    x = logits.float()
    if p.temperature > 0:
        x = x / p.temperature
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


def sample(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]):
    """Returns (token ids [B], their log-probs [B])."""
    logp = processed_logprobs(logits, params)
    if params.temperature == 0:
        tokens = logp.argmax(-1)
    else:
        u = torch.stack([torch.rand(logp.shape[-1], generator=g, device="cpu") for g in generators]).to(logp.device)
        gumbel = -torch.log(-torch.log(u.clamp(min=1e-20, max=1.0 - 1e-7)))
        tokens = (logp + gumbel).argmax(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
