"""A subprocess pool's workers end when the trainer dies without closing the pool (SIGKILL), even
while they hang inside an env step, and so does an env's engine subprocess that watches its pipe
from the worker (as the JVMs do). The "trainer" is a separate Python process; the env is
`fault_env.py` (importable by spawn: this folder is on the trainer's sys.path)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proc_watch import gone, wait_until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# argv: the folder for hang marks, the file for the pids, "main" or "thread" (which thread starts the
# pool) or "forkserver" (the main thread, workers from a fork server)
TRAINER = """
import json, sys, threading
sys.path.insert(0, {here!r})
from agentq.pool import EnvSpec, make_pool

marks, pids_file, where = sys.argv[1:]
spec = EnvSpec("fault_env:FaultEnv", {{"hang_marks": marks, "engine": True}})
box = []
if where == "thread":   # the starting thread ends before the trainer dies: the workers must outlive it
    t = threading.Thread(target=lambda: box.append(make_pool("process", spec, 2, num_workers=2, call_timeout_s=3600)))
    t.start(); t.join()
else:
    kw = {{"start_method": "forkserver"}} if where == "forkserver" else {{}}
    box.append(make_pool("process", spec, 2, num_workers=2, call_timeout_s=3600, **kw))
pool = box[0]
assert all(r.ok for r in pool.reset([(s, {{"options": {{"task_id": f"t/{{s}}"}}}}) for s in (0, 1)]))
words = [r.obs.split() for r in pool.step([(0, "pid"), (1, "pid")])]
with open(pids_file + ".tmp", "w") as f:
    json.dump({{"workers": [int(w[3]) for w in words], "engines": [int(w[5]) for w in words]}}, f)
import os; os.replace(pids_file + ".tmp", pids_file)
pool.step([(0, "hang"), (1, "hang")])      # never returns: the test kills this process
"""


def still_ours(pid: int) -> bool:
    """`pid` is still a Python process of this test (not a recycled pid), so it may be killed."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"multiprocessing" in cmd or b"sys.stdin.buffer.read()" in cmd


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
@pytest.mark.parametrize("where", ["main", "thread", "forkserver"])
def test_workers_hung_in_an_env_end_when_the_trainer_is_killed(where, tmp_path):
    """"main": Linux's parent-death signal ends the workers at once. "thread": a pool started from
    a thread that then ended gets no parent-death signal (it would have fired at that thread's
    end), so the worker's watchdog ends them; the workers stay up while the trainer lives.
    "forkserver": the workers are the fork server's children, and they keep it alive (they hold
    its keep-alive pipe), so their watchdog watches the trainer itself."""
    marks, pids_file, log = tmp_path / "marks", tmp_path / "pids.json", tmp_path / "trainer.log"
    marks.mkdir()
    with open(log, "wb") as err:
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER.format(here=str(HERE)), str(marks), str(pids_file),
                                    where], cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
    pids: dict = {"workers": [], "engines": []}
    try:
        started = wait_until(lambda: pids_file.exists() or trainer.poll() is not None, 120)
        assert started and pids_file.exists(), f"the trainer did not start its pool: {_tail(log)}"
        pids = json.loads(pids_file.read_text())
        # both workers are inside their env's step now (or the test would pass by the pipe's EOF alone)
        assert wait_until(lambda: len(list(marks.iterdir())) == 2, 30), f"workers not hanging: {_tail(log)}"
        assert sorted(int(m.name) for m in marks.iterdir()) == sorted(pids["workers"])
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        everyone = pids["workers"] + pids["engines"]
        assert wait_until(lambda: all(gone(pid) for pid in everyone), 10), \
            {pid: "alive" for pid in everyone if not gone(pid)}
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)
        for pid in pids["workers"] + pids["engines"]:     # never leave a process hanging for an hour
            if not gone(pid) and still_ours(pid):
                os.kill(pid, signal.SIGKILL)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]
