"""Files replaced whole: written beside their final name, then renamed over it, so a reader (or a
second writer, e.g. `agentq sweep sweep.table_only=true` while the sweep writes its own table) sees the
old file or the new one, never a mix or a half-written one. A kill mid-write leaves the temporary
behind: `remove_stale_temporaries` removes those of dead writers."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Iterator

#: the name of `replaced`'s temporary beside `name`: the writer's pid (a dead one's are stale) and a
#: token of its own (`TOKEN_HEX` lower-case hex digits)
TEMPORARY_NAME = ".{name}.{pid}.{token}.tmp"
TOKEN_HEX = 12
#: exactly the names `TEMPORARY_NAME` gives, used with fullmatch (change the two together)
TEMPORARY_RE = re.compile(rf"""
    \.  (?P<name>.+)                          # the replaced file's name, dots and all
    \.  (?P<pid>[1-9][0-9]*)                  # the writer's pid
    \.  (?P<token>[0-9a-f]{{{TOKEN_HEX}}})    # the writer's token
    \.tmp
""", re.VERBOSE)


@contextlib.contextmanager
def replaced(path: str | Path) -> Iterator[Path]:
    """A temporary path in `path`'s folder to write; renamed over `path` when the block ends without
    an error, removed otherwise. Each call gets its own name, so concurrent writers do not share one.
    The file keeps the mode it had; a new one gets a plain write's (0666 less the umask)."""
    path = Path(path)
    # a name of its own (not mkstemp's, whose file is 0600: the table would lose the umask's read bits)
    tmp = path.with_name(TEMPORARY_NAME.format(name=path.name, pid=os.getpid(), token=uuid.uuid4().hex[:TOKEN_HEX]))
    try:
        yield tmp
        # a file replaced keeps its own mode (a chmod by its user); best effort: a new file has none,
        # and file systems without modes (vfat, some FUSE / SMB mounts) refuse chmod
        with contextlib.suppress(OSError):
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_replacing(path: str | Path, text: str) -> None:
    """`Path.write_text`, the file replaced whole (`replaced`)."""
    with replaced(path) as tmp:
        tmp.write_text(text)


#: a temporary younger than this is left even if its pid looks dead: its writer may run on another
#: host or in another pid namespace over a shared folder (`agentq report`, a sweep's table_only run)
STALE_AFTER_S = 600.0


def remove_stale_temporaries(folder: str | Path, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporaries of `replaced` in `folder` (not its subfolders) that a killed writer left:
    files named exactly as `TEMPORARY_NAME` gives whose pid is no live process here and which were
    last written over `older_than_s` ago. A live writer's (this process's, another user's), a recent
    one's and every other name are left; a file that cannot be removed (a read-only folder) is
    skipped. Returns what was removed."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:             # no folder, or one that cannot be read: nothing to remove
        return removed
    for entry in entries:
        match = TEMPORARY_RE.fullmatch(entry.name)
        try:
            if not match or not entry.is_file(follow_symlinks=False) or pid_alive(int(match["pid"])):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < older_than_s:
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live process (this one, or another user's); one that cannot be asked counts
    as alive."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):      # PermissionError: another user's
        return True
    return True
