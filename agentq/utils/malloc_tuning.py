"""glibc malloc settings that let large CPU tensors reuse the heap (`tune_malloc`), called once at start.

Why: glibc serves each allocation above its mmap threshold (dynamic, never above 32 MiB) with a
fresh mmap and unmaps it on free, so the kernel faults in and zeroes every page of every such
tensor again. The CPU learner's forward and backward make hundreds of them per micro-batch (HF's
elementwise ops, the aligned linears' quantization and int32 GEMM outputs, attention's fp64 copies:
on ALFWorld-length rows of the tiny model ~7.7 GiB per no-grad micro-batch, ~14.5 GiB per training
one). One ALFWorld step (32 episodes × 30 turns) spent 35 s of system time in 17.7 M minor faults
in its learner phase, 11 s in its rollouts; tuned, 11 s (heap growth, first step only) and 3 s.
With both thresholds at `THRESHOLD`, blocks up to it come from the heap and freed ones stay
there for the next tensor; no value changes (tests/learner/test_heap_reuse.py).

Costs: peak RSS rises (that step: 4.5 → 6.3 GB), as the heap keeps what it grew to, and it
grows past the live tensors: torch's 64-byte-aligned requests (posix_memalign) do not fit a freed
block of the same size until freed neighbours coalesce. Later steps reuse it (a second step of
the learner alone: 0.5 s of system time, +4 % RSS). Process-wide and never undone. Only glibc on
Linux, with glibc's own malloc (not under a preloaded tcmalloc or jemalloc, which manage their own
heaps); `AGENTQ_MALLOC_TUNING=0` in the environment leaves malloc as it is.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys

ENV_VAR = "AGENTQ_MALLOC_TUNING"
#: M_MMAP_THRESHOLD and M_TRIM_THRESHOLD both (mallopt takes a C int)
THRESHOLD = 1 << 30
#: mallopt's parameter numbers (<malloc.h>)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

log = logging.getLogger("agentq.utils")
_state: dict[str, object] = {}


def glibc_version() -> str | None:
    """"glibc 2.36" where this process runs on glibc (Linux), else None (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        return None
    return version if version and version.startswith("glibc") else None


def _malloc_is_glibcs() -> bool:
    """Whether the process's `malloc` is glibc's own, not one a preloaded allocator (tcmalloc,
    jemalloc, mimalloc: LD_PRELOAD) puts in front of it."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    return address == ctypes.cast(libc.malloc, ctypes.c_void_p).value


def tune_malloc(threshold: int = THRESHOLD) -> str:
    """Set glibc's mmap and trim thresholds to `threshold` bytes for this process (once; later
    calls return the first outcome). Returns what happened, for a log line: "on (...)", or
    "off: <why>" (opted out with `ENV_VAR`=0, not glibc, another allocator preloaded, or a glibc that refuses the threshold: older
    ones cap the mmap threshold at 32 MiB, glibc's own dynamic maximum, where tuning gains nothing)."""
    if "outcome" in _state:
        return str(_state["outcome"])
    _state["outcome"] = outcome = _apply(threshold)
    log.info("malloc tuning: %s", outcome)
    return outcome


def _apply(threshold: int) -> str:
    if os.environ.get(ENV_VAR, "1").strip() == "0":
        return f"off: {ENV_VAR}=0"
    version = glibc_version()
    if version is None:
        return "off: not glibc"
    if not _malloc_is_glibcs():      # its mallopt would tune a heap nothing allocates from
        return f"off: malloc is not glibc's (another allocator is loaded; LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r})"
    if not 0 < threshold < 2 ** 31:
        raise ValueError(f"malloc threshold {threshold}: must be in (0, 2**31) (mallopt takes a C int)")
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # the trim threshold too: setting the mmap one turns off glibc's dynamic pair, leaving trim at 128 KiB
    if mallopt(M_MMAP_THRESHOLD, threshold) != 1:      # older glibc caps it at 32 MiB (HEAP_MAX_SIZE / 2)
        return f"off: {version} refuses an mmap threshold of {threshold >> 20} MiB"
    if mallopt(M_TRIM_THRESHOLD, threshold) != 1:
        return f"off: {version} refuses a trim threshold of {threshold >> 20} MiB"
    return f"on (mmap and trim thresholds {threshold >> 20} MiB, {version})"


def outcome() -> str | None:
    """What `tune_malloc` did in this process, or None before it ran."""
    value = _state.get("outcome")
    return None if value is None else str(value)


__all__ = ["ENV_VAR", "THRESHOLD", "glibc_version", "outcome", "tune_malloc"]
