"""The error a run stops itself with, in the bottom layer so that every layer can raise it and the
CLI print it in one line (`agentq: run stopped: ...`, exit status 1). The give-up rule of restarted
workers that raises it is `agentq.utils.failures.FailureCounts`."""
from __future__ import annotations


class RunAborted(RuntimeError):
    """The run stopped itself because continuing could not produce anything useful."""


__all__ = ["RunAborted"]
