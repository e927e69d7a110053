"""Files replaced whole: written beside their final name, then renamed over it, so a reader (or a
second writer, e.g. `agentq sweep sweep.table_only=true` while the sweep writes its own table) sees the
old file or the new one, never a mix or a half-written one."""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def replaced(path: str | Path) -> Iterator[Path]:
    """A temporary path in `path`'s folder to write; renamed over `path` when the block ends without
    an error, removed otherwise. Each call gets its own name, so concurrent writers do not share one.
    The file keeps the mode it had; a new one gets a plain write's (0666 less the umask)."""
    path = Path(path)
    # a name of its own (not mkstemp's, whose file is 0600: the table would lose the umask's read bits)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
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
