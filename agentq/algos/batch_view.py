"""What an objective reads from a batch, as a protocol: the learner's `PolicyBatch`
(`agentq/learner/batch.py`) is one, and algos never imports it (layers import downward only).

Shapes: B rows padded to L tokens. Position t of every [B, L] tensor describes token t;
log-prob tensors hold log p(token_t | tokens_<t) (position 0 is never an action). `action_mask`
is 1 only on tokens the rollout engine sampled; observation, prompt, template and padding tokens
carry no likelihood term (they still sit in the context of later tokens).
"""
from __future__ import annotations

from typing import Protocol

import torch


class BatchView(Protocol):
    """The tensors of a collated batch that objectives and diagnostics read."""

    action_mask: torch.Tensor              # [B, L] float, 1 on sampled (action) tokens
    seg_id: torch.Tensor                   # [B, L] long, turn index s ≥ 1 on action tokens, 0 elsewhere
    rollout_logp: torch.Tensor             # [B, L] float32, log μ(a_t) from the rollout engine
    adv: torch.Tensor                      # [B] float32, trajectory advantage
    old_logp: torch.Tensor | None          # [B, L] log π_old (learner at θ_old, no grad)
    ref_logp: torch.Tensor | None          # [B, L] log π_ref
    token_weight: torch.Tensor | None      # [B, L] detached w_t from `prepare` (None: 1 on action tokens)
    extra: dict[str, torch.Tensor]         # objective-specific per-row tensors
    traj_id: torch.Tensor | None           # [B] long: rows sharing an id are one trajectory (None: one row each)

    @property
    def num_seqs(self) -> int:
        """B, the number of rows."""
        ...
