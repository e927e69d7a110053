"""Triton launches with less host time: the compiled kernel found once per call signature.

`kernel[grid](*args, **kw)` binds every argument, recomputes the specialization key (dtypes,
16-byte alignment of pointers, divisibility of integers) and looks the compiled kernel up on each
call: 40-80 µs of host time per launch on the H200 machine, where a torch op costs 9-14 µs
(`python -m agentq.eval.bench_learner --host-cost`). The engine's decode replays CUDA graphs, so
this never shows there; the learner launches thousands of kernels per step and waits on its host.

`launch_kernel(kernel, grid, *args, **kw)` does the same launch. The first call with a signature goes
through Triton (which compiles or finds the kernel) and keeps the compiled kernel under a key that
is at least as fine as Triton's: every tensor's dtype and 16-byte alignment, every integer's *value*
(Triton keys on divisibility only, so two sizes can share one compiled kernel here only through
two entries), every other argument's value, the launch options and the device. Later calls with
the same key go straight to the compiled kernel's launcher with the arguments in signature order,
as Triton itself does after its lookup. Anything outside that contract (the interpreter, a
launch hook such as a profiler's, a Triton without `knobs`, AGENTQ_LAUNCH_CACHE=0) takes
Triton's path every time.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch

from ._interp import HAVE_TRITON, runs_interpreted

#: compiled kernels kept per Triton function (least recently used dropped first)
MAX_ENTRIES = 256


class _Entry:
    __slots__ = ("compiled", "names")

    def __init__(self, compiled: Any, names: tuple[str, ...]):
        self.compiled = compiled
        self.names = names          # the kernel parameters passed by keyword, in signature order


class LaunchCache:
    """Compiled kernels of one Triton function by call signature, and hit / miss counts."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.compiled_kernel = _is_jit_function(kernel) and not runs_interpreted(kernel)
        self.arg_names = tuple(kernel.arg_names) if self.compiled_kernel else ()


_CACHES: dict[int, LaunchCache] = {}


def _is_jit_function(kernel: Any) -> bool:
    """A plain `@triton.jit` function (not a wrapper, an autotuner or a test's stand-in)."""
    if not HAVE_TRITON:
        return False
    from triton.runtime.jit import JITFunction
    return isinstance(kernel, JITFunction)


def cache_of(kernel: Any) -> LaunchCache:
    """The launch cache of a Triton function (tests, diagnostics)."""
    cache = _CACHES.get(id(kernel))
    if cache is None or cache.kernel is not kernel:
        cache = _CACHES[id(kernel)] = LaunchCache(kernel)
    return cache


def _knobs() -> Any:
    import triton
    return getattr(triton, "knobs", None)         # Triton >= 3.4: launch hooks live in knobs.runtime


def _unset(hook: Any) -> bool:
    """No launch hook: None, or (newer Triton) an empty `HookChain`."""
    return hook is None or getattr(hook, "calls", None) == []


def _fast_path(cache: LaunchCache) -> bool:
    if not cache.compiled_kernel or os.environ.get("AGENTQ_LAUNCH_CACHE", "1") == "0":
        return False
    knobs = _knobs()
    return knobs is not None and _unset(knobs.runtime.launch_enter_hook) and _unset(knobs.runtime.launch_exit_hook)


def _value_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0, v.device.index)
    if v is None or isinstance(v, (bool, int, str)):
        return (type(v), v)
    if isinstance(v, float):
        return float                               # floats are never specialized
    return (type(v), repr(v))                      # constexpr values such as tl.float16


def launch_kernel(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """`kernel[grid](*args, **kwargs)` with the compiled kernel found once per call signature.

    Args:
        kernel: a `@triton.jit` function (interpreted ones run through Triton as usual).
        grid: 1 to 3 program counts.
        *args, **kwargs: the kernel's arguments and launch options, as for `kernel[grid]`.
    """
    cache = cache_of(kernel)
    if not _fast_path(cache):
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    key = (device, tuple(_value_key(a) for a in args), tuple((k, _value_key(v)) for k, v in kwargs.items()))
    entry = cache.entries.get(key)
    if entry is None:
        cache.misses += 1
        compiled = kernel[grid](*args, **kwargs)
        names = cache.arg_names[len(args):]
        if hasattr(compiled, "run") and hasattr(compiled, "packed_metadata") and all(n in kwargs for n in names):
            cache.entries[key] = _Entry(compiled, names)
            if len(cache.entries) > MAX_ENTRIES:
                cache.entries.popitem(last=False)
        return
    cache.hits += 1
    cache.entries.move_to_end(key)
    compiled = entry.compiled
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    compiled.run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *(kwargs[n] for n in entry.names))


__all__ = ["LaunchCache", "cache_of", "launch_kernel"]
