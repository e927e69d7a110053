"""The success rate's interval with `eval.repeats > 1`: repeats of one task are not independent
episodes, so the interval is Wilson's on the effective sample size (design effect by hand)."""
from __future__ import annotations

import math

import pytest

from agentq.agent.trajectory import Trajectory
from agentq.eval.metrics import success_interval, summarize, wilson_interval


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
