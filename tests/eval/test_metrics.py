"""The success rate's interval with `eval.repeats > 1`: repeats of one task are not independent
episodes, so the interval is Wilson's on the effective sample size (design effect by hand); and the
paired test over tasks (the sign-flip test; McNemar's with one episode per task)."""
from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest

from agentq.agent.trajectory import Trajectory
from agentq.eval import metrics
from agentq.eval.metrics import paired_comparison, success_interval, summarize, wilson_interval


def episodes(outcomes: dict[str, list[bool]]) -> list[tuple[str, bool]]:
    return [(task, won) for task, wins in outcomes.items() for won in wins]


def test_each_task_once_is_the_plain_wilson_interval():
    played = episodes({"a": [True], "b": [False], "c": [True], "d": [False], "e": [False]})
    assert success_interval(played) == wilson_interval(2, 5)
    assert all(math.isnan(x) for x in success_interval([]))     # as wilson_interval(0, 0)


def test_repeats_of_a_task_widen_the_interval_by_the_design_effect():
    # 3 tasks × 2 repeats, 3 of 6 won: a always, b never, c once. One-way ANOVA by task (p = 0.5):
    # MSB = (2·0.25 + 2·0.25 + 0) / 2 = 0.5; MSW = (0 + 0 + 2·0.25) / (6 − 3) = 1/6; m0 = (6 − 12/6) / 2 = 2
    # ICC = (0.5 − 1/6) / (0.5 + 1/6) = 0.5; DE = 1 + (2 − 1)·0.5 = 1.5; n_eff = 6 / 1.5 = 4, k_eff = 2
    played = episodes({"a": [True, True], "b": [False, False], "c": [True, False]})
    lo, hi = success_interval(played)
    assert (lo, hi) == pytest.approx(wilson_interval(2, 4))
    assert (lo, hi) == pytest.approx((0.15004, 0.84996), abs=1e-5)
    assert wilson_interval(3, 6) == pytest.approx((0.18761, 0.81239), abs=1e-5)    # the too narrow one


def test_without_an_estimate_of_the_correlation_each_task_is_one_episode():
    # every episode lost: no variance to split, so 2 tasks × 3 repeats count as 2 episodes
    assert success_interval(episodes({"a": [False] * 3, "b": [False] * 3})) == pytest.approx(wilson_interval(0, 2))
    # one task: its between-task variance is unknown
    assert success_interval(episodes({"a": [True, False, True, False]})) == pytest.approx(wilson_interval(0.5, 1))
    # a negative correlation (tasks more alike than their repeats) never narrows the interval below n episodes
    played = episodes({"a": [True, False], "b": [True, False]})
    assert success_interval(played) == pytest.approx(wilson_interval(2, 4))


def test_summarize_reports_the_interval_by_task():
    trajs = [Trajectory(i, task, "test", won=won, end_reason="won" if won else "step_cap")
             for i, (task, won) in enumerate(episodes({"a": [True, True], "b": [False, False], "c": [True, False]}))]
    assert summarize(trajs)["success_ci95"] == pytest.approx(list(wilson_interval(2, 4)))
    assert summarize(trajs[::2])["success_ci95"] == list(wilson_interval(2, 3))    # one episode per task: unchanged


def test_an_errored_episode_scores_zero_in_the_means_as_it_counts_lost_for_success():
    """A JVM killed mid-episode left partial scores in score_mean (2.1 of 3.5 points in a review's run)."""
    trajs = [Trajectory(0, "a", "test", won=True, score=1.0, end_reason="won"),
             Trajectory(1, "a", "test", score=0.25, end_reason="step_cap"),
             Trajectory(2, "b", "test", score=0.17, end_reason="error")]
    for t in trajs:
        t.info["task_type"] = t.task_id
    out = summarize(trajs)
    assert out["score_mean"] == pytest.approx((1.0 + 0.25 + 0.0) / 3, abs=1e-15)
    assert out["success_rate"] == pytest.approx(1 / 3, abs=1e-15)
    assert out["per_task_type"]["b"] == {"episodes": 1, "success_rate": 0.0, "score_mean": 0.0}


