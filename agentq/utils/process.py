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
