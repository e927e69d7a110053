"""`Placement` on a 2-CPU local Ray cluster: bundles the cluster can never hold fail at once with a
clear message (not after `placement.timeout_s`, 600 s by default); a placement that fails leaves no
placement group pending and no cluster it started running; one that fits still reserves and frees
its group. The cluster runs in a subprocess (a fresh Ray per test file run)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agentq.config import load_config
from agentq.trainer.placement import bundles_fit
from conftest import REPO, ray_head, run_cli

pytest.importorskip("ray")


def test_bundles_fit_by_hand():
    two_cpus, gpu_node = {"CPU": 2.0, "memory": 1e9}, {"CPU": 8.0, "GPU": 2.0}
    assert not bundles_fit([two_cpus], {"CPU": 2.0}, 2, "PACK")          # colocated's default on 2 cores
    assert bundles_fit([two_cpus], {"CPU": 0.5}, 4, "PACK")              # 4 × 0.5 = 2
    assert not bundles_fit([two_cpus], {"CPU": 0.5}, 5, "SPREAD")
    assert bundles_fit([two_cpus, two_cpus], {"CPU": 2.0}, 2, "SPREAD")  # one per node
    assert not bundles_fit([two_cpus, two_cpus], {"CPU": 2.0}, 2, "STRICT_PACK")
    assert bundles_fit([two_cpus, two_cpus], {"CPU": 1.0}, 2, "STRICT_SPREAD")
    assert not bundles_fit([two_cpus], {"CPU": 1.0}, 2, "STRICT_SPREAD")
    assert not bundles_fit([two_cpus], {"CPU": 1.0, "GPU": 1.0}, 1, "PACK")   # no GPU at all
    assert bundles_fit([gpu_node], {"CPU": 1.0, "GPU": 1.0}, 2, "STRICT_PACK")
    assert not bundles_fit([], {"CPU": 1.0}, 1, "PACK")


SCRIPT = """
import time, ray
from ray.util import placement_group_table
from ray.util.placement_group import placement_group, remove_placement_group
from agentq.config import ConfigError, load_config
from agentq.pool.ray_pool import keep_local_cluster_on_loopback, ray_init_kwargs
from agentq.trainer.placement import Placement

def pending():
    return sorted(v["state"] for v in placement_group_table().values() if v["state"] != "REMOVED")

# 1. colocated's defaults ask 2 bundles of 2 CPUs of a 2-CPU cluster that this placement starts
t0 = time.monotonic()
try:
    Placement(load_config(["placement=colocated", "ray.num_cpus=2", "placement.timeout_s=60"]))
except ConfigError as e:        # the settings ask more than this machine has: `agentq: ...`, exit 2
    print("NEVER", round(time.monotonic() - t0) < 20, "can never hold" in str(e), "ray.num_cpus" in str(e))
print("RAY_LEFT", ray.is_initialized())

# 2. a cluster started outside: a feasible request that times out (the CPUs are held) leaves nothing pending
keep_local_cluster_on_loopback()
ray.init(**ray_init_kwargs(None), num_cpus=2)
holder = placement_group([{"CPU": 2.0}])
ray.get(holder.ready(), timeout=60)
split = ["placement=split", "placement.cpus_per_actor=0.5", "ray.num_cpus=2"]
try:
    Placement(load_config([*split, "placement.timeout_s=3"]))
except RuntimeError as e:
    print("BUSY", "within 3 s" in str(e), pending())
