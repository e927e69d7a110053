"""The objective seam, GRPO (the base every objective extends) and the registry.

An objective is a small class registered by name (`algo.objective` in the config):

* `prepare(batch)` runs once per RL step on the whole batch, before any minibatch split or
  shuffle, and returns `Prepared`: the detached per-token weights w_t (IS weights, InterQ-RL
  retention, ...), any per-row tensors its loss reads, and diagnostics. It does not change the
  batch; the caller attaches the weights (`PolicyBatch.weighted`).
* `loss(logp, mb)` returns the scalar loss of a minibatch and detached diagnostics (the formula:
  `losses.py`).
* `minibatch_extra(mb)` returns per-row tensors of statistics of a whole minibatch that `loss`
  reads (seq_mean's trajectory token counts, InterQ-RL's renorm divisor). The learner attaches them
  before it splits the minibatch into micro-batches or packs, so every micro-batch's loss uses the
  minibatch's numbers; `loss` on a whole minibatch without them computes the same numbers itself.
* `row_local_prepare` says whether `prepare`'s weights and per-row tensors of a row depend only on
  that row (its tokens, log-probs, advantage): then `prepare` on any subset of rows gives those
  rows what it gives them on the whole batch, and the learner may run it per micro-batch, on π_old
  taken from the training forward itself (`trainer.old_logp=bypass`). A subclass that overrides
  `prepare` without declaring it is taken as not row-local (the safe side).

Formulas and worked numbers: docs/algorithms.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from .batch_view import BatchView
from .losses import LOSS_AGGS, kl_penalty_k3, masked_mean, ppo_dual_clip_loss, trajectory_mean, trajectory_tokens

#: `minibatch_extra`'s key for seq_mean's per-row count of the row's trajectory's action tokens
TRAJ_TOKENS = "traj_action_tokens"


@dataclass
class Prepared:
    """What an objective computes once per batch, before the minibatch split."""

    token_weight: torch.Tensor                  # [B, L] detached w_t, 0 off action tokens
    extra: dict[str, torch.Tensor] = field(default_factory=dict)   # per-row tensors its loss reads
    stats: dict[str, float] = field(default_factory=dict)          # logged diagnostics


@dataclass(frozen=True)
class Bound:
    """A numeric parameter's valid range: > low (strict) or ≥ low; finite unless `inf_ok` (a cap that
    ∞ turns off), and None where `none_ok`. A bool or a string is no number here (`k_on=abc` reached
    the first step's float() as a traceback)."""

    low: float
    strict: bool = True
    none_ok: bool = False
    inf_ok: bool = False

    def check(self, objective: str, name: str, value: Any) -> None:
        """Raise a ValueError naming the parameter and its range when `value` is no number (NaN
        included), outside the range, or infinite where that is not allowed."""
        if value is None and self.none_ok:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"objective {objective!r}: {name}={value!r} is not a number; valid: {self}")
        x = float(value)
        if not (x > self.low if self.strict else x >= self.low) or (math.isinf(x) and not self.inf_ok):
            raise ValueError(f"objective {objective!r}: {name}={value!r}; valid: {self}")

    def __str__(self) -> str:
        # an override writes Python's None as YAML's null (`none` there is the string 'none')
        return (f"{'>' if self.strict else '≥'} {self.low:g}" + ("" if self.inf_ok else ", finite")
                + (" or None (null in an override)" if self.none_ok else ""))


