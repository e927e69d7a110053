"""Episode metrics shared by training logs and evaluation reports."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Union

import numpy as np

from agentq.agent.trajectory import END_REASONS, Trajectory

#: one task's outcomes in `paired_comparison`: its one episode's, or every episode's
Outcomes = Union[bool, Sequence[bool]]


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
    by_task = outcomes_by_task(won_by_episode)
    n, k = len(won_by_episode), sum(won for _, won in won_by_episode)
    if n == 0 or len(by_task) == n:
        return wilson_interval(k, n, z)
    p = k / n
    n_eff = effective_sample_size([sum(v) for v in by_task.values()], [len(v) for v in by_task.values()])
    return wilson_interval(p * n_eff, n_eff, z)


def outcomes_by_task(won_by_episode: Iterable[tuple[str, bool]]) -> dict[str, list[bool]]:
    """task id → the outcomes of all its episodes, in order (repeats and seeds kept)."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for task, won in won_by_episode:
        by_task[task].append(bool(won))
    return dict(by_task)


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


#: the sign-flip test's null distribution is enumerated exactly up to this much work (tasks × reachable
#: sums); beyond it, MC_DRAWS random sign patterns drawn with MC_SEED (the same p every time a table is written)
EXACT_WORK = 5 * 10**7
MC_DRAWS, MC_SEED = 100_000, 0


def paired_comparison(before: Mapping[str, Outcomes], after: Mapping[str, Outcomes]) -> dict:
    """Paired test of `after` against `before` over the tasks both evaluations played: the two-sided
    sign-flip permutation test on the per-task differences of mean success d_t = after − before.

    Pairing by task removes the between-task variance (an easy task is easy for both policies), which
    the unpaired z counts as noise. A task is one unit however many episodes it had on either side
    (`eval.repeats`, the sweep's seeds): its episodes are not independent, so pairing them one by one
    would overstate the evidence, and pairing only one of them would throw the others away. Under the
    null (each d_t symmetric about 0) all 2^n sign patterns of the d_t are equally likely; p is the
    share whose |Σ ±d_t| reaches the observed |Σ d_t|. A task with d_t = 0 is the same under a flip,
    so it contributes nothing; with no task left p = 1. With no task in common there is no test at
    all: p and z are NaN and the test is NO_PAIRS (not McNemar's p = 1, as if the tasks had been
    played alike). With one episode per task on each side,
    d_t ∈ {−1, 0, 1} and this is exactly McNemar's exact test, p = min(1, 2·P(Bin(b + c, ½) ≤ min(b, c))).

    Σ ±d_t is enumerated exactly (d_t scaled to integers, one convolution per task) unless that is
    more than EXACT_WORK steps; then Monte-Carlo: p = (1 + hits) / (1 + MC_DRAWS), seed MC_SEED.

    Args:
        before, after: task id → its episode's outcome (won), or the outcomes of all its episodes.
    Returns:
        pairs (tasks both played), episodes_before / episodes_after (their episodes on each side),
        won_only_after / won_only_before (tasks with d_t > 0 / d_t < 0: with one episode each, the
        tasks won only after / only before), mcnemar_z = Σd / √Σd² (McNemar's (b − c)/√(b + c) with
        one episode each; 0 when no task differs), mcnemar_p (the two-sided p) and test (which
        test gave p: `paired_test_name`); with pairs = 0, z and p NaN and test NO_PAIRS.
    Raises:
        ValueError: a task with no outcomes, or an outcome that is not a bool (or 0 / 1).
    """
    common = sorted(set(before) & set(after))
    was = {t: _task_outcomes(t, before[t]) for t in common}
    now = {t: _task_outcomes(t, after[t]) for t in common}
    diffs = [Fraction(sum(now[t]), len(now[t])) - Fraction(sum(was[t]), len(was[t])) for t in common]
    nonzero = [d for d in diffs if d]
    p, draws = sign_flip_p(nonzero)
    ss = float(sum(d * d for d in nonzero))
    if not common:
        test = NO_PAIRS
    elif draws:
        test = f"Monte-Carlo sign-flip over tasks ({draws} draws, seed {MC_SEED})"
    elif all(len(was[t]) == len(now[t]) == 1 for t in common):
        test = "exact McNemar"
    else:
        test = "exact sign-flip over tasks"
    return {"pairs": len(common), "episodes_before": sum(map(len, was.values())),
            "episodes_after": sum(map(len, now.values())),
            "won_only_after": sum(d > 0 for d in nonzero), "won_only_before": sum(d < 0 for d in nonzero),
            "mcnemar_z": (float(sum(nonzero)) / math.sqrt(ss) if ss else 0.0) if common else math.nan,
            "mcnemar_p": p if common else math.nan, "test": test}


