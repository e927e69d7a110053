"""The objective seam, GRPO (the base every objective extends) and the registry.

An objective is a small class registered by name (`algo.objective` in the config):

* `prepare(batch)` runs once per RL step on the whole batch, before any minibatch split or
  shuffle, and returns `Prepared`: the detached per-token weights w_t (IS weights, InterQ-RL
  retention, ...), any per-row tensors its loss reads, and diagnostics. It does not change the
  batch; the caller attaches the weights (`PolicyBatch.weighted`).
* `loss(logp, mb)` returns the scalar loss of a minibatch and detached diagnostics (the formula:
  `losses.py`).
* `row_local_prepare` says whether `prepare`'s weights and per-row tensors of a row depend only on
  that row (its tokens, log-probs, advantage): then `prepare` on any subset of rows gives those
  rows what it gives them on the whole batch, and the learner may run it per micro-batch, on π_old
  taken from the training forward itself (`trainer.old_logp=bypass`). A subclass that overrides
  `prepare` without declaring it is taken as not row-local (the safe side).

Formulas and worked numbers: docs/algorithms.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from .batch_view import BatchView
from .losses import LOSS_AGGS, kl_penalty_k3, masked_mean, ppo_dual_clip_loss, rows_mean, sequence_mean


@dataclass
class Prepared:
    """What an objective computes once per batch, before the minibatch split."""

    token_weight: torch.Tensor                  # [B, L] detached w_t, 0 off action tokens
    extra: dict[str, torch.Tensor] = field(default_factory=dict)   # per-row tensors its loss reads
    stats: dict[str, float] = field(default_factory=dict)          # logged diagnostics


class Objective(Protocol):
    """What the learner and the trainer call (every registered objective is one)."""

    name: str
    row_local_prepare: bool

    def prepare(self, batch: BatchView) -> Prepared:
        """Per-token weights and diagnostics of a whole batch.

        Args:
            batch: the step's batch with `old_logp` (and `ref_logp`) filled.
        Returns:
            `Prepared` (weights [B, L], per-row extras, stats); the batch is not changed.
        """
        ...

    def loss(self, logp: torch.Tensor, mb: BatchView) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch loss.

        Args:
            logp: [B, L] log-probs of the current policy (with grad).
            mb: minibatch rows of the batch, weights attached.
        Returns:
            (scalar loss, detached diagnostics by name).
        """
        ...

    def agg_units(self, mb: BatchView) -> float:
        """How many units (action tokens or rows) the loss averages over in `mb`."""
        ...


