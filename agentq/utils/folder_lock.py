"""One agentq process per output folder: an advisory lock file (`flock`) that the process holds until
it closes the file or exits, so a crashed holder never leaves the folder locked. Run folders
(`agentq.trainer.run_dir.claim_run_dir`) and `agentq eval`'s output folders take it."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Callable

LOCK_FILE = ".agentq.lock"


def lock_folder(folder: Path, refused: Callable[[str], Exception], what: str = "folder", fix: str = "") -> IO:
    """Lock `folder` for this process (its pid written in the lock file).

    Args:
        folder: an existing folder.
        refused: the error to raise when another process holds it, from the holder's pid.
        what: the folder in the messages ("run folder").
        fix: what to do where the lock file cannot be opened, appended to that message.
    Returns:
        the open lock file; the lock lasts until it is closed (or the process exits).
    Raises:
        what `refused` returns: another process holds the folder.
        OSError: the lock file cannot be opened (a read-only folder or disk), with its errno, in one
        line: "cannot lock <what> '<folder>': <the reason>[; <fix>]" (the CLI prints it so).
    """
    try:
        lock = open(folder / LOCK_FILE, "a+")
    except OSError as e:
        raise OSError(e.errno, f"cannot lock {what} {str(folder)!r}: {e.strerror or e}{'; ' + fix if fix else ''}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise refused(holder) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


__all__ = ["LOCK_FILE", "lock_folder"]
