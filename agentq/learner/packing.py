"""Sequence packing for the learner: rows of different lengths concatenated into one sequence per
micro-batch, so no forward pays for padding.

A *pack* is a group of rows whose tokens are laid end to end (at most `max_tokens` in all). Each
row keeps its own positions (0, 1, …, n−1: RoPE sees exactly the unpacked row) and attends only to
its own earlier tokens (a block-diagonal causal mask), so every row's log-probs are those of the
row alone; only the order of floating-point sums inside the GEMMs and attention changes.

Pure tensor code (no model): `plan_packs` groups rows, `PackLayout` builds the packed inputs of
one pack and reads per-token values back into [rows, L] form.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def plan_packs(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group rows into packs of at most `max_tokens` tokens, first-fit decreasing.

    Rows are taken longest first (ties by index) and each goes into the first pack it fits; a row
    longer than `max_tokens` gets a pack of its own (it is never split or cut: its log-probs need
    its whole prefix), so that pack alone exceeds the budget. Deterministic: the same lengths give
    the same packs.

    Args:
        lengths: tokens of each row (≥ 1).
        max_tokens: the token budget of one pack (≥ 1).
    Returns:
        Packs as lists of row indices (each row exactly once), in the order they were opened;
        within a pack, rows in the order they were placed.
    """
    if max_tokens < 1:
        raise ValueError(f"pack max_tokens={max_tokens!r}: must be a positive integer")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    packs: list[list[int]] = []
    room: list[int] = []          # tokens still free in each pack (negative: an oversize row's pack)
    for i in order:
        n = int(lengths[i])
        if n < 1:
            raise ValueError(f"row {i} has length {n}: every packed row needs at least one token")
        fit = next((p for p, free in enumerate(room) if free >= n), None)
        if fit is None:
            packs.append([i])
            room.append(max_tokens - n)
        else:
            packs[fit].append(i)
            room[fit] -= n
    return packs


@dataclass(frozen=True)
class PackLayout:
    """Where the rows of one pack sit in its packed sequence.

    `starts[r]` and `lengths[r]` give row r's span [start, start + length) in the sequence of
    `total` tokens."""

    starts: torch.Tensor    # [R] long
    lengths: torch.Tensor   # [R] long

    @classmethod
    def of(cls, lengths: torch.Tensor) -> PackLayout:
        """The layout of rows with these lengths laid end to end, in order."""
        lengths = lengths.long().cpu()
        starts = torch.cumsum(lengths, 0) - lengths
        return cls(starts=starts, lengths=lengths)

    @property
    def total(self) -> int:
        """Tokens in the packed sequence."""
        return int(self.lengths.sum())

    @property
    def num_rows(self) -> int:
        return int(self.lengths.numel())

    def bounds(self) -> torch.Tensor:
        """[R + 1] long (CPU): the rows' boundaries 0, n₁, n₁+n₂, …, total (HF's `cu_seq_lens`)."""
        return torch.cat([self.starts, self.lengths.sum().reshape(1)])

    def row_of_token(self) -> torch.Tensor:
        """[total] long: the row each packed token belongs to."""
        return torch.repeat_interleave(torch.arange(self.num_rows), self.lengths)

    def position_ids(self) -> torch.Tensor:
        """[1, total] long: each token's position within its own row (restarts at 0 per row)."""
        seg = self.row_of_token()
        return (torch.arange(self.total) - self.starts[seg]).unsqueeze(0)

    def pack(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, L, ...] right-padded rows → [1, total, ...]: each row's first `lengths[r]` entries, end to end."""
        valid = torch.arange(rows.shape[1]).unsqueeze(0) < self.lengths.unsqueeze(1)
        return rows[valid.to(rows.device)].unsqueeze(0)

    def unpack(self, packed: torch.Tensor, length: int) -> torch.Tensor:
        """[1, total] per-token values → [R, length] rows (0 past each row's end); differentiable."""
        pos = torch.arange(length)
        valid = pos.unsqueeze(0) < self.lengths.unsqueeze(1)
        src = (self.starts.unsqueeze(1) + pos.unsqueeze(0)).clamp(max=max(self.total - 1, 0))
        out = packed[0, src.to(packed.device)]
        return out * valid.to(out.device, out.dtype)

    def causal_block_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[1, 1, total, total] bool, True where query i may attend key j: same row and j ≤ i.
        HF passes a 4D mask to the attention function as it is (no mask of its own is built)."""
        seg = self.row_of_token().to(device)
        idx = torch.arange(self.total, device=device)
        allowed = (seg.unsqueeze(1) == seg.unsqueeze(0)) & (idx.unsqueeze(1) >= idx.unsqueeze(0))
        return allowed[None, None]


def padded_tokens(lengths: Sequence[int], groups: Sequence[Sequence[int]], packed: bool) -> int:
    """Forward positions a micro-batch plan computes: Σ over groups of rows × longest row (padded
    rows), or Σ of lengths (packed: no padding)."""
    if packed:
        return sum(int(lengths[i]) for g in groups for i in g)
    return sum(len(g) * max(int(lengths[i]) for i in g) for g in groups if g)
