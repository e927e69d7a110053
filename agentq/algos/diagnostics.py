"""Rollout–learner mismatch diagnostics: δ, k3 and the per-batch numbers every objective logs."""
from __future__ import annotations

import torch

from .batch_view import BatchView
from .losses import log_ratio


def k3(delta: torch.Tensor) -> torch.Tensor:
    """k3 = exp(δ) − 1 − δ ≥ 0 (Schulman's low-variance KL estimator)."""
    return torch.expm1(delta) - delta


def token_delta(batch: BatchView) -> torch.Tensor:
    """δ_t = clamp(old_logp − rollout_logp, ±20) on action tokens, 0 elsewhere; [B, L] float64, no grad.

    float64 because k3 = expm1(δ) − δ cancels catastrophically for small δ in float32 (relative
    error ≈ 2·eps/|δ|), and the InterQ-RL prefix sums and ratios of such values.
    """
    if batch.old_logp is None:
        raise ValueError("this objective needs batch.old_logp (π_old log-probs); in bypass mode set "
                         "old_logp from the first minibatch forward before calling prepare()")
    mask = batch.action_mask.bool()
    delta = log_ratio(batch.old_logp.detach().double(), batch.rollout_logp.detach().double())
    return torch.where(mask, delta, torch.zeros_like(delta))


def quantile(x: torch.Tensor, q: float) -> float:
    """Linear-interpolation quantile of a 1-D tensor (as numpy's default); nan when x is empty.
    Sort-based, so it has no size limit (torch.quantile refuses > 2^24 elements)."""
    if x.numel() == 0:
        return float("nan")
    xs = torch.sort(x.detach().flatten().double()).values
    pos = q * (xs.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, xs.numel() - 1)
    return float(xs[lo] + (pos - lo) * (xs[hi] - xs[lo]))


def weight_stats(prefix: str, w: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """`<prefix>_mean`, `<prefix>_max` of a per-token weight over action tokens (floats)."""
    sel = w.detach()[mask.bool()].double()
    if sel.numel() == 0:
        return {f"{prefix}_mean": float("nan"), f"{prefix}_max": float("nan")}
    return {f"{prefix}_mean": float(sel.mean()), f"{prefix}_max": float(sel.max())}


@torch.no_grad()
def mismatch_metrics(batch: BatchView) -> dict[str, float | list[float]]:
    """Rollout–learner mismatch diagnostics, the same for every objective (docs/algorithms.md).

    With δ_t = clamp(old − rollout, ±20) over action tokens only:
        k3            mean_t (e^δ − 1 − δ)            ≈ KL(μ ‖ π_old) per token (verl rollout_corr/k3_kl)
        k3_by_turn    [K3 of turn s=1, s=2, …]       element j is turn s = j+1; nan for a turn with no
                                                      action token in the batch
        dlogp_abs_mean / _p99 / _max                 of |δ_t|
    Empty when the batch has no old_logp (nothing to compare yet).
    """
    if batch.old_logp is None:
        return {}
    mask = batch.action_mask.bool()                       # [B, L]
    delta = token_delta(batch)                            # [B, L] f64, 0 off action tokens
    k3_t = k3(delta)                                      # [B, L]
    n_tok = int(mask.sum())
    abs_d = delta.abs()[mask]                             # [N]
    seg = torch.where(mask, batch.seg_id.long(), torch.zeros_like(batch.seg_id.long()))
    n_turns = int(seg.max()) if n_tok else 0
    # per-turn sums by scatter over the turn index (column 0 collects nothing: non-action tokens are 0)
    k3_sum = torch.zeros(n_turns + 1, dtype=torch.float64, device=delta.device).index_add_(0, seg[mask], k3_t[mask])
    cnt = torch.zeros(n_turns + 1, dtype=torch.float64, device=delta.device).index_add_(
        0, seg[mask], torch.ones_like(k3_t[mask]))
    by_turn = torch.where(cnt > 0, k3_sum / cnt.clamp(min=1.0), torch.full_like(cnt, float("nan")))[1:]
    return {
        "k3": float(k3_t[mask].mean()) if n_tok else float("nan"),
        "k3_by_turn": [float(v) for v in by_turn],
        "dlogp_abs_mean": float(abs_d.mean()) if n_tok else float("nan"),
        "dlogp_abs_p99": quantile(abs_d, 0.99),
        "dlogp_abs_max": float(abs_d.max()) if n_tok else float("nan"),
    }
