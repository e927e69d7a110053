"""`agentq.utils.files`: files replaced whole, and the temporaries a killed writer left removed."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agentq.utils.files import (STALE_AFTER_S, TEMPORARY_NAME, TEMPORARY_RE, TOKEN_HEX, remove_stale_temporaries,
                                replaced, write_text_replacing)


def test_a_file_is_replaced_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "table.json"
    path.write_text("old")
    with replaced(path) as tmp:
        tmp.write_text("half")
        assert path.read_text() == "old"            # a reader meanwhile sees the old file
        assert tmp.parent == tmp_path and tmp.name.startswith(".table.json.")
    assert path.read_text() == "half"
    write_text_replacing(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["table.json"]


def test_an_error_while_writing_keeps_the_old_file(tmp_path):
    path = tmp_path / "curves.png"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="draw"):
        with replaced(path) as tmp:
            tmp.write_text("torn")
            raise RuntimeError("draw")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["curves.png"]


def test_two_writers_of_one_file_get_their_own_temporaries(tmp_path):
    """`agentq sweep sweep.table_only=true` and the sweep itself may write table.md at once: a shared
    temporary name would let one rename the other's half-written file into place."""
    path = tmp_path / "table.md"
    with replaced(path) as a, replaced(path) as b:
        assert a != b
        a.write_text("a" * 1000)
        b.write_text("b")
    assert path.read_text() == "a" * 1000           # a's block ends last: its rename wins, whole


def test_the_file_gets_the_modes_a_plain_write_gives(tmp_path):
    """A temporary from mkstemp is 0600, which the rename would have given table.md; a plain write
    gives 0666 less the umask."""
    plain, whole = tmp_path / "plain.md", tmp_path / "whole.md"
    plain.write_text("x")
    write_text_replacing(whole, "x")
    assert whole.stat().st_mode == plain.stat().st_mode


def test_a_replaced_file_keeps_its_own_mode(tmp_path):
    """A user's chmod of table.md (here 0640) survives the sweep writing it again."""
    path = tmp_path / "table.md"
    path.write_text("old")
    path.chmod(0o640)
    write_text_replacing(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640


def test_a_file_system_that_refuses_chmod_still_gets_the_file(tmp_path, monkeypatch):
    """Keeping the mode is best effort: where chmod is refused (vfat, some FUSE / SMB mounts) the
    file is still replaced."""
    import errno
    import os

    path = tmp_path / "config.yaml"
    path.write_text("old")

    def refuse(*a, **k):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refuse)
    write_text_replacing(path, "new")
    assert path.read_text() == "new"


