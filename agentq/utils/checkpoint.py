"""Atomic checkpoints: written into a temporary sibling folder, then renamed into place, so a
crash mid-save never leaves a half-written checkpoint under the final name. Files of one folder that
belong together (an evaluation's eval.json and episodes.jsonl) are renamed in together the same way
(`replace_files_together`).

The trainer state (what `trainer.resume` needs besides the weights) is stored without pickled
objects, so resuming from a folder never runs code from it: tensors and tensor containers
(optimizer state, torch RNG state) in `trainer_state.pt`, read back with `weights_only=True`,
and plain values (step, numpy RNG state, paths) in `trainer_state.json`."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import first_line

STATE_TENSORS, STATE_META = "trainer_state.pt", "trainer_state.json"


@dataclass
class TrainerState:
    """What a resume restores besides the weights.

    tensors: tensors and containers of tensors / numbers / strings (e.g. an optimizer state_dict).
    meta: JSON values (step, numpy `bit_generator.state`, paths)."""

    tensors: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated or in a format that is not loaded (unsafe)."""


#: the weight files transformers loads a checkpoint from (one of them, or their shards)
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def check_weight_files(folder: str | os.PathLike) -> None:
    """Check that `folder` has weights, and open the header of every *.safetensors file (cheap: no
    tensor is read), so a missing, truncated or corrupt one is an error naming the folder or file,
    before any model is built.

    Raises:
        CheckpointError: no weight file at all (a config.json alone, an interrupted copy), or a
        damaged one, naming the file and safetensors' reason.
    """
    from safetensors import safe_open

    if not any(any(Path(folder).glob(pattern)) for pattern in WEIGHT_FILES):
        raise CheckpointError(f"{folder} has a config.json but no weights (no *.safetensors, which the rollout "
                              "backends read, nor pytorch_model*.bin): an interrupted copy or save?")
    for f in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except Exception as e:
            raise CheckpointError(f"weight file {f} is damaged or truncated ({f.stat().st_size} bytes): {e}") from None


def save_trainer_state(folder: str | os.PathLike, state: TrainerState) -> None:
    folder = Path(folder)
    torch.save(state.tensors, folder / STATE_TENSORS)
    (folder / STATE_META).write_text(json.dumps(state.meta, indent=1))


def load_trainer_state(folder: str | os.PathLike, meta_keys: tuple[str, ...] = (),
                       tensor_keys: tuple[str, ...] = ()) -> TrainerState:
    """Read a trainer state written by `save_trainer_state`; never unpickles arbitrary objects.

    Args:
        meta_keys, tensor_keys: what the reader needs in `trainer_state.json` / `trainer_state.pt`.
    Raises:
        CheckpointError: a file is missing or unreadable, lacks one of those keys, or `trainer_state.pt`
        holds anything but tensors and plain containers (e.g. a pickle from an older agentq, or a crafted one).
    """
    folder = Path(folder)
    pt, meta = folder / STATE_TENSORS, folder / STATE_META
    if not pt.exists():
        raise CheckpointError(f"{folder} has no {STATE_TENSORS} (optimizer, RNG): cannot resume")
    try:
        tensors = torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as e:      # UnpicklingError for disallowed globals, RuntimeError/EOFError for torn files
        if not meta.exists():   # an older agentq's state: one full pickle, no json beside it
            raise CheckpointError(
                f"{folder} has {STATE_TENSORS} but no {STATE_META}: it was written by an older agentq as a full "
                "pickle, which is not loaded because unpickling can run code. Start a new run from its weights "
                f"instead: model.path={str(folder)!r}") from None
        raise CheckpointError(f"{pt} could not be loaded safely (weights_only=True): {type(e).__name__}: "
                              f"{first_line(e)}; it is either damaged or holds "
                              "objects other than tensors, which are never unpickled") from None
    if not meta.exists():       # this agentq's tensors without their json: a file lost, not an old format
        raise CheckpointError(f"checkpoint {folder} is damaged (no {STATE_META} beside its {STATE_TENSORS})")
    try:
        values = json.loads(meta.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{meta} is not valid JSON ({e.msg}); the checkpoint is damaged") from None
    for name, found, keys in ((STATE_META, values, meta_keys), (STATE_TENSORS, tensors, tensor_keys)):
        lacks = [k for k in keys if not isinstance(found, dict) or k not in found]
        if lacks:
            raise CheckpointError(f"checkpoint {folder} is damaged ({name} lacks {', '.join(map(repr, lacks))})")
    return TrainerState(tensors=tensors, meta=values)


def _atomic_dir(path: Path) -> Path:
    """A new temporary folder beside `path`, `.<name>.tmp<token>`, with the mode a plain mkdir gets
    under the process's umask: mkdtemp's 0700 stayed on the committed checkpoint, which other users
    could then neither evaluate nor report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.tmp{uuid.uuid4().hex[:12]}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:         # a name taken (never in practice): another token
            continue


def _plain_file_modes(folder: Path) -> None:
    """Give every file in `folder` the mode a plain write gets under the umask (the folder's own, made
    by `_atomic_dir`, less the execute bits): safetensors writes its file 0600, and a checkpoint's
    weights were then unreadable to the other users its folder lets in."""
    mode = folder.stat().st_mode & 0o666
    for f in folder.rglob("*"):
        if f.is_file() and f.stat().st_mode & 0o777 != mode:
            # best effort: file systems without modes (vfat, some FUSE / SMB mounts) refuse chmod
            with contextlib.suppress(OSError):
                os.chmod(f, mode)


def _sync_tree(folder: Path) -> None:
    """fsync every file and folder in `folder`, then `folder`: the renames that commit it must not
    reach the disk before its contents do (after a power loss the checkpoint would be there, its
    files empty)."""
    for f in sorted(folder.rglob("*"), reverse=True):       # a folder after what it holds
        if f.is_file() or f.is_dir():
            fsync_path(f)
    fsync_path(folder)


def fsync_path(path: Path) -> None:
    """fsync a file or folder (its entries) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_files_together(staged: list[tuple[Path, Path]]) -> None:
    """Rename each complete (tmp, path) of one folder onto its path as one change, as far as renames
    allow: synced first, the existing files set aside as `.<name>.old` in order, the new ones renamed
    in in reverse order, the asides removed. The first path is the one readers look for: it leaves
    first and comes back last, so wherever a reader finds it, the files beside it are its own (between
    the renames it is missing). An exception on the way (an OSError, Ctrl-C) undoes every rename
    made, leaving the old files; a kill there leaves them as `.<name>.old`, which
    `restore_interrupted_replace` puts back.

    Raises:
        whatever a rename raised, after the renames before it were undone.
    """
    for tmp, _ in staged:
        fsync_path(tmp)
    asides = [(path, path.with_name(f".{path.name}.old")) for _, path in staged if path.exists()]
    done: list[tuple[Path, Path]] = []
    try:
        for src, dst in asides + staged[::-1]:
            os.replace(src, dst)
            done.append((src, dst))
    except BaseException:
        for src, dst in reversed(done):
            os.replace(dst, src)
        raise
    for _, old in asides:
        old.unlink()
    fsync_path(staged[0][1].parent)


def restore_interrupted_replace(paths: list[Path]) -> list[Path]:
    """Undo or finish a `replace_files_together` of `paths` (the first the one readers look for) that
    a kill cut short: without the first path, the files set aside as `.<name>.old` go back (the last
    complete set); with it, the renames had all been made and leftover asides are removed. Returns
    the paths restored."""
    asides = [(path, path.with_name(f".{path.name}.old")) for path in paths]
    if paths[0].exists():
        for _, old in asides:
            old.unlink(missing_ok=True)
        return []
    restored = [path for path, old in asides if old.exists()]
    for path in restored:
        os.replace(path.with_name(f".{path.name}.old"), path)
    if restored:
        fsync_path(paths[0].parent)
    return restored


def _commit(tmp: Path, path: Path) -> None:
    """Move the complete `tmp` to `path`; an existing `path` is set aside as `.<name>.old` first (a
    kill between the two renames leaves it only there: `restore_interrupted_commits`). The contents
    are on disk before the renames, and the renames before this returns."""
    _sync_tree(tmp)
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)
    fsync_path(path.parent)


