"""Child processes that end with the process that started them (Linux's PR_SET_PDEATHSIG).

A child that is killed with its parent needs no clean-up by anyone: an env worker whose trainer was
SIGKILLed, or a JVM whose env worker the pool killed while the JVM had not yet reached the point
where it watches its stdin pipe.

Linux sends the signal when the *thread* that forked the child ends, not the process. So it is
asked for only from the main thread: a child started from a short-lived thread would die with it.

Processes this one does not start itself (a local Ray cluster's agents) get a watcher process
instead, which kills them once this process has ended (`kill_when_this_process_ends`).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Callable

PR_SET_PDEATHSIG = 1        # from <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    """libc's prctl (never looked up in a freshly forked child: dlopen takes the loader's lock, which
    another thread may have held at the fork); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


#: resolved at import, so that a child forked from a threaded process (the `fork` start method, a
#: subprocess's preexec_fn) finds it without a dlopen
PRCTL = _prctl()


def set_pdeathsig() -> bool:
    """Ask Linux to SIGKILL this process when the thread that started it ends.

    Returns:
        False where prctl is missing (not Linux) or refused.
    """
    prctl = PRCTL
    if prctl is None:
        return False
    return prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                 ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0


def dies_with_this_process() -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets SIGKILL when this process ends (also by
    SIGKILL), and exits at once if this process already ended between the fork and the prctl.

    Returns:
        The function; None where it cannot hold: off the main thread (the signal would come when the
        calling thread ends) or off Linux. Popen takes None as "nothing to run".
    """
    if PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:
        set_pdeathsig()
        if os.getppid() != parent:      # the parent died before prctl took effect: no signal will come
            os._exit(1)
    return preexec


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` (children, their children, ...), from /proc; [] off Linux."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(int(stat[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...; field 22 of the file is
    [19], the start time); None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


# The watcher: waits for EOF on stdin (the process that started it ended, however), then SIGKILLs
# the listed processes that are still the same ones (pid and start time: never a recycled pid).
_WATCHER = r"""
import json, os, signal, sys
procs = json.loads(sys.argv[1])
sys.stdin.buffer.read()
def start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
for pid, t in procs:
    if start(pid) == t:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


def kill_when_this_process_ends(pids: list[int]) -> subprocess.Popen | None:
    """Start a small watcher process that SIGKILLs `pids` (those still the same processes, by start
    time) once this process has ended, by any means (SIGKILL, the OOM killer): for helpers that do
    not end with their parent.

    Returns:
        The watcher (keep it referenced: closing its stdin, or this process ending, fires it); None
        off Linux.
    """
    if not os.path.isdir("/proc"):
        return None
    procs = [(pid, stat[19]) for pid in pids if (stat := _stat(pid)) is not None]
    # its own session: a Ctrl-C to the trainer's terminal does not end the watcher before it fires
    return subprocess.Popen([sys.executable, "-c", _WATCHER, json.dumps(procs)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
