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

from agentq.utils.device import to_device


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
        out = packed[0, to_device(src, packed.device)]
        return out * to_device(valid, out.device, out.dtype)

    def causal_block_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[1, 1, total, total] bool, True where query i may attend key j: same row and j ≤ i.
        HF passes a 4D mask to the attention function as it is (no mask of its own is built)."""
        seg = to_device(self.row_of_token(), device)
        idx = torch.arange(self.total, device=device)
        allowed = (seg.unsqueeze(1) == seg.unsqueeze(0)) & (idx.unsqueeze(1) >= idx.unsqueeze(0))
        return allowed[None, None]


def padded_tokens(lengths: Sequence[int], groups: Sequence[Sequence[int]], packed: bool) -> int:
    """Forward positions a micro-batch plan computes: Σ over groups of rows × longest row (padded
    rows), or Σ of lengths (packed: no padding)."""
    if packed:
        return sum(int(lengths[i]) for g in groups for i in g)
    return sum(len(g) * max(int(lengths[i]) for i in g) for g in groups if g)


# ------------------------------------------------------------------ shared prefixes
#: the fewest tokens a group of rows must share before a pack computes them once (below this the
#: K/V gather costs about what the saved tokens would)
MIN_SHARED_TOKENS = 32


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Leading tokens two 1-D id rows have in common (at most the shorter row's length)."""
    n = min(a.numel(), b.numel())
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n


def token_order(input_ids: torch.Tensor, lengths: Sequence[int]) -> list[int]:
    """Row indices sorted by the rows' tokens (lexicographically, ties by index): rows with long
    common prefixes are neighbours."""
    lens = [int(n) for n in lengths]
    return sorted(range(len(lens)), key=lambda r: input_ids[r, :lens[r]].tolist())


def shared_prefix_groups(input_ids: torch.Tensor, lengths: Sequence[int], min_tokens: int = MIN_SHARED_TOKENS,
                         max_group: int = 64) -> list[tuple[list[int], int]]:
    """Groups of rows whose leading tokens agree, chosen to save the most forward tokens.

    A group of k rows with a common prefix of c tokens computes its first c − 1 tokens once (its
    shared segment; each row keeps the last common token, whose logits predict its own first
    token), saving (k − 1)(c − 1) tokens. Rows are sorted by their tokens, so rows with long
    common prefixes are neighbours, and a dynamic program over that order picks the runs of
    neighbours that save the most. Deterministic; any grouping gives the same log-probs.

    Args:
        input_ids: [R, L] rows (right-padded; CPU); lengths: real tokens per row.
        min_tokens: the fewest shared tokens (c − 1) worth a group; max_group: the most rows in one.
    Returns:
        [(rows, shared)]: each group's rows (≥ 2, in sorted order) and its shared token count
        (≥ min_tokens; every row has at least one token after it).
    """
    lens = [int(n) for n in lengths]
    order = token_order(input_ids, lens)
    rows = [input_ids[r, :lens[r]] for r in order]
    link = [common_prefix(rows[i], rows[i + 1]) for i in range(len(rows) - 1)]
    best = [0] * (len(rows) + 1)          # best[j]: most tokens saved over the first j sorted rows
    cut: list[tuple[int, int]] = [(0, 0)] * (len(rows) + 1)    # (first row of the last run, its shared)
    for j in range(1, len(rows) + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)
        common = None
        for i in range(j - 2, max(-1, j - 1 - max_group), -1):     # run i … j − 1
            common = link[i] if common is None else min(common, link[i])
            if common - 1 < min_tokens:
                break
            saved = best[i] + (j - 1 - i) * (common - 1)
            if saved > best[j]:
                best[j], cut[j] = saved, (i, common - 1)
    groups = []
    j = len(rows)
    while j > 0:
        i, shared = cut[j]
        if shared:
            groups.append(([order[r] for r in range(i, j)], shared))
        j = i
    return groups[::-1]


def plan_shared_packs(input_ids: torch.Tensor, lengths: Sequence[int], max_tokens: int,
                      min_tokens: int = MIN_SHARED_TOKENS) -> list[list[int]]:
    """`plan_packs` over units of rows that share a prefix (`shared_prefix_groups`): a group's rows
    go to one pack, counted as its shared tokens once plus each row's own, so the pack
    (`SharedPackLayout`) computes the prefix once. A group too big for `max_tokens` is cut into
    units that each fit (each repeating the prefix); rows sharing nothing are units of one.

    Returns:
        Packs as lists of row indices (each row once), a unit's rows adjacent.
    """
    lens = [int(n) for n in lengths]
    units: list[list[int]] = []
    tokens: list[int] = []
    grouped = set()
    for rows, shared in shared_prefix_groups(input_ids, lens, min_tokens):
        grouped.update(rows)
        unit: list[int] = []
        size = shared
        for r in rows:
            if unit and size + lens[r] - shared > max_tokens:
                units.append(unit)
                tokens.append(size)
                unit, size = [], shared
            unit.append(r)
            size += lens[r] - shared
        units.append(unit)
        tokens.append(size)
    for r in range(len(lens)):
        if r not in grouped:
            units.append([r])
            tokens.append(lens[r])
    return [[r for u in pack for r in units[u]] for pack in plan_packs(tokens, max_tokens)]


