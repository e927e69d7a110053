"""`agentq.utils.files`: files replaced whole."""
import pytest

from agentq.utils.files import replaced, write_text_replacing


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
