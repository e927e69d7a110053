"""The errors every layer may raise and the CLI prints in one line: the one a run stops itself with
(`agentq: run stopped: ...`, exit status 1; the give-up rule of restarted workers that raises it is
`agentq.utils.failures.FailureCounts`), and a run folder's damaged file (`agentq: ...`, exit status 2);
`raised_at`, the place a one-line message of another error names, and `first_line`, the line of an
error's text such a message quotes."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def says_where_on_stop(where: Callable[[], str], close: Callable[[], object] | None = None) -> Iterator[None]:
    """Run a command's block; when Ctrl-C or a `RunAborted` stops it, `close` first (so `where` sees the
    folder as the block left it), then raise the same kind of stop with `where()` after its message:
    the folder the command left and the command that goes on from it ("" where nothing was left).

    Args:
        where: what the stopped command left (`interrupted_text`, `pipeline_stopped_text`, ...).
        close: what the command holds open (workers, the folder's lock); a second Ctrl-C while it runs
            still gets `where`.
    """
    try:
        yield
    except KeyboardInterrupt as e:
        if close is not None:
            try:
                close()
            except KeyboardInterrupt:
                pass
        raise KeyboardInterrupt(_then(str(e), where())) from None
    except RunAborted as e:
        if close is not None:
            close()
        raise RunAborted(_then(str(e), where())) from e


def _then(message: str, where: str) -> str:
    return "; ".join(m for m in (message, where) if m)


__all__ = ["RunAborted", "RunFileError", "first_line", "raised_at", "says_where_on_stop"]
