"""Out-of-memory errors that say what to change: a bare CUDA OOM names the bytes it wanted, never
the settings that decided them."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch


@contextlib.contextmanager
def out_of_memory_hint(hint: Callable[[], str]) -> Iterator[None]:
    """Re-raise a `torch.OutOfMemoryError` from the block as one whose message is the original's,
    a blank line, then `hint()` (computed only on failure); the original is its `__cause__`."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        raise torch.OutOfMemoryError(f"{err}\n\n{hint()}") from err
