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
