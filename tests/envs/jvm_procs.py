"""The JVMs a test started, found by a marker in their command line or environment (a test whose
env hangs cannot ask the env for its JVM's pid), so that none outlives the test."""
from __future__ import annotations

import os
import signal
import uuid

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
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:                       # ended while we looked, or not ours to read
            continue
        is_java = os.path.basename(cmdline.split(b"\0", 1)[0]) == b"java"
        if is_java and state not in "ZX" and marker.encode() in cmdline + environ:
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