# ---------------------------------------------------------------------- the paired test over tasks
def brute_force_sign_flip(before: dict[str, list[bool]], after: dict[str, list[bool]]) -> Fraction:
    """Independent of `paired_comparison`: every one of the 2^n sign patterns of the per-task
    differences of mean success (zeros included: they change nothing), counted in exact fractions."""
    common = sorted(set(before) & set(after))
    d = [Fraction(sum(after[t]), len(after[t])) - Fraction(sum(before[t]), len(before[t])) for t in common]
    observed = abs(sum(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= observed
               for signs in itertools.product((-1, 1), repeat=len(d)))
    return Fraction(hits, 2 ** len(d))


def old_mcnemar_p(b: int, c: int) -> float:
    """The exact McNemar p the pipeline and sweep reported before: 2·P(Bin(b + c, ½) ≤ min(b, c)), capped at 1."""
    n = b + c
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n) if n else 1.0


def test_with_repeats_every_episode_of_a_task_counts_by_hand():
    # 2 episodes per task on each side. d = after − before per task: a 0 → 1 = +1, b ½ → 1 = +½,
    # c ½ → 0 = −½, d 1 → 1 = 0 (no information). Observed Σd = 1. The 8 patterns ±1 ±½ ±½ sum to
    # 2, 1, 1, 0, 0, −1, −1, −2: six reach |1|, p = 6/8. z = 1 / √(1 + ¼ + ¼) = 0.816497.
    before = {"a": [False, False], "b": [False, True], "c": [True, False], "d": [True, True]}
    after = {"a": [True, True], "b": [True, True], "c": [False, False], "d": [True, True]}
    r = paired_comparison(before, after)
    assert r["mcnemar_p"] == 0.75 and r["mcnemar_z"] == pytest.approx(0.816497, abs=1e-6)
    assert (r["pairs"], r["episodes_before"], r["episodes_after"]) == (4, 8, 8)
    assert (r["won_only_after"], r["won_only_before"]) == (2, 1) and r["test"] == "exact sign-flip over tasks"
    # pairing only the last episode of each task (as before) saw a 0→1, b 1→1, c 0→0, d 1→1:
    # one discordant task, p = 1, and the first episodes' a 0→1, b 0→1, c 1→0 were thrown away
    assert paired_comparison({t: v[-1] for t, v in before.items()}, {t: v[-1] for t, v in after.items()})[
        "mcnemar_p"] == 1.0


def test_unequal_episode_counts_by_hand():
    # d: t1 0 → 1 = 1, t2 0 → 1 = 1, t3 0 → ⅔, t4 ½ → 1 = ½, t5 1 → ¼ = −¾; ×12: 12, 12, 8, 6, −9,
    # Σ = 29 of at most 47. Flipping a set F of them gives 47 − 2·ΣF, which reaches |29| iff ΣF ≤ 9 or
    # ΣF ≥ 38: F = {}, {8}, {6}, {9} (every other set sums to ≥ 12 + 0 or ≥ 6 + 8) and their
    # complements: 8 of 32, p = 0.25. z = (29/12) / √((144 + 144 + 64 + 36 + 81)/144) = 29/√469.
    before = {"t1": [False], "t2": [False, False], "t3": [False] * 3, "t4": [False, True], "t5": [True]}
    after = {"t1": [True] * 3, "t2": [True, True], "t3": [True, False, True], "t4": [True],
             "t5": [True, False, False, False], "only_after": [True]}
    r = paired_comparison(before, after)
    assert r["mcnemar_p"] == pytest.approx(0.25, abs=1e-12) and r["mcnemar_z"] == pytest.approx(29 / math.sqrt(469))
    assert (r["pairs"], r["episodes_before"], r["episodes_after"]) == (5, 9, 13)   # only_after is unpaired
    assert brute_force_sign_flip(before, after) == Fraction(1, 4)