#: `paired_comparison`'s test when the two evaluations share no task: there is none, p is NaN
NO_PAIRS = "none (no shared tasks)"


def paired_test_name(paired: Mapping) -> str:
    """The test behind a `paired_comparison`'s p; results written before it was recorded were McNemar's,
    and those without a shared task (which recorded McNemar's p = 1) had none."""
    if paired.get("pairs") == 0:
        return NO_PAIRS
    return str(paired.get("test", "exact McNemar"))


def _task_outcomes(task: str, v: Outcomes) -> list[bool]:
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not vals:
        raise ValueError(f"paired_comparison: task {task!r} has no episodes")
    for x in vals:
        if not (isinstance(x, (bool, np.bool_)) or (type(x) is int and x in (0, 1))):
            raise ValueError(f"paired_comparison: task {task!r}: an outcome must be won or lost (a bool or 0 / 1), "
                             f"got {x!r}")
    return [bool(x) for x in vals]


def sign_flip_p(diffs: Sequence[Fraction]) -> tuple[float, int]:
    """Two-sided p of the sign-flip test of Σ d (`paired_comparison`), and the Monte-Carlo draws it
    took (0: exact)."""
    diffs = [d for d in diffs if d]                       # a zero is the same flipped: no information
    if not diffs:
        return 1.0, 0
    scale = math.lcm(*(d.denominator for d in diffs))
    ints = [int(d * scale) for d in diffs]                # exact: integer sums, no ties lost to rounding
    observed, total = abs(sum(ints)), sum(map(abs, ints))
    if len(ints) * (2 * total + 1) <= EXACT_WORK:
        prob = np.zeros(2 * total + 1)                    # P(Σ ±d = s) at index s + total
        prob[total] = 1.0
        for k in map(abs, ints):
            prob = 0.5 * (np.concatenate([np.zeros(k), prob[:-k]]) + np.concatenate([prob[k:], np.zeros(k)]))
        sums = np.abs(np.arange(-total, total + 1))
        return min(1.0, float(prob[sums >= observed].sum())), 0
    d = np.array([float(x) for x in diffs])
    limit = abs(d.sum()) - 1e-9 * np.abs(d).sum()        # a float tie with the observed sum counts as reached
    rng, hits, chunk = np.random.default_rng(MC_SEED), 0, max(1, 2**22 // len(d))
    for start in range(0, MC_DRAWS, chunk):
        signs = rng.choice((-1.0, 1.0), size=(min(chunk, MC_DRAWS - start), len(d)))
        hits += int((np.abs(signs @ d) >= limit).sum())
    return (1 + hits) / (1 + MC_DRAWS), MC_DRAWS


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(trajs: list[Trajectory]) -> dict:
    """success_rate, score_mean (an errored episode's score as 0), turns_success_mean (turns of won episodes), cap_rate (share that ran
    out of steps without winning), per end reason shares, the shares of turns with no parsable action
    (invalid) and with an action outside the env's admissible list (inadmissible), per task type."""
    n = len(trajs)
    won = sum(t.won for t in trajs)
    out = {
        "episodes": n,
        "success_rate": won / n if n else float("nan"),
        "success_ci95": list(success_interval([(t.task_id, t.won) for t in trajs])),
        "score_mean": _mean(_score(t) for t in trajs),
        "reward_mean": _mean(t.reward for t in trajs),
        "turns_mean": _mean(t.turns for t in trajs),
        "turns_success_mean": _mean(t.turns for t in trajs if t.won),
        "cap_rate": _mean(float(t.end_reason == "step_cap" and not t.won) for t in trajs),
        "invalid_action_rate": (sum(t.invalid_actions for t in trajs) / max(1, sum(t.turns for t in trajs))),
        # NaN where no env listed its admissible actions (ScienceWorld's default): not measured, not 0
        "inadmissible_action_rate": (sum(t.inadmissible_actions for t in trajs) / max(1, sum(t.turns for t in trajs))
                                     if any(t.admissible_turns for t in trajs) else float("nan")),
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
                                    "score_mean": _mean(_score(t) for t in v)} for k, v in sorted(by_type.items())}
    return out


