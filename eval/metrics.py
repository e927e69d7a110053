"""Episode metrics shared by training logs and evaluation reports."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from agentq.agent.trajectory import END_REASONS, Trajectory


def wilson_interval(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion k/n (`n` may be an effective sample size,
    not a whole number: `success_interval`)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def success_interval(won_by_episode: Sequence[tuple[str, bool]], z: float = 1.96) -> tuple[float, float]:
    """95 % interval of the success rate when a task may be played more than once (`eval.repeats`).

    Repeats of one task are not independent (an easy task is won every time), so a Wilson interval
    over all n episodes is too narrow. This is the Wilson interval on the effective sample size
    n_eff = n / DE, with Kish's design effect DE = 1 + (m̄ − 1)·ICC (m̄: mean episodes per task) and
    the intra-task correlation ICC from the one-way ANOVA of the 0/1 outcomes by task, clipped to
    [0, 1] (a negative estimate would make the interval narrower than the independent one). Where
    the ICC cannot be estimated (one task, or every episode the same outcome) each task counts as
    one episode (n_eff = the number of tasks). With every task played once, n_eff = n: the plain
    Wilson interval of k/n.

    Args:
        won_by_episode: (task id, won) per episode.
        z: the normal quantile (1.96: 95 %).
    Returns:
        (low, high); NaN for no episodes.
    """
    by_task: dict[str, list[bool]] = defaultdict(list)
    for task, won in won_by_episode:
        by_task[task].append(bool(won))
    n, k = len(won_by_episode), sum(won for _, won in won_by_episode)
    if n == 0 or len(by_task) == n:
        return wilson_interval(k, n, z)
    p = k / n
    n_eff = effective_sample_size([sum(v) for v in by_task.values()], [len(v) for v in by_task.values()])
    return wilson_interval(p * n_eff, n_eff, z)


def effective_sample_size(wins: Sequence[int], sizes: Sequence[int]) -> float:
    """n / DE of 0/1 outcomes in clusters (`success_interval`): `wins[i]` of `sizes[i]` won in task i."""
    n, n_tasks = sum(sizes), len(sizes)
    p = sum(wins) / n
    msb = sum(m * (w / m - p) ** 2 for w, m in zip(wins, sizes)) / max(1, n_tasks - 1)  # between tasks
    msw = sum(w * (1 - w / m) for w, m in zip(wins, sizes)) / (n - n_tasks)             # within a task
    m0 = (n - sum(m * m for m in sizes) / n) / max(1, n_tasks - 1)      # the ANOVA's mean task size
    if n_tasks < 2 or msb + (m0 - 1) * msw == 0:
        return float(n_tasks)       # no estimate of the correlation: each task one episode
    icc = min(1.0, max(0.0, (msb - msw) / (msb + (m0 - 1) * msw)))
    return n / (1 + (n / n_tasks - 1) * icc)


def two_proportion_z(k1: int, n1: int, k2: int, n2: int) -> float:
    """Unpaired z of p2 − p1 under the pooled null (how many standard errors p2 is above p1)."""
    p = (k1 + k2) / (n1 + n2)
    se = math.sqrt(max(p * (1 - p) * (1 / n1 + 1 / n2), 1e-12))
    return (k2 / n2 - k1 / n1) / se


def paired_comparison(before: dict[str, bool], after: dict[str, bool]) -> dict:
    """McNemar's test on the tasks both evaluations played (one episode per task in each).

    Pairing by task removes the between-task variance (an easy task is easy for both policies),
    which the unpaired z counts as noise; only the discordant tasks carry information.
    Returns the pair count, the discordant counts, z = (b − c)/√(b + c) and the exact two-sided
    binomial p-value of the discordant split."""
    common = sorted(set(before) & set(after))
    b = sum(1 for t in common if after[t] and not before[t])     # won only after
    c = sum(1 for t in common if before[t] and not after[t])     # won only before
    n = b + c
    z = (b - c) / math.sqrt(n) if n else 0.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n if n else 1.0
    return {"pairs": len(common), "won_only_after": b, "won_only_before": c, "mcnemar_z": z,
            "mcnemar_p": min(1.0, 2 * tail)}


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(trajs: list[Trajectory]) -> dict:
    """success_rate, score_mean, turns_success_mean (turns of won episodes), cap_rate (share that ran
    out of steps without winning), per end reason shares, the shares of turns with no parsable action
    (invalid) and with an action outside the env's admissible list (inadmissible), per task type."""
    n = len(trajs)
    won = sum(t.won for t in trajs)
    out = {
        "episodes": n,
        "success_rate": won / n if n else float("nan"),
        "success_ci95": list(success_interval([(t.task_id, t.won) for t in trajs])),
        "score_mean": _mean(t.score for t in trajs),
        "reward_mean": _mean(t.reward for t in trajs),
        "turns_mean": _mean(t.turns for t in trajs),
        "turns_success_mean": _mean(t.turns for t in trajs if t.won),
        "cap_rate": _mean(float(t.end_reason == "step_cap" and not t.won) for t in trajs),
        "invalid_action_rate": (sum(t.invalid_actions for t in trajs) / max(1, sum(t.turns for t in trajs))),
        "inadmissible_action_rate": (sum(t.inadmissible_actions for t in trajs) / max(1, sum(t.turns for t in trajs))),
        "errors": sum(t.end_reason == "error" for t in trajs),
        # ended before their first turn: the first prompt did not fit the context budget
        "unplayed": sum(t.end_reason == "context" and t.turns == 0 for t in trajs),
    }
    for r in END_REASONS:
        out[f"end_{r}"] = _mean(float(t.end_reason == r) for t in trajs)
    by_type = defaultdict(list)
    for t in trajs:
        if t.info.get("task_type"):
            by_type[t.info["task_type"]].append(t)
    if len(by_type) > 1 or (by_type and n > 0):
        out["per_task_type"] = {k: {"episodes": len(v), "success_rate": _mean(float(t.won) for t in v),
                                    "score_mean": _mean(t.score for t in v)} for k, v in sorted(by_type.items())}
    return out


def aulc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Area under the evaluation curve normalised by training length (trapezoid)."""
    if len(steps) < 2 or steps[-1] == steps[0]:
        return values[0] if values else float("nan")
    area = sum((steps[k] - steps[k - 1]) * (values[k] + values[k - 1]) / 2 for k in range(1, len(steps)))
    return area / (steps[-1] - steps[0])
