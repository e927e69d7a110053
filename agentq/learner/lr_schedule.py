"""The learning rate of each RL step: linear warmup, then constant, linear or cosine decay.

A pure function of the step (not an optimizer-side scheduler with state), so a resumed run is on
the same curve without saving anything, and every data-parallel rank gets the same value. The rate
is held for the whole RL step (all its PPO epochs and minibatches), as one RL step is one batch of
rollouts from one policy.
"""
from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, steps: int, warmup_steps: int = 0, schedule: str = "constant",
              min_ratio: float = 0.0) -> float:
    """The multiple of `trainer.lr` at RL step `step` (0-based) of a run of `steps`.

    Warmup: steps 0 … W−1 take (step + 1) / W, so no step runs at a zero rate. After it, with
    p = (step − W) / (steps − W) ∈ [0, 1): constant 1; linear 1 − (1 − m)·p; cosine
    m + (1 − m)·(1 + cos πp) / 2, where m = `min_ratio` (the floor the decay heads for: reached at
    step `steps`, one past the last).

    Args:
        step: the RL step about to update (0-based; a resumed run passes its own step).
        steps: the run's total RL steps (`trainer.steps`).
        warmup_steps: W ≥ 0.
        schedule: one of `SCHEDULES`.
        min_ratio: m ∈ [0, 1].
    Returns:
        The factor, in (0, 1] (m·… ≥ 0 for the decays when m = 0 only at step `steps`).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr schedule {schedule!r}; valid: {list(SCHEDULES)}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"lr min ratio {min_ratio}: must be in [0, 1]")
    if warmup_steps < 0 or steps < 1 or step < 0:
        raise ValueError(f"lr schedule at step {step} of {steps} with {warmup_steps} warmup steps")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    p = (step - warmup_steps) / max(1, steps - warmup_steps)
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * p
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
