"""The errors every layer may raise and the CLI prints in one line: the one a run stops itself with
(`agentq: run stopped: ...`, exit status 1; the give-up rule of restarted workers that raises it is
`agentq.utils.failures.FailureCounts`), and a run folder's damaged file (`agentq: ...`, exit status 2)."""
from __future__ import annotations


class RunAborted(RuntimeError):
    """The run stopped itself because continuing could not produce anything useful."""


class RunFileError(ValueError):
    """A file of a run folder is not what agentq wrote (a line that is not JSON, a row without its
    step): cut short or edited. The message names the file and the line."""


__all__ = ["RunAborted", "RunFileError"]
