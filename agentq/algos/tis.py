"""Truncated importance sampling (Flash-RL "TIS"); docs/algorithms.md. [SOURCE: Flash-RL, verl]

Tokens are sampled by the quantized engine μ but the PPO ratio is anchored at the learner's π_old,
so each action token's clipped GRPO loss is reweighted by the (truncated) ratio π_old/μ:

    δ_t = clamp(log π_old(a_t) − log μ(a_t), ±20)
    w_t = min(exp(δ_t), C)      C = 2 (Flash-RL's "TIS-2"); no lower truncation

w_t is detached and multiplies u_t of the base loss (`losses.py`); observation/padding tokens get w_t = 0.
Example: δ = [0.3, −0.5, 1.2, 0, −2] → w = [1.349859, 0.606531, 2.0, 1.0, 0.135335].
"""
from __future__ import annotations

import torch

from .batch_view import BatchView
from .diagnostics import token_delta, weight_stats
from .losses import masked_mean
from .objective import GRPO, Bound, Prepared, register_objective


def truncated_is_weight(delta: torch.Tensor, cap: float) -> torch.Tensor:
    """w = min(exp(δ), C), elementwise. δ: any shape (already clamped to ±20)."""
    return torch.exp(delta).clamp(max=cap)


def tis_prepare(batch: BatchView, cap: float) -> Prepared:
    """TIS token weights w_t = min(e^δ_t, C) on action tokens (0 elsewhere) and their stats.

    Args:
        batch: a batch with `old_logp` filled.
        cap: C.
    Returns:
        `Prepared` with the weights and is_weight_mean / _max / _capped_frac.
    """
    mask = batch.action_mask.bool()                                 # [B, L]
    delta = token_delta(batch)                                      # [B, L] f64, 0 off actions
    w = truncated_is_weight(delta, cap)                             # [B, L]
    token_weight = torch.where(mask, w, torch.zeros_like(w)).float()
    stats = weight_stats("is_weight", token_weight, mask)
    stats["is_weight_capped_frac"] = float(masked_mean((torch.exp(delta) > cap).double(), mask))
    return Prepared(token_weight, stats=stats)


@register_objective("tis")
class TIS(GRPO):
    """GRPO × token TIS weight (rollout W8A8-KV8, learner unaligned or QAT)."""

    defaults = {"is_cap": 2.0}
    bounds = {"is_cap": Bound(0.0, inf_ok=True)}     # C ≤ 0 zeroes or flips the sign of every token's gradient
    row_local_prepare = True            # w_t from the token's own δ_t (the stats are logging only)

    @torch.no_grad()
    def prepare(self, batch: BatchView) -> Prepared:
        return tis_prepare(batch, float(self.params["is_cap"]))
