"""The learner's batch: trajectories collated into padded tensors (right padding).

Shapes: B rows padded to L tokens; see `agentq.algos.batch_view` for what each position means.
`PolicyBatch` satisfies the objectives' `BatchView` protocol.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch

from agentq.agent.trajectory import Trajectory
from agentq.algos.objective import Prepared
from agentq.utils.device import to_device


@dataclass
class PolicyBatch:
    """B trajectories padded to L tokens, the learner's unit of work (`collate` builds it)."""

    input_ids: torch.Tensor        # [B, L] long
    attention_mask: torch.Tensor   # [B, L] 1 on real tokens, 0 on padding
    action_mask: torch.Tensor      # [B, L] float, 1 on sampled (action) tokens
    seg_id: torch.Tensor           # [B, L] long, turn index s ≥ 1 on action tokens, 0 elsewhere
    rollout_logp: torch.Tensor     # [B, L] float32, log μ(a_t) from the rollout engine
    adv: torch.Tensor              # [B] float32, trajectory advantage (broadcast to its action tokens)
    old_logp: torch.Tensor | None = None    # [B, L] log π_old (learner at θ_old, no grad)
    ref_logp: torch.Tensor | None = None    # [B, L] log π_ref
    token_weight: torch.Tensor | None = None  # [B, L] detached w_t, from Objective.prepare (`weighted`)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # objective-specific [B, ...] tensors
    # [B] long: rows sharing an id are one trajectory split over several rows (step-independent
    # layout; seg_id is then the turn index within the trajectory). None: one row per
    # trajectory. Only per-trajectory quantities (InterQ-RL's prefix) read it.
    traj_id: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        """B, the number of rows."""
        return self.input_ids.shape[0]

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> PolicyBatch:
        """A batch of `fn(t)` for every tensor, the extras' included (None fields stay None)."""
        out: dict[str, object] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "extra":
                out["extra"] = {k: fn(t) for k, t in v.items()}
            else:
                out[f.name] = None if v is None else fn(v)
        return PolicyBatch(**out)  # type: ignore[arg-type]

    def index(self, idx: torch.Tensor) -> PolicyBatch:
        """Rows `idx` of every tensor (a minibatch); per-row extras are sliced too."""
        return self.map_tensors(lambda t: t[idx])

    def to(self, device: torch.device | str) -> PolicyBatch:
        """Every tensor on `device` (host tensors copied without waiting for its queue: `to_device`)."""
        return self.map_tensors(lambda t: to_device(t, device))

    def trim(self, length: int) -> PolicyBatch:
        """The first `length` positions of every [B, L] tensor (per-row [B] tensors unchanged)."""
        return self.map_tensors(lambda t: t[:, :length] if t.dim() == 2 and t.shape[1] >= length else t)

    def weighted(self, prep: Prepared) -> PolicyBatch:
        """This batch with an objective's `prepare` result attached: its token weights, and its
        per-row tensors added to `extra` (so minibatch slicing carries them).

        Args:
            prep: what `Objective.prepare(self)` returned.
        Returns:
            A new batch sharing the other tensors.
        """
        return replace(self, token_weight=prep.token_weight, extra={**self.extra, **prep.extra})


def collate(trajs: list[Trajectory], adv: torch.Tensor | None = None, pad_id: int = 0) -> PolicyBatch:
    """Pad trajectories into a batch.

    Args:
        trajs: the episodes (row i = trajs[i]).
        adv: [B] advantages (zeros if None).
        pad_id: the id written on padding positions.
    Returns:
        A `PolicyBatch` without old/ref log-probs or weights; position 0 is never an action.
    """
    b = len(trajs)
    L = max(t.num_tokens for t in trajs)
    ids = torch.full((b, L), pad_id, dtype=torch.long)
    attn = torch.zeros(b, L, dtype=torch.long)
    mask = torch.zeros(b, L, dtype=torch.float32)
    seg = torch.zeros(b, L, dtype=torch.long)
    rlp = torch.zeros(b, L, dtype=torch.float32)
    for i, t in enumerate(trajs):
        n = t.num_tokens
        ids[i, :n] = torch.tensor(t.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(t.action_mask, dtype=torch.float32)
        seg[i, :n] = torch.tensor(t.seg_id)
        rlp[i, :n] = torch.tensor(t.rollout_logp, dtype=torch.float32)
    mask[:, 0] = 0.0           # position 0 has no log-prob (nothing before it)
    return PolicyBatch(input_ids=ids, attention_mask=attn, action_mask=mask, seg_id=seg, rollout_logp=rlp,
                       adv=adv if adv is not None else torch.zeros(b))
