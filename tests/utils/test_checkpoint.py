"""`utils/checkpoint._commit`: a checkpoint's files reach the disk before the renames that make it
the checkpoint, and the renames before the save returns, so a power loss leaves the previous
checkpoint or the complete new one, never the new name over empty files. What is checked is the
order of the flushes (os.fsync recorded), since a power loss cannot be staged in a test."""
import errno
import os
import re
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from agentq.utils import checkpoint
from agentq.utils.checkpoint import CheckpointError, TrainerState, load_trainer_state, save_hf_checkpoint


class TinyModel(torch.nn.Module):
    """Enough of `save_pretrained` for the commit: two files in a nested folder."""

    def save_pretrained(self, folder, safe_serialization=True):
        (Path(folder) / "model.safetensors").write_bytes(b"weights")
        (Path(folder) / "sub").mkdir()
        (Path(folder) / "sub" / "more.json").write_text("{}")


def test_files_are_flushed_before_the_rename_and_the_rename_before_return(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                            real_fsync(fd))[1])
    monkeypatch.setattr(checkpoint.os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b))[1])
    path = tmp_path / "checkpoints" / "step_000001"
    save_hf_checkpoint(TinyModel(), path, trainer_state=TrainerState(tensors={"x": torch.ones(2)}, meta={"step": 1}))
    synced = [Path(p).name for kind, p in events if kind == "fsync"]
    rename = next(i for i, (kind, _) in enumerate(events) if kind == "replace")
    before = {Path(p).name for kind, p in events[:rename] if kind == "fsync"}
    assert {"model.safetensors", "more.json", "trainer_state.pt", "trainer_state.json", "sub"} <= before
    assert events[-1] == ("fsync", str(path.parent))          # the rename itself made durable
    assert synced.count("checkpoints") == 1
    assert load_trainer_state(path).meta == {"step": 1}
    # a second save over the same step: set aside, replaced, flushed the same way
    events.clear()
    save_hf_checkpoint(TinyModel(), path, trainer_state=TrainerState(tensors={}, meta={"step": 1, "again": True}))
    first_replace = next(i for i, (kind, _) in enumerate(events) if kind == "replace")
    assert any(kind == "fsync" and Path(p).name == "trainer_state.json" for kind, p in events[:first_replace])
    assert events[-1] == ("fsync", str(path.parent)) and load_trainer_state(path).meta["again"] is True
    assert not list(path.parent.glob(".step_*"))


class SafetensorsModel(torch.nn.Module):
    """`save_pretrained` as transformers does it: safetensors' own writer, whose file is 0600."""

    def save_pretrained(self, folder, safe_serialization=True):
        from safetensors.torch import save_file

        save_file({"w": torch.ones(2)}, str(Path(folder) / "model.safetensors"))
        (Path(folder) / "config.json").write_text("{}")


@pytest.mark.parametrize("umask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640),
                                                           (0o077, 0o700, 0o600)], ids=["022", "027", "077"])
def test_a_checkpoint_gets_the_modes_of_a_plain_mkdir_and_write(tmp_path, umask, folder_mode, file_mode):
    """The checkpoint folder kept mkdtemp's 0700 and its weights safetensors' 0600, whatever the umask:
    another user could neither evaluate nor report a run whose other files the umask let them read."""
    old = os.umask(umask)
    try:
        path = save_hf_checkpoint(SafetensorsModel(), tmp_path / "checkpoints" / "step_000001",
                                  trainer_state=TrainerState(tensors={"x": torch.ones(2)}, meta={"step": 1}))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == folder_mode
    modes = {f.name: f.stat().st_mode & 0o777 for f in path.iterdir()}
    assert modes == dict.fromkeys(["model.safetensors", "config.json", "trainer_state.pt", "trainer_state.json"],
                                  file_mode)


# ---------------------------------------------------------------------- a write the disk refuses
def save_step(folder: Path, step: int) -> Path:
    path = folder / "checkpoints" / f"step_{step:06d}"
    return save_hf_checkpoint(TinyModel(), path, trainer_state=TrainerState(tensors={"x": torch.ones(2)},
                                                                            meta={"step": step}))


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    # torch.save's zip writer on a full disk (seen on a 24 MB tmpfs): no errno, only this
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
], ids=["ENOSPC", "torch-short-write"])
def test_a_failed_checkpoint_write_is_one_line_naming_the_last_complete_one(tmp_path, monkeypatch, failure):
    """A full disk while torch.save wrote trainer_state.pt ended the run with torch's
    `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...` (or a raw
    OSError): now a CheckpointError naming the checkpoint, the reason and the one a resume goes on
    from, with the temporary folder removed as before."""
    save_step(tmp_path, 1)

    def full(obj, f, *a, **k):
        raise failure
    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(CheckpointError) as e:
        save_step(tmp_path, 2)
    ckpts = tmp_path / "checkpoints"
    assert str(e.value).startswith(f"could not write checkpoint step_000002 in {ckpts} (")
    assert "no space left on" in str(e.value).lower() and "\n" not in str(e.value)
    assert str(e.value).endswith("); the last complete checkpoint is step_000001")
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001"]         # no .step_000002.tmp* left


def test_a_full_disk_while_safetensors_writes_the_weights_is_the_same_one_line(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    def full(self, folder, safe_serialization=True):
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(TinyModel, "save_pretrained", full)
    with pytest.raises(CheckpointError, match=re.escape("could not write checkpoint step_000001 in ")) as e:
        save_step(tmp_path, 1)
    assert str(e.value).endswith("(No space left on device (os error 28)); no checkpoint of the run is complete")
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_other_errors_of_a_checkpoint_write_stay_as_they_are(tmp_path, monkeypatch):
    def broken(obj, f, *a, **k):
        raise RuntimeError("a bug, not the disk")
    monkeypatch.setattr(checkpoint.torch, "save", broken)
    with pytest.raises(RuntimeError, match="a bug, not the disk"):
        save_step(tmp_path, 1)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_lost_trainer_state_json_is_damage_and_an_old_pickle_is_named_as_one(tmp_path):
    """trainer_state.json missing beside this agentq's tensors read as "written by an older agentq as a
    full pickle ... start a new run": a file lost from a current checkpoint is damage (move it aside, the
    one before resumes). A state the safe loader refuses, without its json, is the older format."""
    import pickle

    path = save_step(tmp_path, 1)
    (path / "trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {path} is damaged (no trainer_state.json "
                                                        "beside its trainer_state.pt)")):
        load_trainer_state(path)
    (path / "trainer_state.pt").write_bytes(pickle.dumps({"step": 1, "rng": Fraction(1, 3)}, protocol=2))  # a full pickle
    with pytest.raises(CheckpointError, match="it was written by an older agentq as a full pickle"):
        load_trainer_state(path)


def test_a_trainer_state_without_what_the_reader_needs_is_a_damaged_checkpoint(tmp_path):
    """trainer_state.json that is JSON but not the trainer's (`{}`) gave `KeyError: 'step'` from the resume."""
    path = save_step(tmp_path, 1)
    (path / "trainer_state.json").write_text("{}")
    assert load_trainer_state(path).meta == {}          # nothing asked for: as before
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {path} is damaged (trainer_state.json lacks "
                                                        "'step', 'np_rng')")):
        load_trainer_state(path, meta_keys=("step", "np_rng"), tensor_keys=("x",))
    with pytest.raises(CheckpointError, match=re.escape("(trainer_state.pt lacks 'optimizer')")):
        load_trainer_state(path, tensor_keys=("x", "optimizer"))
