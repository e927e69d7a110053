"""QuRL's adaptive clipping range (ACR) + TIS cap, methods §3.4. [SECONDARY: papernotes summary of
arXiv 2602.13953; SOURCE: its abstract]

Decoupled PPO with three policies: behaviour μ (quantized engine), proximal π_old, current π_θ.
With r_pb = π_old/μ = exp(δ_t) (proximal-to-behaviour) and R = π_θ/π_old, the per-token objective is

    min(r_pb, C) · min( R·A, clip(R, 1−ε, (1+ε)/r_pb) · A )

i.e. the upper clip bound is divided by r_pb, so the bound really constrains π_θ/μ ≤ 1+ε: it is
relaxed where the quantized sampler under-weights a token (r_pb < 1), undoing TIS's over-clipping
of positive-advantage tokens. In §1.4's terms: ε_high,t = (1+ε)/r_pb − 1 (a per-token `clip_high`),
w_t = min(r_pb, C) with C = 2, and [DESIGN] the dual clip c = 10 is kept on top for A < 0.
When (1+ε)/r_pb < 1−ε (r_pb > (1+ε)/(1−ε) = 1.5) the clip interval is empty and the upper bound
wins (torch.clamp's rule), so the clipped ratio is (1+ε)/r_pb.
(A second note reads the band as [r_pb − ε, r_pb + ε] on π_θ/μ; not implemented.) UAQ (§2.4)
belongs to the quantizer, not to this objective.
"""
from __future__ import annotations

import torch

from .base import PolicyBatch, masked_mean, ppo_dual_clip_loss, register_objective, token_delta
from .tis import TIS


def acr_clip_high(delta: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """ε_high,t = (1+ε)/r_pb − 1 = (1+ε)·exp(−δ_t) − 1, elementwise."""
    return (1.0 + clip_eps) * torch.exp(-delta) - 1.0


@register_objective("qurl")
class QuRL(TIS):
    """TIS weight min(r_pb, C) plus the per-token upper clip (1+ε)/r_pb."""

    defaults = {"is_cap": 2.0}

    @torch.no_grad()
    def prepare(self, batch: PolicyBatch) -> dict[str, float]:
        stats = super().prepare(batch)                                   # token_weight = min(r_pb, C)
        mask = batch.action_mask.bool()                                  # [B, L]
        # δ = 0 off action tokens, so the bound there is the plain ε (unused: masked out of the loss)
        batch.extra["clip_high"] = acr_clip_high(token_delta(batch), self.clip_eps).float()   # [B, L]
        stats["acr_upper_bound_mean"] = float(masked_mean(1.0 + batch.extra["clip_high"].double(), mask))
        return stats

    def policy_token_loss(self, logp: torch.Tensor, mb: PolicyBatch):
        if "clip_high" not in mb.extra:
            raise RuntimeError("QuRL.loss needs mb.extra['clip_high']: call prepare(batch) first")
        adv = mb.adv.view(-1, 1).expand_as(logp)                         # [B, L]
        return ppo_dual_clip_loss(logp, mb.old_logp, adv, self.clip_eps, self.dual_clip,
                                  clip_high=mb.extra["clip_high"])
