"""Training objectives: pure functions of tensors plus a small registry keyed by `algo.objective`.

Importing this package registers every objective module listed below:
grpo (base), tis, ais, qurl, tbpo, interq. Formulas and provenance: docs/algorithms.md.
"""
from .base import (Objective, PolicyBatch, grpo_advantages, k3, kl_penalty_k3, log_ratio, make_objective,
                   masked_mean, mismatch_metrics, objective_names, ppo_dual_clip_loss, register_objective,
                   token_delta)
from . import tis, ais, qurl, tbpo, interq  # noqa: E402,F401  (registration side effect)
from .interq import interq_retention, prefix_retention

__all__ = ["Objective", "PolicyBatch", "grpo_advantages", "interq_retention", "k3", "kl_penalty_k3", "log_ratio",
           "make_objective", "masked_mean", "mismatch_metrics", "objective_names", "ppo_dual_clip_loss",
           "prefix_retention", "register_objective", "token_delta"]
