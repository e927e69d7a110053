"""Atomic checkpoints: written into a temporary sibling folder, then renamed into place, so a
crash mid-save never leaves a half-written checkpoint under the final name."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch


def _atomic_dir(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp"))


def _commit(tmp: Path, path: Path) -> None:
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def save_hf_checkpoint(model, path: str | os.PathLike, tokenizer=None, extra: dict | None = None,
                       trainer_state: dict | None = None) -> Path:
    """save_pretrained (safetensors) + tokenizer (+ agentq metadata, optimizer state) atomically."""

    path = Path(path)
    tmp = _atomic_dir(path)
    try:
        # QATLinear is an nn.Linear subclass installed in place; HF serialises it like a Linear.
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if extra:
            (tmp / "agentq.json").write_text(json.dumps(extra, indent=2, default=str))
        if trainer_state is not None:
            torch.save(trainer_state, tmp / "trainer_state.pt")
        _commit(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
