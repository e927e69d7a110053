"""One agentq process per output folder: an advisory lock file (`flock`) that the process holds until
it closes the file or exits, so a crashed holder never leaves the folder locked. Run folders
(`agentq.trainer.run_dir.claim_run_dir`) and `agentq eval`'s output folders take it."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Callable

LOCK_FILE = ".agentq.lock"
#: tries again before a refusal: a `lock_holder` probe holds the lock for a moment, not a run
PROBE_RETRIES, PROBE_WAIT_S = 3, 0.02


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
    for attempt in range(PROBE_RETRIES + 1):
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt < PROBE_RETRIES:     # maybe only `lock_holder`'s momentary probe: try again shortly
                time.sleep(PROBE_WAIT_S)
                continue
            lock.seek(0)
            holder = lock.read().strip() or "?"
            lock.close()
            raise refused(holder) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def lock_holder(folder: Path) -> str | None:
    """The pid written in `folder`'s lock file ("?" if none) while another process holds the lock,
    else None (also without a lock file). Creates nothing. For a refusal's message only: the lock is
    probed with a shared lock for a moment (`lock_folder` tries again over `PROBE_RETRIES` ·
    `PROBE_WAIT_S` before refusing, so the probe does not turn a starting run away), and a folder
    found free may be taken right after; `lock_folder` alone keeps two processes out."""
    try:
        lock = open(folder / LOCK_FILE)
    except OSError:             # never locked (no lock file), or not readable: nobody known to hold it
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock.read().strip() or "?"
        return None             # closing the file releases the probe


@contextlib.contextmanager
def removed_if_left_empty(folder: str | Path) -> Iterator[None]:
    """Run the block; if it raises, remove the folders of `folder`'s path that did not exist when it
    began (`folder`, and parents created with it) as long as they hold nothing but this process's
    lock file, so a refused start (`model.path`, `placement`, ...) leaves no empty run folder behind.
    A folder that existed before, or that anything was written into, is left as it is.

    Args:
        folder: the run folder the block creates (`claim_run_dir`, `make_run_dir`).
    """
    folder = Path(folder)
    new = [p for p in (folder, *folder.parents) if not p.exists()]         # innermost first
    try:
        yield
    except BaseException:
        for path in new:
            if not path.is_dir() or any(p.name != LOCK_FILE for p in path.iterdir()):
                break
            (path / LOCK_FILE).unlink(missing_ok=True)      # the block closed it: nobody holds the folder
            path.rmdir()
        raise


__all__ = ["LOCK_FILE", "lock_folder", "lock_holder", "removed_if_left_empty"]
