"""The GRPO base that every objective shares, the `PolicyBatch` it reads, and the registry.

Shapes: B trajectories padded to L tokens. Position t of every [B, L] tensor describes token t;
log-prob tensors hold log p(token_t | tokens_<t) (position 0 is never an action). `action_mask`
is 1 only on tokens the rollout engine sampled; observation, prompt, template and padding tokens
carry no likelihood term (they still sit in the context of later tokens).

An objective is a small class registered by name (`algo.objective` in the config):

* `prepare(batch)` runs once per RL step on the whole batch, before any minibatch split or
  shuffle: it fills `batch.token_weight` (detached per-token weights w_t: IS weights, InterQ-RL
  retention, ...) and returns diagnostics.
* `loss(logp, mb)` returns the scalar loss of a minibatch and detached diagnostics:

      L = Σ_t m_t · w_t · u_t / Σ_t m_t  +  β · Σ_t m_t · kl_t / Σ_t m_t       (loss_agg = token_mean)

  with u_t the PPO dual-clip token loss and kl_t the k3 penalty to the reference policy; with
  loss_agg = seq_mean each trajectory's token mean counts once (mean over trajectories), so long
  trajectories do not outweigh short ones (verl's seq-mean-token-mean).
Formulas and worked numbers: docs/algorithms.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch

LOGRATIO_CLAMP = 20.0
LOSS_AGGS = ("token_mean", "seq_mean")


@dataclass
class PolicyBatch:
    input_ids: torch.Tensor        # [B, L] long
    attention_mask: torch.Tensor   # [B, L] 1 on real tokens, 0 on padding
    action_mask: torch.Tensor      # [B, L] float, 1 on sampled (action) tokens
    seg_id: torch.Tensor           # [B, L] long, turn index s ≥ 1 on action tokens, 0 elsewhere
    rollout_logp: torch.Tensor     # [B, L] float32, log μ(a_t) from the rollout engine
    adv: torch.Tensor              # [B] float32, trajectory advantage (broadcast to its action tokens)
    old_logp: torch.Tensor | None = None    # [B, L] log π_old (learner at θ_old, no grad)
    ref_logp: torch.Tensor | None = None    # [B, L] log π_ref
    token_weight: torch.Tensor | None = None  # [B, L] detached w_t, filled by Objective.prepare
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # objective-specific [B, ...] tensors
    # [B] long: rows sharing an id are one trajectory split over several rows (step-independent
    # layout; seg_id is then the turn index within the trajectory). None: one row per
    # trajectory. Only per-trajectory quantities (InterQ-RL's prefix) read it.
    traj_id: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.input_ids.shape[0]

    def index(self, idx: torch.Tensor) -> "PolicyBatch":
        """Rows `idx` of every tensor (a minibatch); per-row extras are sliced too."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "extra":
                out["extra"] = {k: t[idx] for k, t in v.items()}
            else:
                out[f.name] = None if v is None else v[idx]
        return PolicyBatch(**out)

    def to(self, device) -> "PolicyBatch":
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "extra":
                out["extra"] = {k: t.to(device) for k, t in v.items()}
            else:
                out[f.name] = None if v is None else v.to(device)
        return PolicyBatch(**out)


# ---------------------------------------------------------------------- GRPO pieces (pure functions)
def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Â_i = (R_i − mean_g R) / (std_g R + eps) within each group g of rollouts of the same task.

    std is the unbiased sample std (as verl). A group of one rollout has no baseline: Â = 0.
    rewards, group_ids: [N] → [N].
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for g in torch.unique(group_ids):
        sel = group_ids == g
        r = rewards[sel].float()
        if r.numel() < 2:
            continue
        adv[sel] = (r - r.mean()) / (r.std() + eps)
    return adv


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ mask·x / Σ mask (0 when the mask is empty). Masked-out entries may hold anything (NaN too)."""
    return torch.where(mask.bool(), x * mask, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1.0)


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean of x over masked tokens ([B]) and the token counts n ([B]); mean = 0 when n = 0."""
    n = mask.sum(dim=1)                                                  # [B]
    s = torch.where(mask.bool(), x, torch.zeros_like(x)).sum(dim=1)      # [B]
    return s / n.clamp(min=1.0), n


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over rows that have a masked token of each row's masked mean (0 when none has)."""
    row, n = sequence_mean(x, mask)
    has = (n > 0).to(row.dtype)
    return (row * has).sum() / has.sum().clamp(min=1.0)


