"""TBPO (QaRL's trust-band policy optimization); docs/algorithms.md.

[SOURCE: arXiv 2604.07853 abstract] a sequence-level objective with dual clipping for negative
samples, against the "error tokens" of quantized rollouts. [SECONDARY: AI-written paper digests,
an unidentified public verl fork with loss_mode="tbpo"] a whole response is one action; a sequence
geometric-mean ratio; a capped sequence mismatch weight (`seq_tis_imp_ratio_cap` = 2.0); a tiny
GSPO-style band for positive advantages (`seq_clip_ratio_high` = 4e-4), a two-sided band for
negative ones (`neg_seq_clip_ratio_low/high` = 3e-4 / 7e-4); sequences leaving the band give no
gradient. **The exact band algebra is unverified; the one below is agentq's [DESIGN]:**

For each row i with n_i ≥ 1 action tokens and advantage A_i:

    r_i = exp(clamp(mean_t(log π_θ − log π_old), ±20))                 sequence ratio (GSPO)
    w_i = min(exp(mean_t δ_t), C)   δ_t = clamp(old − rollout, ±20), C = 2   detached, in prepare
    A ≥ 0:  u_i = max(−A·r_i, −A·min(r_i, 1+ε⁺))                       PPO clip, upper edge only
    A < 0:  u_i = min(max(−A·r_i, −A·max(r_i, 1−ε⁻_lo)), −A·(1+ε⁻_hi))  = −A·clip(r_i, 1−ε⁻_lo, 1+ε⁻_hi)
            (the band's upper edge is the dual clip; the global dual_clip c also applies if smaller)
    L_pg = Σ_i n_i·w_i·u_i / Σ_i n_i                                   (loss_agg = token_mean)
         or mean_i w_i·u_i  over rows with n_i ≥ 1                     (loss_agg = seq_mean, GSPO)
    (seq_mean with `traj_id`: each trajectory's Σ_i n_i·w_i·u_i / Σ_i n_i over its rows, averaged
    over trajectories, the base loss's seq_mean of w_i·u_i on every token of row i)

[DESIGN] token_mean (the preset) is the base loss's aggregation (`losses.py`); seq_mean is GSPO's. `algo.loss_agg` picks
it for every objective, and the learner weights micro-batches by `agg_units`, so both are exact
under gradient accumulation.

So a negative sequence gets gradient only inside [1−ε⁻_lo, 1+ε⁻_hi]; a positive one only below
1+ε⁺. `clip_eps` is not used (the bands replace it). "Sequence" = one row: a whole trajectory in
the one-row layout, one turn's response in the step-independent layout. [DESIGN] The KL term
is the base loss's k3, unweighted, aggregated by loss_agg like every objective's. Stats: clip_frac / dual_clip_frac / ratio_mean are fractions
and means over sequences, not tokens.
"""
from __future__ import annotations

import torch

from .batch_view import BatchView
from .diagnostics import token_delta
from .losses import LOGRATIO_CLAMP, sequence_mean, trajectory_mean
from .objective import GRPO, Bound, Prepared, require_old_logp, register_objective, traj_action_tokens