def test_one_episode_each_is_exactly_mcnemar():
    """Every (b, c) with b + c ≤ 14, padded with concordant tasks: the sign-flip p is the old exact
    McNemar p, and the test is named so."""
    for b in range(15):
        for c in range(15 - b):
            before = {f"t{i}": i >= b for i in range(b + c + 3)}        # tasks ≥ b + c: won on both sides
            after = {f"t{i}": i < b or i >= b + c for i in range(b + c + 3)}
            r = paired_comparison(before, after)
            assert (r["won_only_after"], r["won_only_before"], r["pairs"]) == (b, c, b + c + 3)
            assert r["mcnemar_p"] == pytest.approx(old_mcnemar_p(b, c), abs=1e-12), (b, c)
            assert r["mcnemar_z"] == pytest.approx((b - c) / math.sqrt(b + c) if b + c else 0.0)
            assert r["test"] == "exact McNemar"
    # the McNemar numbers of tests/trainer/test_pipeline.py, as one-episode lists
    r = paired_comparison({str(i): [i >= 8] for i in range(12)}, {str(i): [i < 8 or i >= 9] for i in range(12)})
    assert (r["won_only_after"], r["won_only_before"]) == (8, 1) and r["mcnemar_p"] == pytest.approx(0.0390625)


def test_the_exact_p_is_the_brute_force_enumeration_on_random_cases():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 10)
        before = {f"t{i}": [rng.random() < 0.4 for _ in range(rng.randint(1, 4))] for i in range(n)}
        after = {f"t{i}": [rng.random() < 0.6 for _ in range(rng.randint(1, 4))] for i in range(n)}
        assert paired_comparison(before, after)["mcnemar_p"] == pytest.approx(
            float(brute_force_sign_flip(before, after)), abs=1e-12)


def test_no_difference_gives_p_one_and_monte_carlo_is_seeded(monkeypatch):
    same = {"a": [True, False], "b": [False], "c": [True, True, True]}
    r = paired_comparison(same, {"a": [False, True], "b": [False], "c": [True]})
    assert (r["mcnemar_p"], r["mcnemar_z"], r["won_only_after"], r["won_only_before"]) == (1.0, 0.0, 0, 0)
    assert paired_comparison({"a": True}, {"b": True})["pairs"] == 0          # nothing in common
    # beyond the exact budget: Monte-Carlo with a fixed seed, close to the exact p and the same every time
    before = {"t1": [False], "t2": [False, False], "t3": [False] * 3, "t4": [False, True], "t5": [True]}
    after = {"t1": [True] * 3, "t2": [True, True], "t3": [True, False, True], "t4": [True], "t5": [True, False, False, False]}
    monkeypatch.setattr(metrics, "EXACT_WORK", 0)
    r = paired_comparison(before, after)
    assert r["test"] == "Monte-Carlo sign-flip over tasks (100000 draws, seed 0)"
    assert r["mcnemar_p"] == pytest.approx(0.25, abs=0.01)       # 7 standard errors of 1e5 draws
    assert paired_comparison(before, after)["mcnemar_p"] == r["mcnemar_p"]


def test_no_shared_task_is_no_test_not_mcnemar_p_one():
    """Two evaluations of disjoint tasks were reported as "exact McNemar, p = 1", as if every task had
    been played alike; there is no test at all (and an older result with pairs 0 is read so too)."""
    r = paired_comparison({"a": True, "b": False}, {"c": True})
    assert (r["pairs"], r["episodes_before"], r["episodes_after"], r["won_only_after"], r["won_only_before"]) == \
        (0, 0, 0, 0, 0)
    assert math.isnan(r["mcnemar_p"]) and math.isnan(r["mcnemar_z"])
    assert r["test"] == metrics.NO_PAIRS == "none (no shared tasks)" == metrics.paired_test_name(r)
    assert metrics.paired_test_name({"pairs": 0, "mcnemar_p": 1.0, "test": "exact McNemar"}) == "none (no shared tasks)"
    assert metrics.paired_test_name({"pairs": 3, "mcnemar_p": 1.0}) == "exact McNemar"      # older, with pairs


def test_bad_outcomes_are_refused():
    with pytest.raises(ValueError, match="task 'a' has no episodes"):
        paired_comparison({"a": []}, {"a": [True]})
    with pytest.raises(ValueError, match=r"task 'a': an outcome must be won or lost \(a bool or 0 / 1\), got 'yes'"):
        paired_comparison({"a": "yes"}, {"a": [True]})
    with pytest.raises(ValueError, match="got 0.5"):
        paired_comparison({"a": [True]}, {"a": [True, 0.5]})
