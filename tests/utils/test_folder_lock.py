"""`lock_folder` on a folder it cannot write (a read-only disk, no permission): one line naming the
folder, with the errno kept; it was `OSError: [Errno 30] Read-only file system: '.../.agentq.lock'`."""
import errno

import pytest

from agentq.utils import folder_lock
from agentq.utils.folder_lock import LOCK_FILE, lock_folder, lock_holder


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


def test_lock_holder_names_the_process_holding_a_folder_and_creates_nothing(tmp_path):
    """The refusals of a folder in use (a resume, `agentq report`, `checkpoint=`) ask who holds it
    without taking it: the holder's pid while it holds the lock, None once it let go or never did."""
    import os

    assert lock_holder(tmp_path) is None and not (tmp_path / LOCK_FILE).exists()        # never locked
    held = lock_folder(tmp_path, lambda pid: AssertionError(pid))
    try:
        assert lock_holder(tmp_path) == str(os.getpid())
        assert lock_holder(tmp_path) == str(os.getpid())        # the probe took nothing: asked again, the same
    finally:
        held.close()
    assert lock_holder(tmp_path) is None                        # released (the lock file stays, unheld)
    lock_folder(tmp_path, lambda pid: AssertionError(pid)).close()     # and the folder can be locked again


def test_a_momentary_probe_does_not_turn_a_starting_run_away(tmp_path):
    """`lock_holder` takes a shared lock for a moment: a `lock_folder` in that moment tries again
    instead of refusing the folder as in use (by the pid a finished run left in the file)."""
    import fcntl
    import threading

    (tmp_path / LOCK_FILE).write_text("12345")
    probe = open(tmp_path / LOCK_FILE)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    threading.Timer(folder_lock.PROBE_WAIT_S, probe.close).start()       # the probe ends within the retries
    held = lock_folder(tmp_path, lambda pid: AssertionError(f"refused, holder {pid}"))
    held.close()
    longer = open(tmp_path / LOCK_FILE)            # a lock held past the retries is a holder: refused
    fcntl.flock(longer, fcntl.LOCK_SH | fcntl.LOCK_NB)
    with pytest.raises(RuntimeError, match="holder"):
        lock_folder(tmp_path, lambda pid: RuntimeError(f"holder {pid}"))
    longer.close()
