"""The JVMs a test started, found by a marker in their command line or environment (a test whose
env hangs cannot ask the env for its JVM's pid), so that none outlives the test."""
from __future__ import annotations

import os
import signal
import uuid

from proc_watch import gone

#: a JDWP agent that suspends the JVM before `main` until a debugger attaches, and prints nothing:
#: a real JVM that starts and never writes its port
SUSPEND_AT_START = "-agentlib:jdwp=transport=dt_socket,server=y,suspend=y,address=127.0.0.1:0,quiet=y"


def new_marker() -> str:
    return f"agentq-test-{uuid.uuid4().hex}"


def marked_jvms(marker: str) -> list[int]:
    """Live java processes whose command line or environment holds `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:                       # ended while we looked, or not ours to read
            continue
        is_java = os.path.basename(cmdline.split(b"\0", 1)[0]) == b"java"
        if is_java and not gone(int(entry)) and marker.encode() in cmdline + environ:
            pids.append(int(entry))
    return pids


def kill_marked_jvms(marker: str) -> list[int]:
    """SIGKILL the JVMs `marked_jvms` finds; returns their pids."""
    pids = marked_jvms(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


_FIRST_RESET = """
import time, gymnasium as gym, agentq.envs
env = gym.make({env_id!r}, **{make_kwargs!r})
t0 = time.monotonic()
try:
    env.reset(seed=0)
    print("reset returned")
except Exception as e:
    print(f"{{type(e).__name__}} after {{time.monotonic() - t0:.1f}} s: {{e}}")
"""


def first_reset(env_id: str, make_kwargs: dict, env_vars: dict | None = None, timeout_s: float = 90) -> str:
    """A fresh process's first reset of `env_id` (it starts the JVM), with `env_vars` added to the
    environment; returns what it printed: "reset returned" or "<Error> after <s> s: <message>".
    A subprocess under a timeout, so a hang fails the test instead of hanging it."""
    import subprocess
    import sys

    import pytest

    script = _FIRST_RESET.format(env_id=env_id, make_kwargs=make_kwargs)
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s,
                             env={**os.environ, **(env_vars or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the first reset() of {env_id} was still waiting after {timeout_s} s")
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def check_start_timed_out(out: str, marker: str, leaked: list[int], call_timeout_s: int = 5) -> None:
    """`first_reset`'s output for a JVM that never printed its port: TimeoutError well within the
    subprocess's limit, naming call_timeout_s; and the env killed the JVM itself (`leaked`, the
    marked JVMs the test had to kill afterwards, is empty)."""
    assert "TimeoutError after" in out, out
    assert f"did not print its port within {call_timeout_s} s" in out and "call_timeout_s" in out, out
    assert float(out.split("TimeoutError after ")[1].split(" s")[0]) < 30
    assert leaked == [] and marked_jvms(marker) == []
