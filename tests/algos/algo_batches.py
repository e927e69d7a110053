"""Small PolicyBatch builders shared by the tests in tests/algos (imported by name: pytest puts this
folder on sys.path because it has no __init__.py)."""
from __future__ import annotations

import torch

from agentq.learner.batch import PolicyBatch

# the InterQ-RL worked example of docs/algorithms.md: one trajectory, 18 tokens, P P P P | A A A | O O O | A A | O O | A A A A
EX_ACTION_MASK = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1]
EX_SEG_ID = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 2, 2, 0, 0, 3, 3, 3, 3]
EX_DELTA = [0, 0, 0, 0, 0.02, -0.03, 0.01, 0, 0, 0, 0.10, -0.05, 0, 0, -0.20, 0.05, 0.00, 0.15]


def make_batch(action_mask, seg_id, delta, adv=None, rollout_logp=None, ref_logp=None, traj_id=None,
               dtype=torch.float32) -> PolicyBatch:
    """A batch whose old_logp = rollout_logp + δ (so δ_t = old − rollout is exactly what was asked)."""
    action_mask = torch.as_tensor(action_mask, dtype=torch.float32)
    if action_mask.dim() == 1:
        action_mask, seg_id, delta = action_mask[None], [seg_id], [delta]
    B, L = action_mask.shape
    seg_id = torch.as_tensor(seg_id, dtype=torch.long).view(B, L)
    delta = torch.as_tensor(delta, dtype=torch.float64).view(B, L)
    if rollout_logp is None:   # a fixed, non-trivial log-prob per position
        rollout_logp = -0.5 - 0.1 * torch.arange(L, dtype=torch.float64).remainder(7).expand(B, L)
    rollout_logp = torch.as_tensor(rollout_logp, dtype=torch.float64).view(B, L)
    adv = torch.ones(B) if adv is None else torch.as_tensor(adv, dtype=torch.float32)
    return PolicyBatch(
        input_ids=torch.zeros(B, L, dtype=torch.long), attention_mask=torch.ones(B, L),
        action_mask=action_mask, seg_id=seg_id,
        rollout_logp=rollout_logp.to(dtype), old_logp=(rollout_logp + delta).to(dtype),
        ref_logp=None if ref_logp is None else torch.as_tensor(ref_logp, dtype=dtype).view(B, L),
        adv=adv, traj_id=None if traj_id is None else torch.as_tensor(traj_id, dtype=torch.long))


def example_batch(dtype=torch.float64, **kw) -> PolicyBatch:
    """The InterQ-RL worked example (docs/algorithms.md) as a one-row batch. float64 log-probs by default, so δ is exactly the
    printed value (float32 storage of log π ≈ −1 moves δ by ~3e-8, k3 of δ = 0.02 by ~1e-5 relative)."""
    return make_batch(EX_ACTION_MASK, EX_SEG_ID, EX_DELTA, dtype=dtype, **kw)


def random_trajectories(gen: torch.Generator, n_traj: int, max_seg: int = 6, max_tok: int = 5,
                        max_obs: int = 3, scale: float = 0.3):
    """Random multi-turn trajectories as lists of segments: each segment is (obs_len, [δ of its action
    tokens]); obs_len observation tokens precede the segment's action tokens. Segments may be empty."""
    trajs = []
    for _ in range(n_traj):
        S = int(torch.randint(1, max_seg + 1, (1,), generator=gen))
        segs = []
        for _ in range(S):
            n = int(torch.randint(0 if S > 1 else 1, max_tok + 1, (1,), generator=gen))
            d = (scale * torch.randn(n, generator=gen, dtype=torch.float64)).tolist()
            segs.append((int(torch.randint(0, max_obs + 1, (1,), generator=gen)), d))
        if all(len(d) == 0 for _, d in segs):          # at least one action token per trajectory
            segs[-1] = (segs[-1][0], [0.1])
        trajs.append(segs)
    return trajs


def concat_layout(trajs, prompt_len: int = 3, adv=None) -> PolicyBatch:
    """One row per trajectory: [prompt] [O A] [O A] … padded to a common length. Observation, prompt
    and padding positions hold junk log-probs (rollout NaN, old 50.0): δ, k3 and α must never read them."""
    rows = []
    for segs in trajs:
        mask, seg, delta = [0] * prompt_len, [0] * prompt_len, [0.0] * prompt_len
        for s, (obs, d) in enumerate(segs, start=1):
            mask += [0] * obs + [1] * len(d)
            seg += [0] * obs + [s] * len(d)
            delta += [0.0] * obs + list(d)
        rows.append((mask, seg, delta))
    return _pad_rows(rows, adv)


def split_layout(trajs, prompt_len: int = 3) -> PolicyBatch:
    """Step-independent layout: one row per (trajectory, turn), rows of one trajectory
    share a traj_id; the row's prompt (re-rendered history) is never an action. Empty turns get no row."""
    rows, traj_ids = [], []
    for i, segs in enumerate(trajs):
        for s, (obs, d) in enumerate(segs, start=1):
            if not d:
                continue
            hist = prompt_len + obs + 2 * s                 # some history text in the prompt
            rows.append(([0] * hist + [1] * len(d), [0] * hist + [s] * len(d), [0.0] * hist + list(d)))
            traj_ids.append(100 + 7 * i)                    # arbitrary, non-dense ids
    b = _pad_rows(rows, None)
    b.traj_id = torch.tensor(traj_ids)
    return b


def _pad_rows(rows, adv) -> PolicyBatch:
    L = max(len(m) for m, _, _ in rows)
    pad = lambda xs, v: [list(x) + [v] * (L - len(x)) for x in xs]  # noqa: E731
    mask = torch.tensor(pad([r[0] for r in rows], 0), dtype=torch.float32)
    # rollout log-prob −1 on every action token: a token's (rollout, old) pair is then bit-identical in
    # every layout, as in real data where the log-probs travel with the token
    b = make_batch(mask, pad([r[1] for r in rows], 0), pad([r[2] for r in rows], 0.0), adv=adv,
                   rollout_logp=torch.full(mask.shape, -1.0))
    off = ~mask.bool()                                      # observation, prompt and padding tokens
    b.old_logp = torch.where(off, torch.full_like(b.old_logp, 50.0), b.old_logp)
    b.rollout_logp = torch.where(off, torch.full_like(b.rollout_logp, float("nan")), b.rollout_logp)
    return b


def prepared(objective, batch: PolicyBatch) -> tuple[PolicyBatch, dict]:
    """The batch with `objective.prepare`'s weights attached, and its stats (what the trainer does)."""
    prep = objective.prepare(batch)
    return batch.weighted(prep), prep.stats
