"""Polling helpers of the tests that start processes: whether a process has ended, and a wait with a deadline."""
from __future__ import annotations

import time
from typing import Callable


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, not yet reaped by whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def wait_until(check: Callable[[], bool], timeout_s: float = 20.0, poll_s: float = 0.1) -> bool:
    """Poll `check` until it holds (True) or `timeout_s` passes (False); never waits longer."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
