"""Triton availability, interpreter mode and the dot-dtype choice shared by agentq's Triton kernels.

* `HAVE_TRITON`: whether `triton` imports. The kernel modules define their kernels only then; their
  torch references (e.g. `triton_attention.decode_attention_ref`) import without Triton.
* `interpreting()`: `TRITON_INTERPRET=1`. Triton reads the variable when a kernel is *decorated*
  (`triton.jit`), not when it runs, so a kernel module imported without it never interprets.
  `load_interpreted()` (re)imports kernel modules under the interpreter for CPU tests, and
  `restore_compiled()` puts compiled ones back.
* `interpreter_fma_rounds_once()`: whether the interpreter's `tl.fma` rounds once, as the GPU's.
* `cuda_half(device, dtype)`: the device/dtype condition of every GPU fast path (CUDA bf16/fp16).
* `dot_dtype()`: the operand dtype of `tl.dot`. bf16 `tl.dot` is wrong under the interpreter
  (bf16 is handed to numpy as raw bits), so interpreted kernels dot in fp32; on CUDA bf16/fp16 dot
  in their own dtype and fp32 dots in IEEE fp32 (not tf32).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    import torch

try:   # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except Exception:   # triton missing or broken: torch paths only
    triton = None
    tl = None
    HAVE_TRITON = False

#: agentq's Triton kernel modules, in import-dependency order
KERNEL_MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_gemm", "agentq.kernels.triton_attention")


def interpreting() -> bool:
    """True when Triton kernels decorated now would run in the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_fma_rounds_once() -> bool:
    """Whether Triton's interpreter rounds `tl.fma` once, as the GPU does (Triton ≥ 3.9; earlier
    interpreters multiply and then add, rounding twice). Probed on (1 + 2⁻¹²)² − (1 + 2⁻¹¹), whose
    exact value 2⁻²⁴ double rounding turns into 0. Code whose bits rest on a single-rounded fma
    (`triton_quant`'s fast codes) must not run under an interpreter that answers False."""
    if not HAVE_TRITON:
        return False
    try:
        import numpy as np
        from triton.runtime import interpreter as ti

        a = np.array([1 + 2.0 ** -12], np.float32)
        c = np.array([-(1 + 2.0 ** -11)], np.float32)
        h = ti.InterpreterBuilder().create_fma(*(ti.TensorHandle(v, tl.float32) for v in (a, a, c)))
        return float(np.asarray(h.data).reshape(-1)[0]) == 2.0 ** -24
    except Exception:       # an interpreter whose internals differ: assume the worst
        return False


def cuda_half(device: "torch.device | str", dtype: "torch.dtype") -> bool:
    """Whether a model or tensor of `dtype` on `device` takes the GPU fast paths (fused Triton
    kernels, flash attention, CUDA graphs): CUDA in bf16/fp16. fp32 keeps the exact torch paths,
    the mode where the engine and the aligned learner agree to ~1e-6."""
    import torch
    return torch.device(device).type == "cuda" and dtype in (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    import torch
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    import torch
    return torch.cuda.get_device_capability(index)


def _index(device: torch.device) -> int:
    """A CUDA device's index (the current device for a bare "cuda")."""
    import torch
    return device.index if device.index is not None else torch.cuda.current_device()


def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, queried once per device: launch
    wrappers ask per call, and torch's query costs a device-properties lookup each time."""
    return _capability(_index(device))


def num_sms(device: torch.device | None = None) -> int:
    """Multiprocessors of a CUDA device (132 on an H200; also the default off CUDA)."""
    if device is not None and device.type == "cuda":
        return _sm_count(_index(device))
    return 132


def tma_available(device: torch.device, interpreted: bool) -> bool:
    """Whether kernels may load through TMA descriptors on `device`: sm_90+ CUDA devices, or any
    device when the kernels are interpreted (the interpreter emulates descriptor loads)."""
    if interpreted:
        return True
    return device.type == "cuda" and capability(device)[0] >= 9


def require_triton(what: str = "this kernel") -> None:
    if not HAVE_TRITON:
        raise RuntimeError(f"{what} needs triton (pip install triton); use the torch reference instead")


def runs_interpreted(kernel: Any) -> bool:
    """Whether a decorated kernel (JITFunction, InterpretedFunction or Autotuner) is interpreted."""
    while type(kernel).__name__ in ("Autotuner", "Heuristics"):
        kernel = kernel.fn
    return type(kernel).__name__ == "InterpretedFunction"


def dot_dtype(kernel, dtype):
    """`tl.dot` operand dtype for data of torch `dtype` run by `kernel` (see the module docstring)."""
    import torch
    if runs_interpreted(kernel):
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(dtype, tl.float32)


@contextlib.contextmanager
def env_set(name: str, value: str) -> Iterator[None]:
    """Environment variable `name` = value for the duration of the block, then as it was."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def interpreter_env(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Set (or clear) TRITON_INTERPRET for the duration of the block, then restore it."""
    return env_set("TRITON_INTERPRET", "1" if on else "0")


def _load(names: Iterable[str], interpret: bool) -> list[ModuleType]:
    mods = []
    reloaded = False
    with interpreter_env(interpret):
        for name in names:
            mod = sys.modules.get(name)
            if mod is None:
                mod = importlib.import_module(name)
            elif reloaded or getattr(mod, "INTERPRETED", None) != interpret:
                # a later module may hold kernels of an earlier one (`from .triton_attention import
                # _load_tile`): once one is reloaded, the rest are too, so no stale kernel is kept
                mod = importlib.reload(mod)
                reloaded = True
            mods.append(mod)
    return mods


def load_interpreted(names=KERNEL_MODULES):
    """Import the kernel modules with interpreted kernels (reloading compiled ones); returns them.

    Modules are reloaded in dependency order, so cross-module references follow. Call
    `restore_compiled()` afterwards to leave compiled kernels for the rest of a process.
    """
    require_triton("load_interpreted")
    return _load(names, True)


def load_compiled(names=KERNEL_MODULES):
    """Import the kernel modules with compiled kernels (reloading interpreted ones); returns them."""
    require_triton("load_compiled")
    return _load(names, False)


def restore_compiled(names=KERNEL_MODULES):
    """Reload interpreted kernel modules as compiled ones (no-op for modules never imported)."""
    if not HAVE_TRITON:
        return []
    loaded = [n for n in names if n in sys.modules]
    return _load(loaded, False)
