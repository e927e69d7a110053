"""The PPO policy term, the KL penalty and the masked means that aggregate per-token terms.

Per token: u_t the PPO dual-clip loss and kl_t the k3 penalty to the reference policy. The
minibatch loss (`GRPO.loss`) is

    L = Σ_t m_t · w_t · u_t / Σ_t m_t  +  β · Σ_t m_t · kl_t / Σ_t m_t       (loss_agg = token_mean)

with loss_agg = seq_mean each trajectory's token mean counts once (mean over trajectories), so long
trajectories do not outweigh short ones (verl's seq-mean-token-mean); a trajectory split over several
rows (`traj_id`) is one unit (`trajectory_tokens`, `trajectory_mean`).
"""
from __future__ import annotations

import torch

LOGRATIO_CLAMP = 20.0
LOSS_AGGS = ("token_mean", "seq_mean")


def log_ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """clamp(a − b, −20, 20): the log-ratio guard every estimator uses."""
    return (a - b).clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ mask·x / Σ mask (0 when the mask is empty). Masked-out entries may hold anything (NaN too)."""
    return torch.where(mask.bool(), x * mask, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1.0)


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean of x over masked tokens ([B]) and the token counts n ([B]); mean = 0 when n = 0."""
    n = mask.sum(dim=1)                                                  # [B]
    s = torch.where(mask.bool(), x, torch.zeros_like(x)).sum(dim=1)      # [B]
    return s / n.clamp(min=1.0), n


def trajectory_tokens(mask: torch.Tensor, traj_id: torch.Tensor | None) -> torch.Tensor:
    """[B]: the masked tokens of each row's trajectory, over the rows of `mask` [B, L] (rows sharing
    a `traj_id` [B] are one trajectory; None: each row is one)."""
    n = mask.sum(dim=1)                                                  # [B]
    if traj_id is None:
        return n
    _, inv = torch.unique(traj_id.to(n.device), return_inverse=True)    # [B] dense trajectory index
    per_traj = torch.zeros(n.shape[0], dtype=n.dtype, device=n.device).index_add_(0, inv, n)
    return per_traj[inv]


def trajectory_mean(row_sums: torch.Tensor, n: torch.Tensor, traj_n: torch.Tensor) -> torch.Tensor:
    """seq_mean: each trajectory's token mean, averaged over the trajectories with a token.

    row_sums [B]: Σ over a row's masked tokens; n [B]: its masked tokens; traj_n [B]: its
    trajectory's (`trajectory_tokens`). Row i adds row_sums_i / traj_n_i to the numerator and
    n_i / traj_n_i to the denominator, so a trajectory's rows add up to one unit. Given a
    minibatch's traj_n, a subset of its rows (a micro-batch) has n_i / traj_n_i summed as its units
    (`GRPO.agg_units`), and its value × its share of the minibatch's units is its part of the
    minibatch's mean: accumulation is exact even where a trajectory's rows span micro-batches.
    0 when no row has a token.
    """
    traj_n = traj_n.to(row_sums.dtype).clamp(min=1.0)
    units = (n.to(row_sums.dtype) / traj_n).sum()
    # units is 0 only when every row_sums is 0 too; a partial trajectory's units may be < 1
    return (row_sums / traj_n).sum() / units.clamp(min=torch.finfo(row_sums.dtype).tiny)


def ppo_dual_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float,
                       dual_clip: float, clip_high: float | torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss with dual clip on negative advantages.

        r  = exp(logp − old_logp)
        u  = max(−A·r, −A·clip(r, 1−ε, 1+ε_high))
        u  = min(u, −A·c)   where A < 0
    `clip_high` (default ε) may be a per-token tensor (QuRL's adaptive upper bound). When
    1+ε_high < 1−ε, clip(·) returns 1+ε_high (torch.clamp's rule: the upper bound wins).
    Returns (u [B, L], is_clipped [B, L] bool, is_dual_clipped [B, L] bool, ratio [B, L]).
    """
    ratio = torch.exp(log_ratio(logp, old_logp))
    hi = 1.0 + (clip_eps if clip_high is None else clip_high)
    clipped_ratio = torch.minimum(torch.clamp(ratio, min=1.0 - clip_eps),
                                  torch.as_tensor(hi, dtype=ratio.dtype, device=ratio.device))
    u1 = -adv * ratio
    u2 = -adv * clipped_ratio
    u = torch.maximum(u1, u2)
    clipped = u2 > u1
    neg = adv < 0
    cap = -adv * dual_clip
    dual = neg & (u > cap)
    u = torch.where(dual, cap, u)
    return u, clipped, dual, ratio


def kl_penalty_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """GRPO's low-variance KL to the reference: κ = clamp(ref − logp, ±20); clamp(e^κ − κ − 1, −10, 10)."""
    kappa = log_ratio(ref_logp, logp)
    return torch.clamp(torch.exp(kappa) - kappa - 1.0, -10.0, 10.0)
