"""agentq.utils.process: a child started with `dies_with_this_process` ends when its parent is
SIGKILLed (a real parent process and a real `sleep` child), and the function declines off the main
thread, where Linux would end the child with the calling thread instead."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from proc_watch import gone

from agentq.utils.process import dies_with_this_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = """
import subprocess, sys, time
from agentq.utils.process import dies_with_this_process
child = subprocess.Popen(["sleep", "300"], start_new_session=True,
                         preexec_fn=dies_with_this_process() if sys.argv[1] == "on" else None)
print(child.pid, flush=True)
time.sleep(300)
"""


def child_outlives_its_killed_parent(mode: str) -> bool:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not gone(child)
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_the_child_dies_with_its_sigkilled_parent():
    assert not child_outlives_its_killed_parent("on")
    assert child_outlives_its_killed_parent("off")     # the setup: its own session alone keeps it alive


def test_declines_off_the_main_thread():
    got = []
    t = threading.Thread(target=lambda: got.append(dies_with_this_process()))
    t.start()
    t.join()
    assert got == [None] and callable(dies_with_this_process())