def restore_interrupted_commits(folder: str | os.PathLike) -> list[Path]:
    """Rename each `.<name>.old` whose `<name>` is missing back to `<name>`: `_commit` was killed
    between its two renames, and the set-aside checkpoint is the one complete copy (the new one's
    `.tmp*` folder cannot be told apart from a half-written one). Only safe while nobody is saving
    (the run folder's lock). Returns the checkpoints restored."""
    folder = Path(folder)
    restored = []
    for old in sorted(folder.glob(".*.old")) if folder.is_dir() else []:
        path = folder / old.name[1:-len(".old")]
        if not path.exists():
            os.replace(old, path)
            restored.append(path)
    return restored


def save_hf_checkpoint(model, path: str | os.PathLike, tokenizer=None, extra: dict | None = None,
                       trainer_state: TrainerState | None = None) -> Path:
    """save_pretrained (safetensors) + tokenizer (+ agentq metadata, trainer state) atomically.

    Raises:
        CheckpointError: a write failed (`write_failure`: a full or read-only disk), in one line naming
        the reason and the run's last complete checkpoint; the temporary folder is removed first.
    """

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
            save_trainer_state(tmp, trainer_state)
        _plain_file_modes(tmp)
        _commit(tmp, path)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = write_failure(e)
        if reason is None:
            raise
        raise CheckpointError(f"could not write checkpoint {path.name} in {path.parent} ({reason})"
                              f"{last_complete_checkpoint(path)}") from None
    return path


#: what torch.save's zip writer raises (a RuntimeError) when a write comes up short (a full disk)
SHORT_WRITE = ("unexpected pos", "file write failed", "failed writing file")


def write_failure(e: BaseException) -> str | None:
    """Why writing a checkpoint failed, where the file system refused a write (a full disk, a read-only
    one): an OSError's reason (and file), torch.save's zip writer's short write (its RuntimeError names
    no errno), safetensors' I/O error; None for any other error, which is raised as it is."""
    if isinstance(e, OSError):
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    text = str(e)
    if isinstance(e, RuntimeError) and any(s in text for s in SHORT_WRITE):
        return "a file was written short, e.g. no space left on the device"
    if type(e).__name__ == "SafetensorError" and "I/O error" in text:     # "Error while serializing: I/O error: ..."
        return first_line(text.partition("I/O error: ")[2], 200) or "an I/O error"
    return None


def last_complete_checkpoint(path: Path) -> str:
    """"; the last complete checkpoint is <name>" for a run's step_* checkpoint, of the folders beside
    it that hold weights; "" for another (an SFT run's one checkpoint)."""
    if not path.name.startswith("step_"):
        return ""
    done = [p.name for p in sorted(path.parent.glob("step_*")) if p.is_dir() and any(
        any(p.glob(pattern)) for pattern in WEIGHT_FILES)]
    return f"; the last complete checkpoint is {done[-1]}" if done else "; no checkpoint of the run is complete"