def dead_pid():
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temporary(folder, name, pid, token="0123456789ab", age_s=3600.0):
    """A temporary of `replaced`'s name last written `age_s` ago."""
    path = folder / TEMPORARY_NAME.format(name=name, pid=pid, token=token)
    path.write_text("half")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_a_dead_writers_temporary_is_removed(tmp_path):
    stale = temporary(tmp_path, "config.yaml", dead_pid())
    (tmp_path / "config.yaml").write_text("whole")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_live_writers_temporary_is_kept(tmp_path):
    """This process's, and a running one's (`agentq sweep sweep.table_only=true` writes table.md
    without the sweep folder's lock)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kept = {temporary(tmp_path, "table.md", os.getpid()), temporary(tmp_path, "table.json", child.pid)}
        assert remove_stale_temporaries(tmp_path) == []
    finally:
        child.kill()
        child.wait()
    assert set(tmp_path.iterdir()) == kept


def test_a_recent_temporary_is_kept_whatever_its_pid(tmp_path):
    """A writer on another host or in another pid namespace has a pid that looks dead here: its
    temporary is left until it is `STALE_AFTER_S` old."""
    pid = dead_pid()
    recent = temporary(tmp_path, "report.html", pid, age_s=STALE_AFTER_S - 60)
    old = temporary(tmp_path, "table.md", pid, age_s=STALE_AFTER_S + 60)
    assert remove_stale_temporaries(tmp_path) == [old] and recent.exists()
    assert remove_stale_temporaries(tmp_path, older_than_s=0) == [recent]


def test_only_the_exact_names_of_replaced_are_removed(tmp_path):
    pid = dead_pid()
    look_alikes = [f".config.yaml.{pid}.0123456789a.tmp", f".config.yaml.{pid}.0123456789abc.tmp",
                   f"config.yaml.{pid}.0123456789ab.tmp", f".config.yaml.{pid}.0123456789AB.tmp",
                   f".config.yaml.{pid}.0123456789ab.tmp.old", f"..{pid}.0123456789ab.tmp",
                   ".config.yaml.0.0123456789ab.tmp", ".config.yaml.tmp", ".agentq.lock"]
    for name in look_alikes:
        (tmp_path / name).write_text("x")
    (tmp_path / f".table.md.{pid}.0123456789ab.tmp").mkdir()          # a folder with the name
    sub = tmp_path / "sft"
    sub.mkdir()
    nested = temporary(sub, "sft_summary.json", pid)                  # not recursive
    assert remove_stale_temporaries(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*look_alikes, f".table.md.{pid}.0123456789ab.tmp", "sft"]) and nested.exists()


@pytest.mark.parametrize("name", ["config.yaml", "a", ".hidden", "table.md.1.0123456789ab.tmp", "my run.log",
                                  "x[0-9]+(a|b)*?{2}^$\\.json", "dots...", " "])
def test_the_names_temporary_name_gives_are_the_ones_temporary_re_matches(name):
    """`TEMPORARY_RE` is written out beside `TEMPORARY_NAME`: every name the format gives (a name with
    dots, spaces or regex metacharacters, one that itself looks like a temporary) matches whole and
    gives back its fields; a name the format cannot give does not match."""
    for pid, token in ((1, "0" * TOKEN_HEX), (4194304, "0123456789ab"), (37, "fedcba987654")):
        match = TEMPORARY_RE.fullmatch(TEMPORARY_NAME.format(name=name, pid=pid, token=token))
        assert match is not None and match.groupdict() == {"name": name, "pid": str(pid), "token": token}
    good = TEMPORARY_NAME.format(name=name, pid=37, token="0123456789ab")
    look_alikes = [good.lstrip("."), good + ".old", good[:-len(".tmp")], "x" + good, good.replace(".37.", ".037."),
                   good.replace(".37.", ".0."), good.replace(".37.", ".-37."), good.replace(".37.", "..", 1),
                   good.replace("0123456789ab", "0123456789AB"), good.replace("0123456789ab", "0123456789a"),
                   good.replace("0123456789ab", "0123456789abc"), good.replace(".tmp", ".TMP")]
    for look_alike in look_alikes:
        assert TEMPORARY_RE.fullmatch(look_alike) is None, look_alike
    assert TEMPORARY_RE.fullmatch(TEMPORARY_NAME.format(name="", pid=37, token="0123456789ab")) is None


def test_a_file_that_cannot_be_removed_is_skipped(tmp_path, monkeypatch):
    """A read-only folder (as root, chmod would not stop the unlink: refused here instead)."""
    import errno

    stale = [temporary(tmp_path, name, dead_pid()) for name in ("summary.json", "table.md")]

    def refuse(path, *a, **k):
        if ".summary.json." in os.fspath(path):
            raise PermissionError(errno.EROFS, "Read-only file system", path)
        return real(path, *a, **k)

    real = os.unlink
    monkeypatch.setattr(os, "unlink", refuse)
    assert remove_stale_temporaries(tmp_path) == [stale[1]] and stale[0].exists()
    assert remove_stale_temporaries(tmp_path / "missing") == []


def test_a_writer_killed_mid_write_leaves_a_temporary_the_clean_up_removes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("whole\n")
    script = textwrap.dedent(f"""
        import os, signal
        from agentq.utils.files import replaced
        with replaced({str(path)!r}) as tmp:
            tmp.write_text("half")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    left = [p for p in tmp_path.iterdir() if p != path]
    assert len(left) == 1 and left[0].read_text() == "half"
    assert remove_stale_temporaries(tmp_path) == []            # just written: left for now
    assert remove_stale_temporaries(tmp_path, older_than_s=0) == left
    assert list(tmp_path.iterdir()) == [path] and path.read_text() == "whole\n"
