"""QuRL's adaptive clipping range (ACR) + TIS cap (docs/algorithms.md, `qurl`). [SECONDARY: papernotes summary of
arXiv 2602.13953's eqs. 7–9; SOURCE: its abstract]

Decoupled PPO with three policies: behaviour μ (quantized engine), proximal π_old, current π_θ.
With r_pb = π_old/μ = exp(δ_t) (proximal-to-behaviour), R = π_θ/π_old and TIS's cap C, truncation
replaces r_pb by min(r_pb, C), i.e. multiplies it by the factor r = min(1, C / r_pb). ACR absorbs
that factor into the upper clip bound:

    min(r_pb, C) · min( R·A, clip(R, 1−ε, (1+ε)/r) · A ),     (1+ε)/r = (1+ε)·max(1, r_pb/C)

so the bound is the standard 1+ε wherever r_pb ≤ C (plain TIS there) and widens to (1+ε)·r_pb/C
only on truncated tokens (r_pb > C: μ under-weights the token relative to π_old, so TIS's cap
already shrank its weight and the plain clip would shrink its step a second time). It never
narrows: the interval is never empty. In the base loss's terms: ε_high,t = (1+ε)·max(1, r_pb/C) − 1 (a
per-token `clip_high`), w_t = min(r_pb, C) with C = 2, and [DESIGN] the dual clip c = 10 is kept on
top for A < 0. Worked numbers (ε = 0.2, C = 2): r_pb = 0.5 → 1.2, 1 → 1.2, 3 → 1.8.
(An earlier agentq version divided by r_pb itself, which narrowed the bound where r_pb > 1, down to
an empty interval; a second note reads the band as [r_pb − ε, r_pb + ε] on π_θ/μ; neither is
implemented.) UAQ (its update-aware quantization) belongs to the quantizer, not to this objective.
"""
from __future__ import annotations

import torch

from .base import PolicyBatch, masked_mean, ppo_dual_clip_loss, register_objective, token_delta
from .tis import TIS


def acr_clip_high(delta: torch.Tensor, clip_eps: float, is_cap: float) -> torch.Tensor:
    """ε_high,t = (1+ε)/r − 1 with r = min(1, C/r_pb), r_pb = exp(δ_t): (1+ε)·max(1, r_pb/C) − 1, elementwise."""
    return (1.0 + clip_eps) * torch.clamp(torch.exp(delta) / is_cap, min=1.0) - 1.0


@register_objective("qurl")
class QuRL(TIS):
    """TIS weight min(r_pb, C) plus the per-token upper clip (1+ε)·max(1, r_pb/C)."""

    defaults = {"is_cap": 2.0}

    @torch.no_grad()
    def prepare(self, batch: PolicyBatch) -> dict[str, float]:
        stats = super().prepare(batch)                                   # token_weight = min(r_pb, C)
        mask = batch.action_mask.bool()                                  # [B, L]
        # δ = 0 off action tokens, so the bound there is the plain ε (unused: masked out of the loss)
        batch.extra["clip_high"] = acr_clip_high(token_delta(batch), self.clip_eps,
                                                   float(self.p["is_cap"])).float()   # [B, L]
        stats["acr_upper_bound_mean"] = float(masked_mean(1.0 + batch.extra["clip_high"].double(), mask))
        return stats

    def policy_token_loss(self, logp: torch.Tensor, mb: PolicyBatch):
        if "clip_high" not in mb.extra:
            raise RuntimeError("QuRL.loss needs mb.extra['clip_high']: call prepare(batch) first")
        adv = mb.adv.view(-1, 1).expand_as(logp)                         # [B, L]
        return ppo_dual_clip_loss(logp, mb.old_logp, adv, self.clip_eps, self.dual_clip,
                                  clip_high=mb.extra["clip_high"])
