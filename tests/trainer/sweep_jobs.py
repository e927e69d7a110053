"""Stand-in arm runners for the sweep's job scheduling test (spawned processes import this module
by name: the pool's children get the test's sys.path). A real arm takes minutes; what is tested is
the scheduling around it."""
from __future__ import annotations

import time
from pathlib import Path


def run_marked(job: dict) -> None:
    """Write `<run_dir>.started`; the arm "fail" raises after 0.2 s, the others take 2 s."""
    Path(str(job["run_dir"]) + ".started").touch()
    if job["arm"] == "fail":
        time.sleep(0.2)
        raise RuntimeError("arm fail broke")
    time.sleep(2)


def run_dying(job: dict) -> None:
    """The arm "die" ends its worker process at once (as the kernel's OOM killer would); others take 3 s."""
    import os

    Path(str(job["run_dir"]) + ".started").touch()
    if job["arm"] == "die":
        os._exit(9)
    time.sleep(3)
    Path(str(job["run_dir"]) + ".done").touch()


def run_folder_only(job: dict) -> None:
    """As `run_arm` with its RL run left out: the run folder made afresh (a file in its place fails as
    it does there), then result.json."""
    import shutil

    run_dir = Path(job["run_dir"])
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text("{}")
