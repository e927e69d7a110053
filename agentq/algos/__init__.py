"""Training objectives: functions of tensors plus a small registry keyed by `algo.objective`.

Modules, bottom up: `batch_view` (the `BatchView` protocol: what objectives read from a batch;
the learner's `PolicyBatch` satisfies it, algos never imports the learner), `advantages` (GRPO),
`losses` (PPO dual clip, k3 KL penalty, masked means), `diagnostics` (δ, k3, mismatch metrics),
`objective` (the `Objective` protocol, `GRPO`, `Prepared`, the registry), then one module per
objective extending `GRPO`: tis, ais, qurl, tbpo, interq (importing this package registers them).
Formulas and provenance: docs/algorithms.md.
"""
from .advantages import grpo_advantages
from .batch_view import BatchView
from .diagnostics import k3, mismatch_metrics, quantile, token_delta, weight_stats
from .losses import kl_penalty_k3, log_ratio, masked_mean, ppo_dual_clip_loss, sequence_mean
from .objective import (GRPO, Bound, Choice, Flag, Objective, Prepared, idle_correction_note, make_objective,
                        objective_defaults, objective_names, register_objective, require_old_logp)
from . import tis, ais, qurl, tbpo, interq  # noqa: E402,F401  (registration side effect)
from .interq import interq_retention, prefix_retention

__all__ = ["BatchView", "Bound", "Choice", "Flag", "GRPO", "Objective", "Prepared", "grpo_advantages", "idle_correction_note",
           "interq_retention", "k3",
           "kl_penalty_k3", "log_ratio", "make_objective", "masked_mean", "mismatch_metrics", "objective_defaults", "objective_names",
           "ppo_dual_clip_loss", "prefix_retention", "quantile", "register_objective", "require_old_logp", "sequence_mean",
           "token_delta", "weight_stats"]