class GRPO:
    """GRPO with PPO dual-clip and k3 KL; token weight 1. Other objectives extend it, changing
    `prepare` (weights) and, where the method needs it, `policy_token_loss` or `loss`.

    Extra parameters live in the class attribute `defaults` (name → default value); `self.params`
    holds the merged values. Unknown names raise with the valid list.
    """

    name = "grpo"
    defaults: dict[str, Any] = {}
    row_local_prepare = True            # weight 1 on each action token: nothing crosses rows

    def __init_subclass__(cls, **kw: Any):
        super().__init_subclass__(**kw)
        # a new `prepare` may couple rows (a batch statistic); only its author can say it does not
        if "prepare" in cls.__dict__ and "row_local_prepare" not in cls.__dict__:
            cls.row_local_prepare = False

    def __init__(self, clip_eps: float = 0.2, dual_clip: float = 10.0, kl_coef: float = 0.001,
                 loss_agg: str = "token_mean", **params: Any):
        self.clip_eps = float(clip_eps)
        self.dual_clip = float(dual_clip)
        self.kl_coef = float(kl_coef)
        if loss_agg not in LOSS_AGGS:
            raise ValueError(f"loss_agg={loss_agg!r}; valid: {list(LOSS_AGGS)}")
        self.loss_agg = loss_agg
        unknown = set(params) - set(self.param_names())
        if unknown:
            raise ValueError(f"objective {self.name!r} got unknown parameter(s) {sorted(unknown)}; valid: "
                             f"{sorted(self.param_names() + ['clip_eps', 'dual_clip', 'kl_coef', 'loss_agg'])}")
        self.params: dict[str, Any] = {**self.defaults, **params}

    @classmethod
    def param_names(cls) -> list[str]:
        """Extra parameters this objective accepts (besides clip_eps, dual_clip, kl_coef, loss_agg)."""
        return list(cls.defaults)

    def prepare(self, batch: BatchView) -> Prepared:
        """Weight 1 on every action token (plain GRPO)."""
        return Prepared(batch.action_mask.float())

    def aggregate(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A [B, L] per-token term → the minibatch scalar, by `loss_agg`."""
        if self.loss_agg == "token_mean":
            return masked_mean(x, mask)
        return rows_mean(*sequence_mean(x, mask))

    def agg_units(self, mb: BatchView) -> float:
        """What `aggregate` averages over: action tokens (token_mean) or trajectories with one
        (seq_mean). A micro-batch's loss counts in its minibatch by its share of these units."""
        n = mb.action_mask.sum(dim=1)
        return float(n.sum()) if self.loss_agg == "token_mean" else float((n > 0).sum())

    def policy_token_loss(self, logp: torch.Tensor, mb: BatchView
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(u, is_clipped, is_dual_clipped, ratio), each [B, L]: `ppo_dual_clip_loss` at ε."""
        adv = mb.adv.view(-1, 1).expand_as(logp)
        return ppo_dual_clip_loss(logp, _old_logp(mb), adv, self.clip_eps, self.dual_clip)

    def token_weights(self, mb: BatchView) -> torch.Tensor:
        """The detached w_t this minibatch's policy term uses ([B, L]); 1 on action tokens if unset."""
        mask = mb.action_mask.float()
        return mb.token_weight.detach() if mb.token_weight is not None else mask

    def kl_term(self, logp: torch.Tensor, mb: BatchView) -> torch.Tensor:
        """β-free KL term: k3(π_ref ‖ π_θ) over action tokens, aggregated like the policy term (never
        weighted by w_t)."""
        if mb.ref_logp is not None and self.kl_coef != 0.0:
            return self.aggregate(kl_penalty_k3(logp, mb.ref_logp), mb.action_mask.float())
        return torch.zeros((), device=logp.device)

    def loss(self, logp: torch.Tensor, mb: BatchView) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch loss (module docstring of `losses.py`) and its detached diagnostics."""
        mask = mb.action_mask.float()                               # [B, L]
        u, clipped, dual, ratio = self.policy_token_loss(logp, mb)  # [B, L] each
        w = self.token_weights(mb)                                  # [B, L] detached
        pg_loss = self.aggregate(w * u, mask)
        kl = self.kl_term(logp, mb)
        loss = pg_loss + self.kl_coef * kl
        with torch.no_grad():
            stats = {
                "pg_loss": pg_loss.detach(), "kl": kl.detach(),
                "clip_frac": masked_mean(clipped.float(), mask),
                "clip_frac_high": masked_mean((clipped & (ratio > 1.0)).float(), mask),
                "clip_frac_low": masked_mean((clipped & (ratio <= 1.0)).float(), mask),
                "dual_clip_frac": masked_mean(dual.float(), mask),
                "ratio_mean": masked_mean(ratio, mask),
            }
        return loss, stats


def _old_logp(mb: BatchView) -> torch.Tensor:
    if mb.old_logp is None:
        raise ValueError("the loss needs mb.old_logp (π_old log-probs): fill them before the update")
    return mb.old_logp


_REGISTRY: dict[str, type[GRPO]] = {"grpo": GRPO}


def register_objective(name: str) -> Callable[[type[GRPO]], type[GRPO]]:
    """Class decorator: make a `GRPO` subclass available as `algo.objective=<name>`.

    Args:
        name: the config name (unique).
    Returns:
        The decorator (it sets `cls.name` and returns the class).
    """
    def deco(cls: type[GRPO]) -> type[GRPO]:
        if name in _REGISTRY:
            raise ValueError(f"objective {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def objective_names() -> list[str]:
    """Every registered objective name, sorted."""
    return sorted(_REGISTRY)


def make_objective(name: str, **params: Any) -> GRPO:
    """The objective registered as `name`, built with `params` (unknown names raise)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown objective {name!r}; valid: {objective_names()}")
    return _REGISTRY[name](**params)
