"""`lock_folder` on a folder it cannot write (a read-only disk, no permission): one line naming the
folder, with the errno kept; it was `OSError: [Errno 30] Read-only file system: '.../.agentq.lock'`."""
import errno

import pytest

from agentq.utils import folder_lock
from agentq.utils.folder_lock import lock_folder


def test_a_lock_file_that_cannot_be_opened_names_the_folder(tmp_path, monkeypatch):
    def read_only(path, mode="r", *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    monkeypatch.setattr(folder_lock, "open", read_only, raising=False)
    with pytest.raises(OSError) as e:
        lock_folder(tmp_path, lambda pid: AssertionError(pid), what="run folder")
    assert e.value.errno == errno.EROFS and e.value.filename is None
    assert str(e.value.strerror) == f"cannot lock run folder {str(tmp_path)!r}: Read-only file system"
    with pytest.raises(OSError) as e:      # where the caller knows the fix (agentq eval: eval.out_dir)
        lock_folder(tmp_path, lambda pid: AssertionError(pid), what="output folder",
                    fix="set eval.out_dir to a writable folder")
    assert str(e.value.strerror).endswith("Read-only file system; set eval.out_dir to a writable folder")
