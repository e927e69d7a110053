"""Collating trajectories into padded `PolicyBatch` tensors (right padding)."""
from __future__ import annotations

import torch

from agentq.agent.trajectory import Trajectory
from agentq.algos.base import PolicyBatch


def collate(trajs: list[Trajectory], adv: torch.Tensor | None = None, pad_id: int = 0) -> PolicyBatch:
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
