"""`utils/checkpoint._commit`: a checkpoint's files reach the disk before the renames that make it
the checkpoint, and the renames before the save returns, so a power loss leaves the previous
checkpoint or the complete new one, never the new name over empty files. What is checked is the
order of the flushes (os.fsync recorded), since a power loss cannot be staged in a test."""
import os
from pathlib import Path

import torch

from agentq.utils import checkpoint
from agentq.utils.checkpoint import TrainerState, load_trainer_state, save_hf_checkpoint


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