remove_placement_group(holder)
time.sleep(1)
p = Placement(load_config(split))          # 4 bundles of 0.5 CPU: fits
print("FITS", len(p.bundles()), pending())
p.close()
time.sleep(1)
print("CLOSED", pending(), ray.is_initialized())
ray.shutdown()
"""


def test_placement_fails_fast_and_leaves_nothing_behind():
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [line for line in p.stdout.splitlines() if line.split(" ")[0] in ("NEVER", "RAY_LEFT", "BUSY", "FITS",
                                                                               "CLOSED")]
    assert lines == ["NEVER True True True", "RAY_LEFT False", "BUSY True ['CREATED']", "FITS 4 ['CREATED']",
                     "CLOSED [] True"], p.stdout[-3000:]


def test_a_placement_that_times_out_on_a_joined_cluster_is_one_line(tmp_path, tiny_model_dir):
    """A joined cluster may still gain nodes, so a placement it cannot hold waits placement.timeout_s;
    then it was a RuntimeError traceback. Now one line naming the setting, and no run folder left."""
    run = tmp_path / "run"
    with ray_head(tmp_path):            # 1 CPU: split's 4 bundles of 1 CPU never fit
        p = run_cli(["train", "placement=split", "ray.address=auto", "placement.timeout_s=1",
                     f"model.path={tiny_model_dir}", "env_pool=inline", f"trainer.out_dir={run}"], timeout=300)
    said = " ".join(p.stderr.split())
    assert p.returncode == 1 and "Traceback" not in said, p.stderr[-3000:]
    assert re.search(r"agentq: run stopped: placement=split: the Ray cluster \(CPU 1 \([\d.]+ free\)\) cannot hold the "
                     r"4 bundles \{'CPU': 1.0\} within 1 s \(placement.timeout_s\); raise placement.timeout_s to wait "
                     r"longer", said), said
    assert not run.exists()
    # the cluster joined is named with where its address came from (`ray start`'s file; one line)
    assert re.search(r"Ray: joined the cluster at [\d.]+:\d+ \(ray.address=auto, from Ray's current-cluster file ", said)
    # ray.num_cpus sizes only a cluster agentq starts: the joined cluster's advice is `ray start --num-cpus`
    assert "warning: placement=split: the Ray cluster's nodes" in said and "ray.num_cpus" not in said
    assert "start the joined cluster with more CPUs (`ray start --num-cpus=N`) or add nodes" in said


def test_the_docs_split_example_fits_a_two_core_machine():
    """docs/distributed.md's first `placement=split` command was refused on 2 cores (4 actors × 1 CPU)."""
    from agentq.trainer.placement import Placement

    doc = (REPO / "docs" / "distributed.md").read_text()
    command = next(line for line in doc.splitlines() if line.startswith("agentq train placement=split"))
    cfg = load_config(command.split()[2:])
    p = Placement.__new__(Placement)           # the layout only (no cluster)
    p.mode, p.rollout_workers, p.learner_ranks = "split", cfg.placement.rollout_workers, cfg.placement.learner_ranks
    p.cpus, p.use_gpus = float(cfg.placement.cpus_per_actor), False
    bundles = p.bundles()
    assert bundles_fit([{"CPU": 2.0}], bundles[0], len(bundles), cfg.placement.strategy)


def test_a_placement_not_ready_in_time_names_the_bundles_and_the_plain_resources():
    """It printed Ray's whole resource table (~1,500 characters of CPU_group_* / bundle_group_* entries)."""
    from agentq.trainer.placement import unplaced_message

    total = {"CPU": 2.0, "memory": 1.6e10, "node:127.0.0.1": 1.0, "CPU_group_0_abc": 0.5, "bundle_group_abc": 4000.0}
    said = unplaced_message("split", [{"CPU": 0.5}] * 4, total, {"CPU": 0.0, "CPU_group_0_abc": 0.5}, 3)
    assert said == ("placement=split: the Ray cluster (CPU 2 (0 free)) cannot hold the 4 bundles {'CPU': 0.5} within "
                    "3 s (placement.timeout_s); raise placement.timeout_s to wait longer for what others hold, lower "
                    "placement.rollout_workers / learner_ranks / cpus_per_actor, or add nodes")
    gpus = unplaced_message("colocated", [{"CPU": 2.0, "GPU": 1.0}] * 2, {"CPU": 8.0, "GPU": 1.0}, {"CPU": 6.0}, 600)
    assert "the Ray cluster (CPU 8 (6 free), GPU 1 (0 free)) cannot hold the 2 bundles {'CPU': 2.0, 'GPU': 1.0}" in gpus
