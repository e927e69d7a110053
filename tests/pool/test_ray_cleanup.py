"""A local Ray cluster that agentq started ends with the trainer, also when the trainer is
SIGKILLed (the OOM killer): Ray's GCS and raylet did, but its DashboardAgent and RuntimeEnvAgent
outlived the trainer for good. The "trainer" is a real Python process with a real local cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from proc_watch import gone, wait_until

pytest.importorskip("ray")
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")

TRAINER = """
import json, os, sys, time
from agentq.pool.ray_pool import init_ray
from agentq.utils.process import descendants
import ray

init_ray(None, 1)
@ray.remote
def pid():
    return os.getpid()
ray.get(pid.remote())
from agentq.pool import ray_pool
watcher = ray_pool._cluster_watcher.pid if ray_pool._cluster_watcher is not None else None
print(json.dumps({"cluster": [p for p in descendants(os.getpid()) if p != watcher]}), flush=True)
time.sleep(600)
"""


def command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return "?"


def test_a_sigkilled_trainers_local_cluster_ends_with_it():
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    cluster: list[int] = []
    try:
        line = trainer.stdout.readline()
        assert line, trainer.stderr.read()[-3000:]
        cluster = json.loads(line)["cluster"]
        names = " ".join(command(p) for p in cluster)
        assert "ray::DashboardAgent" in names and "raylet" in names, names
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        assert wait_until(lambda: all(gone(p) for p in cluster), 20), \
            {p: command(p) for p in cluster if not gone(p)}
    finally:
        if trainer.poll() is None:
            trainer.kill()
        for p in cluster:
            if not gone(p) and "ray" in command(p):
                os.kill(p, signal.SIGKILL)
