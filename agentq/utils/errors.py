"""The errors every layer may raise and the CLI prints in one line: the one a run stops itself with
(`agentq: run stopped: ...`, exit status 1; the give-up rule of restarted workers that raises it is
`agentq.utils.failures.FailureCounts`), and a run folder's damaged file (`agentq: ...`, exit status 2);
`raised_at`, the place a one-line message of another error names, and `first_line`, the line of an
error's text such a message quotes."""
from __future__ import annotations

from pathlib import Path


class RunAborted(RuntimeError):
    """The run stopped itself because continuing could not produce anything useful."""


class RunFileError(ValueError):
    """A file of a run folder is not what agentq wrote (a line that is not JSON, a row without its
    step): cut short or edited. The message names the file and the line."""


def raised_at(e: BaseException) -> str:
    """'file.py:line' of the deepest frame of `e`'s traceback outside Python's standard library (an
    env's own code, or the package it called; json's decoder is not where a data file went wrong)."""
    import sysconfig
    import traceback

    stdlib = sysconfig.get_path("stdlib")
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if not f.filename.startswith(stdlib) or "site-packages" in f.filename] or frames
    return f"{Path(own[-1].filename).name}:{own[-1].lineno}" if own else "?"


def first_line(err: BaseException | str | None, limit: int | None = None) -> str:
    """The first line of an error's text, for a one-line message that quotes it.

    Args:
        err: an exception (its `str()`), a text (e.g. an error recorded earlier), or None.
        limit: keep at most this many characters of the line (None: all).
    Returns:
        The first line of the text with the whitespace around the text and the line stripped; "" for
        None or a text of whitespace only (never an IndexError).
    """
    lines = str(err if err is not None else "").strip().splitlines()
    return lines[0].strip()[:limit] if lines else ""


__all__ = ["RunAborted", "RunFileError", "first_line", "raised_at"]