def trust_band_loss(seq_ratio: torch.Tensor, adv: torch.Tensor, pos_high: float, neg_low: float,
                    neg_high: float, dual_clip: float = float("inf")
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence TBPO loss u [B] with (is_clipped, is_dual_clipped) [B] bool. seq_ratio, adv: [B]."""
    neg = adv < 0
    hi = torch.where(neg, torch.full_like(seq_ratio, 1.0 + neg_high), torch.full_like(seq_ratio, 1.0 + pos_high))
    lo = torch.where(neg, torch.full_like(seq_ratio, 1.0 - neg_low), torch.zeros_like(seq_ratio))
    u1 = -adv * seq_ratio                                                # unclipped
    u2 = -adv * torch.minimum(torch.maximum(seq_ratio, lo), hi)          # band-clipped
    u = torch.maximum(u1, u2)
    clipped = u2 > u1
    cap = -adv * min(dual_clip, 1.0 + neg_high)                          # negatives: band top = dual clip
    dual = neg & (u > cap)
    u = torch.where(dual, cap, u)
    return u, clipped, dual


@register_objective("tbpo")
class TBPO(GRPO):
    """Sequence-level trust band (GSPO ratio) × capped sequence mismatch weight."""

    defaults = {"seq_clip_ratio_high": 4e-4, "neg_seq_clip_ratio_low": 3e-4, "neg_seq_clip_ratio_high": 7e-4,
                "seq_tis_imp_ratio_cap": 2.0}
    # a negative band width puts the band's edge on the wrong side of r = 1 (no gradient at r = 1)
    bounds = {"seq_clip_ratio_high": Bound(0.0, strict=False), "neg_seq_clip_ratio_low": Bound(0.0, strict=False),
              "neg_seq_clip_ratio_high": Bound(0.0, strict=False), "seq_tis_imp_ratio_cap": Bound(0.0, inf_ok=True)}
    row_local_prepare = True            # w_i from row i's own mean δ

    @torch.no_grad()
    def prepare(self, batch: BatchView) -> Prepared:
        mask = batch.action_mask.float()                                 # [B, L]
        mean_delta, n = sequence_mean(token_delta(batch), mask.double())  # [B], [B]
        w_seq = torch.exp(mean_delta).clamp(max=float(self.params["seq_tis_imp_ratio_cap"]))   # [B]
        token_weight = (w_seq.view(-1, 1) * mask.double()).float()      # [B, L] broadcast, 0 off actions
        has = n > 0
        stats = {"is_weight_mean": float(w_seq[has].mean()) if has.any() else float("nan"),
                 "is_weight_max": float(w_seq[has].max()) if has.any() else float("nan")}
        return Prepared(token_weight, {"seq_weight": w_seq.float()}, stats)   # seq_weight [B]

    def stat_units(self, mb: BatchView) -> dict[str, float]:
        """clip_frac, dual_clip_frac and ratio_mean are over sequences (rows with an action token)."""
        n = float((mb.action_mask.sum(dim=1) > 0).sum())
        return dict.fromkeys(("clip_frac", "dual_clip_frac", "ratio_mean"), n)

    def loss(self, logp: torch.Tensor, mb: BatchView) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = mb.action_mask.float()                                    # [B, L]
        mean_lr, n = sequence_mean(logp - require_old_logp(mb), mask)         # [B] grad flows via logp
        seq_ratio = torch.exp(mean_lr.clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP))   # [B]
        u, clipped, dual = trust_band_loss(seq_ratio, mb.adv.to(seq_ratio.dtype),
                                           float(self.params["seq_clip_ratio_high"]),
                                           float(self.params["neg_seq_clip_ratio_low"]),
                                           float(self.params["neg_seq_clip_ratio_high"]), self.dual_clip)
        if "seq_weight" in mb.extra:
            w = mb.extra["seq_weight"].detach().to(u.dtype)              # [B]
        else:                                                            # prepare() not run: no correction
            w = torch.ones_like(u)
        has = (n > 0).to(u.dtype)                                        # [B] rows with an action token
        if self.loss_agg == "seq_mean":       # a row's w·u on each of its tokens, GRPO's seq_mean of that
            pg_loss = trajectory_mean(n * w * u, n, traj_action_tokens(mb))
        else:
            pg_loss = (n * w * u).sum() / n.sum().clamp(min=1.0)
        kl = self.kl_term(logp, mb)
        loss = pg_loss + self.kl_coef * kl
        with torch.no_grad():
            n_seq = has.sum().clamp(min=1.0)
            stats = {"pg_loss": pg_loss.detach(), "kl": kl.detach(),
                     "clip_frac": (has * clipped.to(u.dtype)).sum() / n_seq,
                     "dual_clip_frac": (has * dual.to(u.dtype)).sum() / n_seq,
                     "ratio_mean": (has * seq_ratio.detach()).sum() / n_seq}
        return loss, stats
