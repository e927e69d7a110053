"""The learner's thread count: the idle cores within the process's CPU affinity (build.idle_cores)."""
import os

import pytest
import torch
from omegaconf import OmegaConf

from agentq import build


def test_usable_cores_is_the_affinity_not_the_host():
    assert build.usable_cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("busy,idle,cores,usable,expected", [
    (0, 800, 8, 8, 8),        # idle host: every usable core
    (600, 200, 8, 8, 2),      # 6 of 8 cores busy elsewhere → 2
    (0, 800, 8, 3, 3),        # idle host, affinity of 3 → 3
    (790, 10, 2, 2, 1),       # saturated: still one thread
    (100, 100, 2, 2, 1),      # one of two idle
])
def test_idle_cores_from_proc_stat_deltas(monkeypatch, busy, idle, cores, usable, expected):
    """/proc/stat deltas faked (a test cannot make the host busy on cue); the arithmetic is checked."""
    samples = iter([(1000, 5000), (1000 + busy, 5000 + idle)])
    monkeypatch.setattr(build, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(build, "usable_cores", lambda: usable)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert build.idle_cores(window_s=0.0) == expected


def test_real_proc_stat_reads():
    busy, idle = build._cpu_times()
    assert busy > 0 and idle > 0
    assert 1 <= build.idle_cores(window_s=0.05) <= build.usable_cores()


def test_learner_threads_explicit_value_and_restore():
    before = torch.get_num_threads()
    with build.learner_threads(OmegaConf.create({"learner_threads": 3})) as n:
        assert n == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before