@dataclass(frozen=True)
class Flag:
    """A boolean parameter: True or False only (bool("flase") is True: a misspelt override flipped it)."""

    def check(self, objective: str, name: str, value: Any) -> None:
        """Raise a ValueError naming the parameter when `value` is not a bool."""
        if not isinstance(value, bool):
            raise ValueError(f"objective {objective!r}: {name}={value!r}; valid: {self}")

    def __str__(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Choice:
    """A parameter that takes one of a few named values (strings)."""

    options: tuple[str, ...]

    def check(self, objective: str, name: str, value: Any) -> None:
        """Raise a ValueError naming the parameter and the options when `value` is not one of them."""
        if not (isinstance(value, str) and value in self.options):
            raise ValueError(f"objective {objective!r}: {name}={value!r}; valid: {self}")

    def __str__(self) -> str:
        return str(list(self.options))


#: what a parameter's check in an objective's `bounds` may be
Check = Bound | Flag | Choice


class Objective(Protocol):
    """What the learner and the trainer call (every registered objective is one)."""

    name: str
    row_local_prepare: bool

    def minibatch_extra(self, mb: BatchView) -> dict[str, torch.Tensor]:
        """Per-row tensors ([B]) of statistics of the whole minibatch `mb` (weights attached) that
        `loss` reads; the learner adds them to `mb.extra` before the micro-batch split."""
        ...

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
        """How many units (action tokens or trajectories) the loss averages over in `mb`."""
        ...

    def stat_units(self, mb: BatchView) -> dict[str, float]:
        """The units of `loss`'s stats that are means over something else than `agg_units` (by name):
        how many of them `mb` holds. The learner weights each micro-batch's value of such a stat by its
        share of the minibatch's, so a stat does not change with the micro-batch size."""
        ...


class GRPO:
    """GRPO with PPO dual-clip and k3 KL; token weight 1. Other objectives extend it, changing
    `prepare` (weights) and, where the method needs it, `policy_token_loss` or `loss`.

    Extra parameters live in the class attribute `defaults` (name → default value); `self.params`
    holds the merged values. Unknown names raise with the valid list. Every parameter has a check in
    `bounds` (name → `Bound`, `Flag` or `Choice`; a subclass without one for each of its `defaults`
    is refused where it is defined), so a value of the wrong type or range raises when the objective
    is built, at start-up, not at the first step that reads it.
    """

    name = "grpo"
    defaults: dict[str, Any] = {}
    bounds: dict[str, Check] = {}       # the check of each of the `defaults`
    row_local_prepare = True            # weight 1 on each action token: nothing crosses rows
    #: a per-step metric that is 0 where the objective's correction did nothing (AIS's gate): a run in
    #: which it never moved was plain GRPO, and says so at its end (`idle_correction_note`)
    idle_metric: str | None = None

    def __init_subclass__(cls, **kw: Any):
        super().__init_subclass__(**kw)
        # a new `prepare` may couple rows (a batch statistic); only its author can say it does not
        if "prepare" in cls.__dict__ and "row_local_prepare" not in cls.__dict__:
            cls.row_local_prepare = False
        # an unchecked parameter got its first look at the first step's float() / bool(), after a rollout
        unchecked = sorted(set(cls.defaults) - set(cls.bounds))
        if unchecked:
            raise TypeError(f"{cls.__qualname__}: parameter(s) {unchecked} of its defaults have no check in its bounds "
                            "(a Bound, Flag or Choice each: docs/algorithms.md)")

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
        # c ≤ 1 caps every A < 0 token's loss at or below its value at r = 1 (c = 0.5 zeroes their
        # gradient); verl asserts c > 1
        Bound(1.0, inf_ok=True).check(self.name, "dual_clip", self.dual_clip)   # c = ∞: no dual clip
        for key, bound in self.bounds.items():
            bound.check(self.name, key, self.params[key])

    @classmethod
    def param_names(cls) -> list[str]:
        """Extra parameters this objective accepts (besides clip_eps, dual_clip, kl_coef, loss_agg)."""
        return list(cls.defaults)

    def prepare(self, batch: BatchView) -> Prepared:
        """Weight 1 on every action token (plain GRPO)."""
        return Prepared(batch.action_mask.float())

    def aggregate(self, x: torch.Tensor, mb: BatchView) -> torch.Tensor:
        """A [B, L] per-token term of `mb`'s rows → the minibatch scalar, by `loss_agg` over its
        action tokens (seq_mean: `losses.trajectory_mean`)."""
        mask = mb.action_mask.float()
        if self.loss_agg == "token_mean":
            return masked_mean(x, mask)
        row_sums = torch.where(mask.bool(), x, torch.zeros_like(x)).sum(dim=1)   # [B]
        return trajectory_mean(row_sums, mask.sum(dim=1), traj_action_tokens(mb))

    def agg_units(self, mb: BatchView) -> float:
        """What `aggregate` averages over: action tokens (token_mean) or trajectories with one
        (seq_mean; a row of a trajectory counts as its share of that trajectory's tokens). A
        micro-batch's loss counts in its minibatch by its share of these units."""
        n = mb.action_mask.sum(dim=1).double()
        if self.loss_agg == "token_mean":
            return float(n.sum())
        return float((n / traj_action_tokens(mb).double().clamp(min=1.0)).sum())

    #: `loss`'s stats that are means over action tokens, whatever `loss_agg` averages the loss over
    token_stats = ("clip_frac", "clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean")

    def stat_units(self, mb: BatchView) -> dict[str, float]:
        """`token_stats` count action tokens (under token_mean those are `agg_units` too)."""
        n = float(mb.action_mask.sum())
        return dict.fromkeys(self.token_stats, n)

    def minibatch_extra(self, mb: BatchView) -> dict[str, torch.Tensor]:
        """seq_mean over trajectories split across rows (`traj_id`): each row's trajectory's action
        tokens in the whole minibatch, which micro-batches holding only some of its rows cannot count."""
        if self.loss_agg == "seq_mean" and mb.traj_id is not None:
            return {TRAJ_TOKENS: trajectory_tokens(mb.action_mask.float(), mb.traj_id)}
        return {}

    def policy_token_loss(self, logp: torch.Tensor, mb: BatchView
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(u, is_clipped, is_dual_clipped, ratio), each [B, L]: `ppo_dual_clip_loss` at ε."""
        adv = mb.adv.view(-1, 1).expand_as(logp)
        return ppo_dual_clip_loss(logp, require_old_logp(mb), adv, self.clip_eps, self.dual_clip)

    def token_weights(self, mb: BatchView) -> torch.Tensor:
        """The detached w_t this minibatch's policy term uses ([B, L]); 1 on action tokens if unset."""
        mask = mb.action_mask.float()
        return mb.token_weight.detach() if mb.token_weight is not None else mask

    def kl_term(self, logp: torch.Tensor, mb: BatchView) -> torch.Tensor:
        """β-free KL term: k3(π_ref ‖ π_θ) over action tokens, aggregated like the policy term (never
        weighted by w_t)."""
        if mb.ref_logp is not None and self.kl_coef != 0.0:
            return self.aggregate(kl_penalty_k3(logp, mb.ref_logp), mb)
        return torch.zeros((), device=logp.device)

    def loss(self, logp: torch.Tensor, mb: BatchView) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch loss (module docstring of `losses.py`) and its detached diagnostics."""
        mask = mb.action_mask.float()                               # [B, L]
        u, clipped, dual, ratio = self.policy_token_loss(logp, mb)  # [B, L] each
        w = self.token_weights(mb)                                  # [B, L] detached
        pg_loss = self.aggregate(w * u, mb)
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


def traj_action_tokens(mb: BatchView) -> torch.Tensor:
    """[B] action tokens of each row's trajectory: the minibatch's (`minibatch_extra`) where the
    learner attached them, else counted over `mb`'s own rows."""
    if TRAJ_TOKENS in mb.extra:
        return mb.extra[TRAJ_TOKENS]
    return trajectory_tokens(mb.action_mask.float(), mb.traj_id)


def require_old_logp(mb: BatchView) -> torch.Tensor:
    """mb.old_logp, the π_old log-probs a ratio needs ([B, L]); a clear error where the learner has not
    filled them (an objective called outside the update, in a test of one's own)."""
    if mb.old_logp is None:
        raise ValueError("the loss needs mb.old_logp (π_old log-probs): fill them before the update")
    return mb.old_logp


_REGISTRY: dict[str, type[GRPO]] = {"grpo": GRPO}
#: entry-point group of objectives from other packages: the entry point's name is the objective's
#: `algo.objective` name, its value the `GRPO` subclass ("package.module:Class"), imported when named
PLUGIN_GROUP = "agentq.objectives"


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


def _plugins() -> dict[str, Any]:
    """The objective entry points of the installed packages (group `PLUGIN_GROUP`), by name."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def _objective_class(name: str) -> type[GRPO] | None:
    """The class registered as `name`, else the plugin of that name imported (and registered under
    it, where its module did not register it itself); None when neither exists.

    Raises:
        ValueError: the plugin does not import, or names no `GRPO` subclass (one line naming it).
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    ep = _plugins().get(name)
    if ep is None:
        return None
    try:
        cls = ep.load()
    except Exception as e:      # the plugin's own import error, named with its entry point
        raise ValueError(f"objective plugin {name!r} ({ep.value}) does not import: {type(e).__name__}: {e}") from e
    if name not in _REGISTRY:
        if not (isinstance(cls, type) and issubclass(cls, GRPO)):
            raise ValueError(f"objective plugin {name!r} ({ep.value}) is a {type(cls).__name__}, not a GRPO subclass")
        register_objective(name)(cls)
    return _REGISTRY[name]


def objective_names() -> list[str]:
    """Every objective name, sorted: the registered ones and the plugins' (not imported for this)."""
    return sorted(set(_REGISTRY) | set(_plugins()))


def objective_defaults(name: str) -> dict[str, Any]:
    """The default of each extra parameter of the objective named `name` ({} if there is none)."""
    cls = _objective_class(name)
    return dict(cls.defaults) if cls is not None else {}


def make_objective(name: str, **params: Any) -> GRPO:
    """The objective named `name` (registered here, or a plugin's: `PLUGIN_GROUP`), built with
    `params` (unknown names raise)."""
    cls = _objective_class(name)
    if cls is None:
        raise ValueError(f"unknown objective {name!r}; valid: {objective_names()} (another package's objective is "
                         f"found through its entry point in group {PLUGIN_GROUP!r}: docs/algorithms.md)")
    return cls(**params)


def idle_correction_note(objective: Objective, rows: list[dict]) -> str | None:
    """What to say of a run whose objective's correction never engaged (`GRPO.idle_metric` 0 at every
    step logged; a review's AIS runs sat at K3 ~1e-6 against its gate's k_on 1e-4 and matched GRPO to
    four digits without a word), else None.

    Args:
        objective: the run's objective.
        rows: its metrics.jsonl step rows.
    Returns:
        One line naming the metric, the steps and the largest K3 seen, or None.
    """
    metric = getattr(objective, "idle_metric", None)       # a plugin's Objective need not have one
    values = [r[metric] for r in rows if metric is not None and isinstance(r.get(metric), (int, float))]
    if not values or any(v != 0 for v in values):
        return None
    k3 = max((r["k3"] for r in rows if isinstance(r.get("k3"), (int, float))), default=float("nan"))
    params = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                       for k, v in getattr(objective, "params", {}).items())
    return (f"objective {objective.name!r}: {metric} was 0 at all {len(values)} step(s) (K3 at most {k3:.3g}; "
            f"its parameters: {params}): its correction never engaged, and these steps were plain GRPO's")

