"""Adaptive importance sampling (AIS); docs/algorithms.md.

[SOURCE: arXiv 2605.13907 abstract] a per-batch mixing coefficient λ ∈ [0, 1], built from three live
diagnostics (weight reliability, divergence severity, variance amplification), interpolates between
the uncorrected and the fully IS-weighted gradient. [PAPER-ABSTRACT, InterQ-RL] clip C = 5 + a gate.
[DESIGN] The formulas below are agentq's own (the paper's were unavailable). Over the N action
tokens of the whole batch (computed once in `prepare`, before the minibatch split):

    w̄_t = min(exp(δ_t), C)                                    C = 5
    Rel = (Σ w̄_t)² / (N Σ w̄_t²)                              ESS fraction ∈ (0, 1]
    Sev = 1 − exp(−K3 / k_ref)                                 K3 = mean_t k3_t, k_ref = 0.05
    Amp = mean(w̄_t² Â_t²) / mean(Â_t²)                        second-moment inflation (1 if all Â = 0)
    g   = 1 if K3 ≥ k_on else 0                                 k_on = 1e-4
    λ   = g · Sev · Rel · min(1, 1/Amp)
    w_t = (1 − λ) + λ · w̄_t                                    detached

Example (δ = [0.3, −0.5, 1.2, 0, −2], Â = [1, 1, −1, −1, 1]): Rel = 0.577757, K3 = 0.482368,
Amp = 2.846298, Sev ≈ 0.999935, λ = 0.202972, w = [1.071012, 0.920137, 1.470919, 1.0, 0.824497].
"""
from __future__ import annotations

import math

import torch

from .batch_view import BatchView
from .diagnostics import k3, token_delta, weight_stats
from .objective import GRPO, Bound, Prepared, register_objective
from .tis import truncated_is_weight


def ais_lambda(w_bar: torch.Tensor, k3_tok: torch.Tensor, adv_tok: torch.Tensor, k_ref: float,
               k_on: float) -> dict[str, float]:
    """λ and its three factors from the N action tokens of a batch. All inputs [N] (1-D)."""
    n = w_bar.numel()
    if n == 0:
        return {"ais_lambda": 0.0, "ais_reliability": float("nan"), "ais_severity": 0.0,
                "ais_amplification": float("nan"), "ais_gate": 0.0}
    reliability = float(w_bar.sum() ** 2 / (n * (w_bar ** 2).sum()))   # ESS / N
    K3 = float(k3_tok.mean())
    severity = 1.0 - math.exp(-K3 / k_ref)
    adv2 = float((adv_tok ** 2).mean())
    amplification = float((w_bar ** 2 * adv_tok ** 2).mean()) / adv2 if adv2 > 0 else 1.0
    gate = 1.0 if K3 >= k_on else 0.0
    lam = gate * severity * reliability * min(1.0, 1.0 / amplification)
    return {"ais_lambda": lam, "ais_reliability": reliability, "ais_severity": severity,
            "ais_amplification": amplification, "ais_gate": gate}


@register_objective("ais")
class AIS(GRPO):
    """GRPO × AIS weight (1 − λ) + λ·min(e^δ, C) with one λ per batch."""

    defaults = {"is_cap": 5.0, "k_ref": 0.05, "k_on": 1e-4}
    # k_ref scales K3 in Sev: ≤ 0 makes λ < 0 or undefined; K3 ≥ 0, so k_on ≤ 0 is a gate always open
    bounds = {"is_cap": Bound(0.0, inf_ok=True), "k_ref": Bound(0.0), "k_on": Bound(0.0, strict=False)}
    row_local_prepare = False           # one λ from all the batch's action tokens weighs every row
    idle_metric = "ais_gate"            # closed (K3 < k_on) at every step: GRPO's update

    @torch.no_grad()
    def prepare(self, batch: BatchView) -> Prepared:
        mask = batch.action_mask.bool()                                  # [B, L]
        delta = token_delta(batch)                                       # [B, L] f64
        w_bar = truncated_is_weight(delta, float(self.params["is_cap"]))      # [B, L]
        adv_tok = batch.adv.double().view(-1, 1).expand_as(delta)        # [B, L] Â broadcast
        stats = ais_lambda(w_bar[mask], k3(delta)[mask], adv_tok[mask],
                           float(self.params["k_ref"]), float(self.params["k_on"]))
        lam = stats["ais_lambda"]
        w = (1.0 - lam) + lam * w_bar                                    # [B, L]
        token_weight = torch.where(mask, w, torch.zeros_like(w)).float()
        stats.update(weight_stats("is_weight", token_weight, mask))
        return Prepared(token_weight, stats=stats)
