"""Ray env pools on a 2-CPU local cluster: requests sized to the free CPUs (never a wait for an
actor that cannot be placed), and `agentq train env_pool=ray env_pool.num_workers=2` running its
periodic and final evaluations to the end. Each test starts its own cluster in a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentq.pool.ray_pool import cpus_per_worker
from conftest import REPO, ray_head, run_cli

pytest.importorskip("ray")


def test_cpus_per_worker_by_hand():
    assert cpus_per_worker(8.0, 2) == 1.0          # room for all: one each
    assert cpus_per_worker(2.0, 3) == 0.66         # ⌊100·2/3⌋/100
    assert cpus_per_worker(0.5, 2) == 0.25
    assert cpus_per_worker(0.0, 2) == 0.0          # all held: zero-CPU actors, placed anyway


POOLS = """
import ray
from agentq.pool import EnvSpec, make_pool
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
spec = EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 5,
                                     "game_params": {"coin": "numLocations=2"}})
def plays(pool):
    rs = pool.reset([(i, {"seed": i, "options": {"task_id": f"coin/{i}"}}) for i in range(pool.num_envs)])
    return all(r.ok for r in rs)
a = make_pool("ray", spec, 2, num_workers=2)                   # takes both CPUs
b = make_pool("ray", spec, 2, num_workers=2, start_timeout_s=120)   # nothing free: a warning on stderr
print("A", a.cpus_per_worker, plays(a), "B", b.cpus_per_worker, plays(b))
a.close(); b.close()
import time; time.sleep(1)
c = make_pool("ray", spec, 3, num_workers=3)                   # 2 CPUs free again, 3 workers
print("C", c.cpus_per_worker, plays(c))
c.close(); ray.shutdown()
"""


def test_second_pool_fits_beside_the_first_on_two_cpus():
    p = subprocess.run([sys.executable, "-c", POOLS], cwd=REPO, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [line for line in p.stdout.splitlines() if line[:2] in ("A ", "C ")]
    assert lines == ["A 1.0 True B 0.0 True", "C 0.66 True"]
    # the console's one line, not a UserWarning with a file:line and a source line
    warned = [line for line in p.stderr.splitlines() if "no free CPU" in line]
    assert warned and all(line.startswith("warning: the Ray cluster has no free CPU") for line in warned), p.stderr[-2000:]


def test_train_and_final_eval_complete_with_ray_on_two_cpus(tmp_path):
    out = tmp_path / "run"
    p = run_cli(["train", "env=textworld_express", "env.max_steps=3", "env.max_new_tokens=12", "trainer.steps=2",
                 "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.eval_every=1", "trainer.eval_num_tasks=3",
                 "env_pool=ray", "env_pool.num_workers=2", "env_pool.num_cpus=2", f"trainer.out_dir={out}"],
                timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["final_eval"]["episodes"] == 3 and summary["final_eval"]["errors"] == 0
    assert json.loads((out / "eval" / "step_000001" / "eval.json").read_text())["episodes"] == 3


BESIDE = """
import sys, ray
sys.path.insert(0, {here!r})
from agentq.pool import EnvSpec, make_pool
pool = make_pool("ray", EnvSpec("fault_env:FaultEnv", {{}}), 2, num_workers=2, num_cpus=2)
rs = pool.reset([(i, {{"seed": i, "options": {{"task_id": f"t/{{i}}"}}}}) for i in range(2)])
print("CPU", ray.cluster_resources().get("CPU"), "ok", all(r.ok for r in rs),
      "gcs", ray.get_runtime_context().gcs_address)
pool.close(); ray.shutdown()
"""


def test_a_null_address_starts_its_own_cluster_beside_one_already_running(tmp_path):
    """`ray.address: null` means a new local cluster: Ray's own default would join the `ray start`
    cluster of this machine (1 CPU here) and then refuse the pool's num_cpus."""
    with ray_head(tmp_path) as port:
        p = subprocess.run([sys.executable, "-c", BESIDE.format(here=str(REPO / "tests" / "pool"))], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        words = [line for line in p.stdout.splitlines() if line.startswith("CPU ")][0].split()
        assert words[1:4] == ["2.0", "ok", "True"]           # its own 2-CPU cluster, not the 1-CPU head
        assert not words[5].endswith(f":{port}")


class _LaggingRay:
    """Ray's resource view as it can read under load: the actors of a pool are up, but the cluster
    still shows their CPUs as free (the lag that made a second pool ask for held CPUs and time out).
    A stand-in because a real cluster's lag cannot be produced on demand."""

    def __init__(self, total, shown_free, gcs="127.0.0.1:1"):
        self.total, self.shown_free, self.gcs = total, shown_free, gcs

    def available_resources(self):
        return {"CPU": self.shown_free}

    def cluster_resources(self):
        return {"CPU": self.total}

    def get_runtime_context(self):
        return type("Ctx", (), {"gcs_address": self.gcs})()


class _Pool:
    """What `free_cpus` reads of a live pool: its cluster and the CPUs its actors reserve."""

    def __init__(self, cluster, reserved_cpus):
        self.cluster, self.reserved_cpus = cluster, reserved_cpus


def test_free_cpus_subtracts_what_this_processes_pools_reserve_while_rays_view_lags(monkeypatch):
    import gc
    import weakref

    from agentq.pool import ray_pool

    pool = _Pool("127.0.0.1:1", 2.0)
    monkeypatch.setattr(ray_pool, "_live_pools", weakref.WeakSet([pool]))
    assert ray_pool.free_cpus(_LaggingRay(2.0, 2.0), 2.0, settle_s=0) == 0.0        # stale 2 free: 2 − 2 held
    assert ray_pool.free_cpus(_LaggingRay(4.0, 3.0), 2.0, settle_s=0) == 2.0        # min(3 shown, 4 − 2)
    assert ray_pool.free_cpus(_LaggingRay(4.0, 1.0), 2.0, settle_s=0) == 1.0        # someone else holds one
    # a pool left on another (shut-down) cluster reserves nothing on this one
    assert ray_pool.free_cpus(_LaggingRay(2.0, 2.0, gcs="127.0.0.1:2"), 2.0, settle_s=0) == 2.0
    del pool                      # a pool dropped without close(): Ray ends its actors, it reserves nothing
    gc.collect()
    assert ray_pool.free_cpus(_LaggingRay(2.0, 2.0), 2.0, settle_s=0) == 2.0


def test_free_cpus_does_not_wait_for_cpus_this_processes_pools_hold(monkeypatch):
    """Ray shows 0 of 2 CPUs free and this process's pool holds both: no settling can free them, so the
    answer (0) comes at once instead of after `settle_s`; with 1 of 4 held by another process, the
    look-again loop still runs (it waits for CPUs that may be released)."""
    import weakref

    from agentq.pool import ray_pool

    pool = _Pool("127.0.0.1:1", 2.0)
    monkeypatch.setattr(ray_pool, "_live_pools", weakref.WeakSet([pool]))
    sleeps = []
    monkeypatch.setattr(ray_pool.time, "sleep", sleeps.append)
    assert ray_pool.free_cpus(_LaggingRay(2.0, 0.0), 2.0, settle_s=5) == 0.0
    assert sleeps == []
    clock = iter(range(100))
    monkeypatch.setattr(ray_pool.time, "monotonic", lambda: next(clock) * 0.5)
    assert ray_pool.free_cpus(_LaggingRay(4.0, 1.0), 2.0, settle_s=5) == 1.0       # 2 unreserved: looks again
    assert len(sleeps) > 0