def _score(t: Trajectory) -> float:
    """An episode's score in the means: 0 for one that errored, which counts as lost, as for success (a
    JVM killed mid-episode kept its partial score, 2.1 of a mean's 3.5 points in a review's run)."""
    return 0.0 if t.end_reason == "error" else float(t.score)


#: the worker counts that step rows, evaluation reports and train_summary.json's `totals` carry
WORKER_COUNTS = ("env_worker_restarts", "rollout_worker_restarts", "env_recovered_episodes")


def worker_counts(pool: Any, backend: Any) -> dict[str, int]:
    """The env pool's and the rollout backend's worker restarts so far (`WorkerPool.restarts`,
    `DistributedBackend.restarts`) and the episodes whose reset was retried on a restarted env worker
    (`WorkerPool.recovered_episodes`), by `WORKER_COUNTS` key; 0 for what has no workers to restart.
    The counts only grow: the difference of two readings is what happened between them."""
    return {"env_worker_restarts": int(getattr(pool, "restarts", 0)),
            "rollout_worker_restarts": int(getattr(backend, "restarts", 0)),
            "env_recovered_episodes": int(getattr(pool, "recovered_episodes", 0))}


def counts_since(before: Mapping[str, int], now: Mapping[str, int]) -> dict[str, int]:
    """`worker_counts` now less an earlier reading: what happened in between."""
    return {k: v - before.get(k, 0) for k, v in now.items()}


def run_totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """A run's totals over its metrics.jsonl rows (a resumed run's earlier steps too), for
    train_summary.json.

    Args:
        rows: metrics.jsonl's rows: step rows (`errored_episodes` and the `WORKER_COUNTS` of the step)
            and evaluation rows (`eval/errors` and `eval/` + the `WORKER_COUNTS` of the evaluation).
    Returns:
        `errored_episodes` (training episodes), `eval_errored_episodes`, and each `WORKER_COUNTS` key
        summed over the steps and the evaluations (a row written before a key existed counts 0).
    """
    rows = list(rows)
    out = {"errored_episodes": sum(int(r.get("errored_episodes") or 0) for r in rows),
           "eval_errored_episodes": sum(int(r.get("eval/errors") or 0) for r in rows)}
    for k in WORKER_COUNTS:
        out[k] = sum(int(r.get(k) or 0) + int(r.get(f"eval/{k}") or 0) for r in rows)
    return out


def aulc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Area under the evaluation curve normalised by training length (trapezoid)."""
    if len(steps) < 2 or steps[-1] == steps[0]:
        return values[0] if values else float("nan")
    area = sum((steps[k] - steps[k - 1]) * (values[k] + values[k - 1]) / 2 for k in range(1, len(steps)))
    return area / (steps[-1] - steps[0])
