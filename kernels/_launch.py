"""`launch_kernel(kernel, grid, *args, **kwargs)`: `kernel[grid](*args, **kwargs)` with less host work.

Triton's launch path (`JITFunction.run`) binds the arguments, builds its specialization key,
renders the options to a string and checks the kernel's globals on every call. On the H200
machine's host one of our launches cost ~70 µs against ~13 µs for a torch op
(`docs/bench/h200-r16/host-cost.log`), and the aligned learner makes hundreds per step: at 1B the
update is bound by the host, not the GPU. Here the first call of a given argument *class* goes
through Triton (which compiles if it must) and hands back its compiled kernel; later calls of that
class call the compiled kernel's launcher directly, with the values and in the order Triton would
pass them (`JITFunction.run`'s last lines, mirrored).

**The class of a call** is at least as fine as Triton's specialization, so a plan is reused only
where Triton would pick the same compiled kernel: constexpr arguments and launch options by
value; tensors by dtype and 16-byte alignment; integers by (== 1, % 16 == 0, 32-bit range,
unsigned 64-bit range); floats as one class (Triton passes them as fp32, unspecialized); bools
and None by value; tensor descriptors by dtype, block shape, padding and layout. Anything else (a callable
grid, a tuple argument, a type not listed) takes Triton's path. `tests/kernels/test_launch.py`
holds the key against Triton's own specializer.

**Used only where it is known to be right**: compiled kernels (the interpreter runs through
Triton), a Triton whose `JITFunction.run` ends in the launch call mirrored here (checked once,
from its source), and `AGENTQ_FAST_LAUNCH` unset or 1 (read once). What the direct call skips:
Triton's check that the globals a kernel reads still hold their compile-time values (agentq's
kernels read module constants that never change) and the per-launch re-read of Triton's debug /
instrumentation knobs (set them before the first launch). Launch hooks (profilers) still fire: the
hook objects are read on every call, as Triton does.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, Iterator

import torch

from ._interp import HAVE_TRITON, env_set

try:   # what the direct path calls, imported once (not per launch)
    from triton import knobs as _knobs
    from triton.runtime.driver import driver as _driver
    from triton.runtime.jit import JITFunction as _JITFunction
except Exception:   # no Triton, or another layout: every launch takes Triton's own path
    _knobs = _driver = _JITFunction = None

#: `JITFunction.run`'s launch, whitespace-normalized: the call `_run_plan` makes in its place
MIRRORED_LAUNCH = ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
                   "launch_metadata, knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, "
                   "*bound_args.values())")

#: launches by path since import (tests, benchmarks): "direct" = a cached plan, "triton" = Triton's run
counts = {"direct": 0, "triton": 0}


class _NoPlan(Exception):
    """An argument whose class is not keyed here: the call goes through Triton."""


@functools.lru_cache(maxsize=None)
def enabled() -> bool:
    """Whether direct launches are on: Triton importable, its launch the one mirrored, and
    AGENTQ_FAST_LAUNCH not 0. Read once per process (`enabled.cache_clear()` to re-read)."""
    if not HAVE_TRITON or _JITFunction is None or os.environ.get("AGENTQ_FAST_LAUNCH", "1") == "0":
        return False
    try:
        src = " ".join(inspect.getsource(_JITFunction.run).split())
    except Exception:   # pragma: no cover - no source to check: Triton's own path
        return False
    return MIRRORED_LAUNCH in src


@contextlib.contextmanager
def direct_launches(on: bool) -> Iterator[None]:
    """Direct launches on (where `enabled` allows) or off for the block (benchmarks: both paths in
    one process), then as before."""
    with env_set("AGENTQ_FAST_LAUNCH", "1" if on else "0"):
        enabled.cache_clear()
        try:
            yield
        finally:
            enabled.cache_clear()      # the next read sees the variable as it was before the block


def arg_class(v: Any) -> Any:
    """The class of a non-constexpr argument value (see the module docstring)."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    t = type(v)
    if t is int:
        return ("i", v == 1, v % 16 == 0, -(2**31) <= v <= 2**31 - 1, 2**63 <= v <= 2**64 - 1)
    if t is float:
        return "f"
    if t is bool or v is None:
        return v
    if type(v).__name__ == "TensorDescriptor" and hasattr(v, "base"):
        return ("desc", v.base.dtype, tuple(v.block_shape), str(getattr(v, "padding", "")),
                repr(getattr(v, "layout", None)))        # Gluon's descriptors specialize on their layout too
    raise _NoPlan


class _Signature:
    """What the direct path needs of a kernel's parameters: which are constexpr, by position and
    name, and their names and defaults in order."""

    def __init__(self, kernel: Any):
        params = kernel.params
        self.const = tuple(bool(p.is_constexpr) for p in params)
        self.const_by_name = {p.name: bool(p.is_constexpr) for p in params}
        self.tail = [(p.name, p.default if p.has_default else _REQUIRED) for p in params]
        self.plans: dict = {}


_REQUIRED = object()


def _signature(kernel: Any) -> _Signature:
    sig = kernel.__dict__.get("_agentq_signature")
    if sig is None:
        sig = _Signature(kernel)
        kernel._agentq_signature = sig
    return sig


def call_class(sig: _Signature, args: tuple, kwargs: dict) -> tuple:
    """The key of one call: its arguments' classes (constexprs and options by value)."""
    const = sig.const
    pos = tuple(a if const[i] else arg_class(a) for i, a in enumerate(args))
    by_name = sig.const_by_name
    kw = tuple((k, v if by_name.get(k, True) else arg_class(v)) for k, v in kwargs.items())
    return pos, kw


def launch_kernel(kernel: Any, grid: Any, *args: Any, **kwargs: Any) -> None:
    """`kernel[grid](*args, **kwargs)`, through a cached plan where one applies (module docstring)."""
    if type(kernel) is not _JITFunction or not enabled() or callable(grid):
        kernel[grid](*args, **kwargs)
        return
    sig = _signature(kernel)
    device = _driver.active.get_current_device()
    try:
        key = (device, call_class(sig, args, kwargs))
        plan = sig.plans.get(key)
    except (_NoPlan, TypeError, IndexError):    # unkeyed type, unhashable value, more arguments than parameters
        counts["triton"] += 1
        kernel[grid](*args, **kwargs)
        return
    if plan is None:
        counts["triton"] += 1
        compiled = kernel[grid](*args, **kwargs)
        if all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata", "launch_metadata")):
            sig.plans[key] = (compiled, sig.tail[len(args):])
        return
    counts["direct"] += 1
    compiled, tail = plan
    values = args + tuple(kwargs[n] if n in kwargs else d for n, d in tail)
    _run_plan(compiled, grid, _driver.active.get_current_stream(device), values)


def _run_plan(kernel: Any, grid: tuple, stream: Any, values: tuple) -> None:
    """`JITFunction.run`'s launch (`MIRRORED_LAUNCH`) of compiled `kernel` with bound `values`."""
    knobs = _knobs
    grid_size = len(grid)
    grid_0 = grid[0]
    grid_1 = grid[1] if grid_size > 1 else 1
    grid_2 = grid[2] if grid_size > 2 else 1
    launch_metadata = kernel.launch_metadata(grid, stream, *values)
    kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,
               knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)
