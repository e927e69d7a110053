"""QuRL's adaptive clipping range (ACR) + TIS cap (docs/algorithms.md). [SECONDARY: papernotes summary of
arXiv 2602.13953's eqs. 7–9; SOURCE: its abstract]

Decoupled PPO with three policies: behaviour μ (quantized engine), proximal π_old, current π_θ.
With r_pb = π_old/μ = exp(δ_t) (proximal-to-behaviour), R = π_θ/π_old and TIS's cap C, truncation
replaces r_pb by min(r_pb, C), i.e. multiplies it by the factor r = min(1, C / r_pb). ACR absorbs
that factor into the upper clip bound:

    min(r_pb, C) · min( R·A, clip(R, 1−ε, (1+ε)/r) · A ),     (1+ε)/r = (1+ε)·max(1, r_pb/C)

so the bound is the standard 1+ε wherever r_pb ≤ C (plain TIS there) and widens to (1+ε)·r_pb/C
only on truncated tokens (r_pb > C: μ under-weights the token relative to π_old, so TIS's cap
already shrank its weight and the plain clip would shrink its step a second time). It never
narrows: the interval is never empty. In the base loss's terms (`losses.py`): ε_high,t = (1+ε)·max(1, r_pb/C) − 1 (a
per-token `clip_high`), w_t = min(r_pb, C) with C = 2, and [DESIGN] the dual clip c = 10 is kept on
top for A < 0. Worked numbers (ε = 0.2, C = 2): r_pb = 0.5 → 1.2, 1 → 1.2, 3 → 1.8.
(An earlier agentq version divided by r_pb itself, which narrowed the bound where r_pb > 1, down to
an empty interval; a second note reads the band as [r_pb − ε, r_pb + ε] on π_θ/μ; neither is
implemented.) UAQ belongs to the quantizer, not to this objective.
"""
from __future__ import annotations

import torch

from .batch_view import BatchView
from .diagnostics import token_delta
from .losses import masked_mean, ppo_dual_clip_loss
from .objective import GRPO, Bound, Prepared, require_old_logp, register_objective
from .tis import tis_prepare


def acr_clip_high(delta: torch.Tensor, clip_eps: float, is_cap: float) -> torch.Tensor:
    """ε_high,t = (1+ε)/r − 1 with r = min(1, C/r_pb), r_pb = exp(δ_t): (1+ε)·max(1, r_pb/C) − 1, elementwise."""
    return (1.0 + clip_eps) * torch.clamp(torch.exp(delta) / is_cap, min=1.0) - 1.0


@register_objective("qurl")
class QuRL(GRPO):
    """TIS weight min(r_pb, C) plus the per-token upper clip (1+ε)·max(1, r_pb/C)."""

    defaults = {"is_cap": 2.0}
    bounds = {"is_cap": Bound(0.0)}     # a TIS cap (and the bound's divisor)
    row_local_prepare = True            # TIS weight and upper clip of each token from its own δ_t

    @torch.no_grad()
    def prepare(self, batch: BatchView) -> Prepared:
        cap = float(self.params["is_cap"])
        prep = tis_prepare(batch, cap)                                   # token_weight = min(r_pb, C)
        mask = batch.action_mask.bool()                                  # [B, L]
        # δ = 0 off action tokens, so the bound there is the plain ε (unused: masked out of the loss)
        clip_high = acr_clip_high(token_delta(batch), self.clip_eps, cap).float()   # [B, L]
        prep.extra["clip_high"] = clip_high
        prep.stats["acr_upper_bound_mean"] = float(masked_mean(1.0 + clip_high.double(), mask))
        return prep

    def policy_token_loss(self, logp: torch.Tensor, mb: BatchView
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if "clip_high" not in mb.extra:
            raise RuntimeError("QuRL.loss needs mb.extra['clip_high']: attach prepare(batch)'s result first "
                               "(PolicyBatch.weighted)")
        adv = mb.adv.view(-1, 1).expand_as(logp)                         # [B, L]
        return ppo_dual_clip_loss(logp, require_old_logp(mb), adv, self.clip_eps, self.dual_clip,
                                  clip_high=mb.extra["clip_high"])