@dataclass(frozen=True)
class SharedPackLayout:
    """Rows of one pack laid out as segments, a prefix that several rows share computed once.

    A group's shared segment holds its first `shared` tokens (positions 0 … shared − 1); each of
    its rows follows as a segment of its own tokens from position `shared` on, attending to the
    shared segment and then causally to itself (its keys are the shared segment's followed by its
    own: `kv_index`, `k_bounds`). Rows in no group are segments alone, as in `PackLayout`.
    `src[r, t]` is the packed position whose log-prob (of that token, from the logits of the
    position before it) is row r's at token t: in the shared segment for t < shared, at the
    group's first row segment's start for t = shared (the last shared token, right after the
    shared segment), in the row's own segment after that; −1 past the row's end. `origin` names
    the (row, token) each packed position holds.
    """

    src: torch.Tensor          # [R, L] long
    origin: torch.Tensor       # [2, total] long: row, token index
    lengths: torch.Tensor      # [R] long
    q_bounds: torch.Tensor     # [S + 1] long: the segments' boundaries in the packed sequence
    k_bounds: torch.Tensor     # [S + 1] long: the same in the gathered keys
    kv_index: torch.Tensor     # [Tk] long: the packed position of each gathered key
    positions: torch.Tensor    # [total] long

    @classmethod
    def of(cls, input_ids: torch.Tensor, lengths: torch.Tensor, groups: list[tuple[list[int], int]]
           ) -> SharedPackLayout:
        """The layout of rows input_ids [R, L] (right-padded, CPU) with real `lengths`, the
        `groups` (`shared_prefix_groups`) sharing their prefixes."""
        lens = [int(n) for n in lengths]
        src = torch.full((len(lens), input_ids.shape[1]), -1, dtype=torch.long)
        q_len: list[int] = []
        kv: list[torch.Tensor] = []
        pos: list[torch.Tensor] = []
        owner: list[int] = []         # the row each segment's tokens come from
        start = 0

        def segment(row: int, first: int, end: int, keys: torch.Tensor) -> None:
            q_len.append(end - first)
            kv.append(keys)
            pos.append(torch.arange(first, end))
            owner.append(row)

        grouped = set()
        for rows, shared in groups:
            head = torch.arange(start, start + shared)
            segment(rows[0], 0, shared, head)
            first, start = start + shared, start + shared     # the group's first row segment; the next
            for r in rows:
                own = torch.arange(start, start + lens[r] - shared)
                src[r, :shared] = head
                src[r, shared] = first
                src[r, shared + 1:lens[r]] = own[1:]
                segment(r, shared, lens[r], torch.cat([head, own]))
                grouped.add(r)
                start += lens[r] - shared
        for r, n in enumerate(lens):
            if r not in grouped:
                src[r, :n] = torch.arange(start, start + n)
                segment(r, 0, n, torch.arange(start, start + n))
                start += n
        k_len = torch.tensor([k.numel() for k in kv], dtype=torch.long)
        positions = torch.cat(pos)
        rows_of_tokens = torch.repeat_interleave(torch.tensor(owner, dtype=torch.long), torch.tensor(q_len))
        return cls(src=src, origin=torch.stack([rows_of_tokens, positions]),
                   lengths=torch.tensor(lens, dtype=torch.long),
                   q_bounds=torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(q_len).cumsum(0)]),
                   k_bounds=torch.cat([torch.zeros(1, dtype=torch.long), k_len.cumsum(0)]),
                   kv_index=torch.cat(kv), positions=positions)

    @property
    def total(self) -> int:
        """Tokens in the packed sequence."""
        return int(self.q_bounds[-1])

    @property
    def num_rows(self) -> int:
        return int(self.lengths.numel())

    def bounds(self) -> torch.Tensor:
        """[S + 1] long (CPU): the segments' boundaries (the queries' `cu_seq_lens`)."""
        return self.q_bounds

    def position_ids(self) -> torch.Tensor:
        """[1, total] long: each token's position in its row (a row segment continues its prefix)."""
        return self.positions.unsqueeze(0)

    def pack(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, L] right-padded rows → [1, total]: the value of the (row, token) each packed position
        holds (`origin`; its group's rows agree on a shared token). Bool rows (the tokens to score)
        mark instead the positions rows read their scored log-probs from (`src`; any row's mark)."""
        if rows.dtype == torch.bool:
            valid = (self.src[:, :rows.shape[1]] >= 0) & rows.cpu()
            out = torch.zeros(self.total, dtype=torch.bool)
            return out.index_fill_(0, self.src[:, :rows.shape[1]][valid], True).unsqueeze(0)
        return rows[self.origin[0].to(rows.device), self.origin[1].to(rows.device)].unsqueeze(0)

    def unpack(self, packed: torch.Tensor, length: int) -> torch.Tensor:
        """[1, total] per-token values → [R, length] rows (0 past each row's end); differentiable."""
        src = self.src[:, :length]
        out = packed[0, to_device(src.clamp(min=0), packed.device)]
        return out * to_device(src >= 0, out.device, out.dtype)