def log_ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """clamp(a − b, −20, 20): the log-ratio guard every estimator uses."""
    return (a - b).clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP)


def k3(delta: torch.Tensor) -> torch.Tensor:
    """k3 = exp(δ) − 1 − δ ≥ 0 (Schulman's low-variance KL estimator)."""
    return torch.expm1(delta) - delta


def ppo_dual_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float,
                       dual_clip: float, clip_high: float | torch.Tensor | None = None):
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


# ---------------------------------------------------------------------- shared mismatch pieces
def token_delta(batch: PolicyBatch) -> torch.Tensor:
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
def mismatch_metrics(batch: PolicyBatch) -> dict[str, float | list[float]]:
    """Rollout–learner mismatch diagnostics, the same for every objective.

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


# ---------------------------------------------------------------------- objectives
class Objective:
    """GRPO with PPO dual-clip and k3 KL; token weight 1. Subclasses change `prepare` (weights)
    and, where the method needs it, `policy_token_loss` or `loss`.

    Extra parameters live in the class attribute `defaults` (name → default value); `self.p` holds
    the merged values. Unknown names raise with the valid list.
    """

    name = "grpo"
    defaults: dict[str, Any] = {}

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
        self.params = params
        self.p: dict[str, Any] = {**self.defaults, **params}

    @classmethod
    def param_names(cls) -> list[str]:
        """Extra parameters this objective accepts (besides clip_eps, dual_clip, kl_coef)."""
        return list(cls.defaults)

    def prepare(self, batch: PolicyBatch) -> dict[str, float]:
        batch.token_weight = batch.action_mask.float()
        return {}

    def aggregate(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A [B, L] per-token term → the minibatch scalar, by `loss_agg`."""
        return masked_mean(x, mask) if self.loss_agg == "token_mean" else seq_mean(x, mask)

    def agg_units(self, mb: PolicyBatch) -> float:
        """What `aggregate` averages over: action tokens (token_mean) or trajectories with one
        (seq_mean). A micro-batch's loss counts in its minibatch by its share of these units."""
        n = mb.action_mask.sum(dim=1)
        return float(n.sum()) if self.loss_agg == "token_mean" else float((n > 0).sum())

    def policy_token_loss(self, logp: torch.Tensor, mb: PolicyBatch):
        adv = mb.adv.view(-1, 1).expand_as(logp)
        return ppo_dual_clip_loss(logp, mb.old_logp, adv, self.clip_eps, self.dual_clip)

    def token_weights(self, mb: PolicyBatch) -> torch.Tensor:
        """The detached w_t this minibatch's policy term uses ([B, L]); 1 on action tokens if unset."""
        mask = mb.action_mask.float()
        return mb.token_weight.detach() if mb.token_weight is not None else mask

    def kl_term(self, logp: torch.Tensor, mb: PolicyBatch) -> torch.Tensor:
        """β-free KL term: k3(π_ref ‖ π_θ) over action tokens, aggregated like the policy term (never
        weighted by w_t)."""
        if mb.ref_logp is not None and self.kl_coef != 0.0:
            return self.aggregate(kl_penalty_k3(logp, mb.ref_logp), mb.action_mask.float())
        return torch.zeros((), device=logp.device)

    def loss(self, logp: torch.Tensor, mb: PolicyBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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


_REGISTRY: dict[str, type[Objective]] = {"grpo": Objective}


def register_objective(name: str) -> Callable[[type[Objective]], type[Objective]]:
    def deco(cls: type[Objective]) -> type[Objective]:
        if name in _REGISTRY:
            raise ValueError(f"objective {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def objective_names() -> list[str]:
    return sorted(_REGISTRY)


def make_objective(name: str, **params: Any) -> Objective:
    if name not in _REGISTRY:
        raise ValueError(f"unknown objective {name!r}; valid: {objective_names()}")
    return _REGISTRY[name](**params)
