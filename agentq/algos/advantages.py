"""GRPO's group-relative advantages."""
from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Â_i = (R_i − mean_g R) / (std_g R + eps) within each group g of rollouts of the same task.

    std is the unbiased sample std (as verl). A group of one rollout has no baseline: Â = 0. A
    group whose rewards are all equal has Â = 0 exactly: float32's mean of G equal rewards is not
    always that reward (G = 8 rewards of −0.1 gave every episode Â = +0.0074, a uniform push).

    Args:
        rewards: [N] episode rewards.
        group_ids: [N] group of each episode (rollouts of one task share it).
    Returns:
        [N] float32 advantages.
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for g in torch.unique(group_ids):
        sel = group_ids == g
        r = rewards[sel].float()
        if r.numel() < 2 or bool((r == r[0]).all()):   # no baseline, or no signal: Â = 0
            continue
        adv[sel] = (r - r.mean()) / (r.std() + eps)
    return adv
