"""Child processes that end with the process that started them (Linux's PR_SET_PDEATHSIG).

A child that is killed with its parent needs no clean-up by anyone: an env worker whose trainer was
SIGKILLed, or a JVM whose env worker the pool killed while the JVM had not yet reached the point
where it watches its stdin pipe.

Linux sends the signal when the *thread* that forked the child ends, not the process. So it is
asked for only from the main thread: a child started from a short-lived thread would die with it.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Callable

PR_SET_PDEATHSIG = 1        # from <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved here (never in a freshly forked child: dlopen takes the loader's lock,
    which another thread may have held at the fork); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def set_pdeathsig(prctl: Callable[..., int] | None = None) -> bool:
    """Ask Linux to SIGKILL this process when the thread that started it ends.

    Args:
        prctl: libc's prctl as `_prctl` returns it (resolved before a fork); looked up when None.
    Returns:
        False where prctl is missing (not Linux) or refused.
    """
    prctl = prctl or _prctl()
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
    prctl = _prctl()
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:
        set_pdeathsig(prctl)
        if os.getppid() != parent:      # the parent died before prctl took effect: no signal will come
            os._exit(1)
    return preexec
