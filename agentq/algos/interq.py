"""InterQ-RL: bounded execution-prefix correction (docs/algorithms.md).

**Every formula here is agentq's own design [DESIGN].** The InterQ-RL paper's full text was not
available, only its abstract and tables; this reconstruction is consistent with the published
retention statistics (α median 0.717–0.942, min 0.372, max 0.989) but is not the paper's method.

Per action token t (observation, prompt, template and padding tokens are ignored here but stay in
the context of later tokens):

    δ_t  = clamp(log π_old(a_t) − log μ(a_t), ±20)
    k3_t = min(exp(δ_t) − 1 − δ_t, k3_max)                     k3_max = 10

Per action segment s = 1..S_i of trajectory i (turn index, in temporal order):

    m_s = Σ_{t∈A_s} k3_t                                        segment mismatch mass
    H_s = Σ_{s'≤s} m_{s'}    (s' < s if prefix_inclusive=False)  execution-prefix mismatch
    ρ_s = exp(−H_s)                                             effective support

Per trajectory a fixed displacement budget B and floor F (budget_scope=segment: B_i = b·S_i and
F_i = H_floor·S_i, both per segment, so H_floor = b stays the capped mode):

    Htot_i = Σ_s H_s,   κ_i = B / max(Htot_i, F)                (Htot = F = 0 → α = 1)
    d_s = κ_i·H_s,   α_s = exp(−d_s) = ρ_s^κ_i ∈ [e^−B, 1], non-increasing in s
    Σ_s d_s = B·Htot_i / max(Htot_i, F) ≤ B   (= B whenever Htot_i ≥ F and Htot_i > 0)

Default H_floor = None, read as H_floor = B: the capped mode (κ ≤ 1, α_s ≥ ρ_s, α → 1 as mismatch → 0),
which therefore stays the capped mode when only B is changed; the fixed budget H_floor = 0 turns
float-rounding δ into a full correction: docs/algorithms.md. A NaN δ on any action token makes the
whole trajectory's α NaN (and the learner skips its minibatch), never a partial correction.

Loss: the base loss (`losses.py`) with w_t = α_{seg(t)} (detached) on every action token (× min(e^δ_t, C) if
`token_tis_cap` is set; ÷ the minibatch token-mean of α if `renorm_retention`, taken over the whole
minibatch before the learner splits it, `minibatch_extra`). The KL term is not weighted. α is
computed once per RL step in `prepare`, on the whole batch, before any minibatch split or shuffle
(it needs every segment of a trajectory), and never recomputed per epoch.

Layouts: one row per trajectory (seg_id = turn index), or a trajectory split over several rows
(step-independent frameworks) with `batch.traj_id` [B] naming the trajectory and
seg_id the turn index within it. A trailing empty action segment (an empty generation at the last
turn) leaves no seg_id behind; pass `batch.extra["num_segments"]` [B] to keep it for the ordering.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch_view import BatchView
from .diagnostics import k3, quantile, token_delta, weight_stats
from .losses import masked_mean
from .objective import GRPO, Bound, Choice, Flag, Prepared, register_objective
from .tis import truncated_is_weight


# ---------------------------------------------------------------------- pure pieces
def trajectory_rows(batch: BatchView) -> tuple[torch.Tensor, int]:
    """Dense trajectory index of every row ([B] long in [0, T)) and T."""
    if batch.traj_id is None:
        return torch.arange(batch.num_seqs, device=batch.seg_id.device), batch.num_seqs
    uniq, inverse = torch.unique(batch.traj_id, return_inverse=True)
    return inverse, int(uniq.numel())


def segment_sums(values: torch.Tensor, seg_id: torch.Tensor, mask: torch.Tensor, traj_row: torch.Tensor,
                 num_traj: int, num_seg: int) -> torch.Tensor:
    """Σ of `values` over the masked tokens of each (trajectory, segment): [T, S] (column j = segment j+1).

    values [B, L], seg_id [B, L] (≥ 1 on masked tokens), mask [B, L] bool, traj_row [B].
    One scatter-add over the masked tokens; no loop over tokens, rows or trajectories.
    """
    B, L = values.shape
    tok_traj = traj_row.view(B, 1).expand(B, L)[mask]                    # [N]
    tok_seg = seg_id.long()[mask] - 1                                    # [N] 0-based segment
    out = torch.zeros(num_traj, num_seg, dtype=values.dtype, device=values.device)
    return out.index_put_((tok_traj, tok_seg), values[mask], accumulate=True)


def prefix_retention(m: torch.Tensor, valid: torch.Tensor, budget: torch.Tensor, H_floor: float | torch.Tensor,
                     prefix_inclusive: bool = True) -> dict[str, torch.Tensor]:
    """Budgeted retention from per-segment mismatch masses. Pure; all tensors float64.

    m [T, S] segment masses (0 beyond a trajectory's last segment), valid [T, S] bool (s ≤ S_i),
    budget [T] displacement budget B_i, H_floor a number or [T] (the floor F_i). Returns H, Htot,
    kappa, d, alpha ([T, S] / [T]); alpha = 1 and d = 0 on invalid columns.
    """
    m = m * valid
    H_incl = torch.cumsum(m, dim=1)                                      # [T, S]
    if prefix_inclusive:
        H = H_incl
    else:                                                                # strictly earlier segments
        H = torch.cat([torch.zeros_like(H_incl[:, :1]), H_incl[:, :-1]], dim=1)
    H = H * valid
    htot = H.sum(dim=1)                                                  # [T]
    denom = torch.maximum(htot, torch.as_tensor(H_floor, dtype=htot.dtype, device=htot.device))   # max(Htot, F)
    # Htot = 0 with H_floor = 0: no evidence of mismatch, κ = 0 → d = 0 → α = 1. A NaN Htot (a NaN δ)
    # keeps κ NaN, so every α of its trajectory is NaN, not 1 before the NaN's segment and NaN after
    kappa = torch.where((denom > 0) | denom.isnan(), budget / denom.clamp(min=1e-300), torch.zeros_like(denom))
    d = kappa.view(-1, 1) * H                                            # [T, S]
    alpha = torch.exp(-d)
    return {"H": H, "Htot": htot, "kappa": kappa, "d": d, "alpha": alpha}


@dataclass
class Retention:
    """InterQ-RL's per-trajectory quantities of one batch (float64; [T, S] has column j = segment j+1)."""
    retention: torch.Tensor   # [B, L] α_{seg(t)} on action tokens, 0 elsewhere
    alpha: torch.Tensor       # [T, S]
    d: torch.Tensor           # [T, S]
    H: torch.Tensor           # [T, S]
    m: torch.Tensor           # [T, S]
    n: torch.Tensor           # [T, S] action tokens per segment
    valid: torch.Tensor       # [T, S] bool, s ≤ S_i
    Htot: torch.Tensor        # [T]
    kappa: torch.Tensor       # [T]
    num_segments: torch.Tensor  # [T] S_i


@torch.no_grad()
def interq_retention(batch: BatchView, budget_B: float = 1.0, H_floor: float | None = 0.0,
                     budget_scope: str = "trajectory", prefix_inclusive: bool = True,
                     k3_max: float | None = 10.0) -> Retention:
    """α per (trajectory, segment) and per token for a whole batch.

    The keyword defaults are the fixed budget (H_floor = 0, the worked example's reading); the
    `interq` objective's default is the capped mode (H_floor None: the floor is budget_B). m, H and n do not
    depend on budget_B, H_floor or budget_scope.
    """
    mask = batch.action_mask.bool()                                      # [B, L]
    seg = batch.seg_id.long()                                            # [B, L]
    if bool((seg[mask] < 1).any()):
        raise ValueError("InterQ-RL: every action token needs seg_id ≥ 1 (its turn index)")
    delta = token_delta(batch)                                           # [B, L] f64, 0 off actions
    k3_t = k3(delta)
    if k3_max is not None:
        k3_t = k3_t.clamp(max=float(k3_max))

    traj_row, T = trajectory_rows(batch)                                 # [B], T
    # S_i = last turn index seen on an action token of any row of trajectory i (or the declared number
    # of segments): a seg_id left on an observation token does not add a segment
    seg_row = torch.where(mask, seg, 0).amax(dim=1) if seg.numel() else torch.zeros_like(traj_row)   # [B]
    if "num_segments" in batch.extra:
        seg_row = torch.maximum(seg_row, batch.extra["num_segments"].long().to(seg_row.device))
    num_seg = torch.zeros(T, dtype=torch.long, device=seg.device).scatter_reduce_(
        0, traj_row, seg_row, reduce="amax")                             # [T]
    S = max(int(num_seg.max()) if T else 0, 1)
    valid = torch.arange(1, S + 1, device=seg.device).view(1, S) <= num_seg.view(T, 1)   # [T, S]

    m = segment_sums(k3_t, seg, mask, traj_row, T, S)                    # [T, S]
    n = segment_sums(torch.ones_like(k3_t), seg, mask, traj_row, T, S)   # [T, S]

    if budget_scope == "trajectory":
        scale = torch.ones(T, dtype=torch.float64, device=m.device)
    elif budget_scope == "segment":                                      # per-segment budget and floor
        scale = num_seg.double()
    else:
        raise ValueError(f"budget_scope must be 'trajectory' or 'segment', got {budget_scope!r}")
    # B_i = b·S_i and F_i = H_floor·S_i: the floor scales with the budget, else H_floor = b would
    # give κ = S_i (α = ρ^S_i < ρ) below the floor instead of the capped mode's κ = 1
    floor = float(budget_B if H_floor is None else H_floor)
    out = prefix_retention(m, valid, float(budget_B) * scale, floor * scale, prefix_inclusive)

    # per token: α of its (trajectory, segment); 0 off action tokens
    alpha_rows = out["alpha"][traj_row]                                  # [B, S]
    tok_alpha = torch.gather(alpha_rows, 1, (seg - 1).clamp(min=0, max=S - 1))   # [B, L]
    retention = torch.where(mask, tok_alpha, torch.zeros_like(tok_alpha))
    return Retention(retention=retention, alpha=out["alpha"], d=out["d"], H=out["H"], m=m, n=n, valid=valid,
                     Htot=out["Htot"], kappa=out["kappa"], num_segments=num_seg)


def retention_stats(r: Retention, mask: torch.Tensor) -> dict[str, float]:
    """α diagnostics. min/p10/median/max are over segments that carry a loss (valid,
    ≥ 1 action token), each counted once; `alpha_frac_below_half` is over action tokens."""
    seg_alpha = r.alpha[r.valid & (r.n > 0)]                             # [#segments]
    tok_alpha = r.retention[mask.bool()]                                 # [N]
    has = seg_alpha.numel() > 0
    a_min = float(seg_alpha.min()) if has else float("nan")
    a_max = float(seg_alpha.max()) if has else float("nan")
    return {
        "alpha_min": a_min, "alpha_p10": quantile(seg_alpha, 0.10), "alpha_median": quantile(seg_alpha, 0.5),
        "alpha_max": a_max, "alpha_range_width": a_max - a_min,
        "alpha_token_mean": float(tok_alpha.mean()) if tok_alpha.numel() else float("nan"),
        "alpha_frac_below_half": float((tok_alpha < 0.5).double().mean()) if tok_alpha.numel() else float("nan"),
        "htot_mean": float(r.Htot.mean()) if r.Htot.numel() else float("nan"),
        "htot_max": float(r.Htot.max()) if r.Htot.numel() else float("nan"),
        "num_segments_mean": float(r.num_segments.double().mean()) if r.num_segments.numel() else float("nan"),
    }


# ---------------------------------------------------------------------- objective
@register_objective("interq")
class InterQ(GRPO):
    """GRPO whose clipped per-token loss is multiplied by the segment retention α_s."""

    # H_floor None: the floor is budget_B, so the capped mode follows a changed budget
    defaults = {"budget_B": 1.0, "H_floor": None, "budget_scope": "trajectory", "prefix_inclusive": True,
                "k3_max": 10.0, "renorm_retention": False, "token_tis_cap": None}
    # B = ∞ or F = ∞ made κ = ∞ / ∞ (NaN retention); the caps k3_max and token_tis_cap take ∞ as no cap
    bounds = {"budget_B": Bound(0.0, strict=False), "H_floor": Bound(0.0, strict=False, none_ok=True),
              "budget_scope": Choice(("trajectory", "segment")), "prefix_inclusive": Flag(),
              "k3_max": Bound(0.0, strict=False, none_ok=True, inf_ok=True), "renorm_retention": Flag(),
              "token_tis_cap": Bound(0.0, none_ok=True, inf_ok=True)}
    # α of a row's segments comes from that trajectory's own k3 (one row per trajectory: a batch with
    # traj_id, one trajectory over several rows, is refused by the learner's bypass)
    row_local_prepare = True

    def __init__(self, **params):
        super().__init__(**params)
        if self.params["renorm_retention"]:
            # the divisor is a mean over the whole minibatch's α: bypass, computing α per micro-batch
            # after its forward, has it only after the last micro-batch's loss
            self.row_local_prepare = False

    @torch.no_grad()
    def prepare(self, batch: BatchView) -> Prepared:
        mask = batch.action_mask.bool()                                  # [B, L]
        p = self.params
        r = interq_retention(batch, budget_B=float(p["budget_B"]), H_floor=p["H_floor"],
                             budget_scope=p["budget_scope"], prefix_inclusive=p["prefix_inclusive"],
                             k3_max=p["k3_max"])
        self.retention = r                                               # per-segment tensors, for the segment history
        w = r.retention                                                  # [B, L] f64
        stats = retention_stats(r, mask)
        if p["token_tis_cap"] is not None:                               # optional current-token TIS
            tis = torch.where(mask, truncated_is_weight(token_delta(batch), float(p["token_tis_cap"])),
                              torch.zeros_like(w))
            w = w * tis
            stats.update(weight_stats("is_weight", tis, mask))
        return Prepared(w.float(), {"retention": r.retention.float()}, stats)   # retention: [B, L] α per token

    def minibatch_extra(self, mb: BatchView) -> dict[str, torch.Tensor]:
        out = super().minibatch_extra(mb)
        if self.params["renorm_retention"]:                              # [B]: the same number on every row
            out[RETENTION_MEAN] = retention_mean(mb).expand(mb.num_seqs).clone()
        return out

    def token_weights(self, mb: BatchView) -> torch.Tensor:
        w = super().token_weights(mb)                                    # [B, L] detached
        if self.params["renorm_retention"]:                              # ÷ minibatch token-mean of α
            # the learner's micro-batches carry the minibatch's mean; a whole minibatch computes it
            mean_alpha = mb.extra[RETENTION_MEAN].view(-1, 1) if RETENTION_MEAN in mb.extra else retention_mean(mb)
            w = w / mean_alpha.clamp(min=1e-12)
        return w


#: `InterQ.minibatch_extra`'s key: the minibatch token-mean of α, per row
RETENTION_MEAN = "retention_token_mean"


def retention_mean(mb: BatchView) -> torch.Tensor:
    """Token-mean of α (`extra["retention"]`, from `prepare`) over `mb`'s action tokens (scalar)."""
    if "retention" not in mb.extra:
        raise RuntimeError("renorm_retention needs mb.extra['retention']: attach prepare(batch)'s result first "
                           "(PolicyBatch.weighted)")
    return masked_mean(mb.extra["retention"].detach(), mb.action_mask.float())
