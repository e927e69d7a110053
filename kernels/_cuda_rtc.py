"""CUDA C++ kernels compiled at run time (NVRTC) and launched through the driver API, with ctypes.

For the few kernels Triton cannot express well (`cuda_attention`: warp-level MMAs whose operand
fragments are laid out by hand). Nothing here needs a CUDA toolkit: NVRTC ships with CUDA builds of
PyTorch (the `nvidia-cuda-nvrtc` wheel), and the driver (`libcuda.so.1`) comes with the GPU.

* `nvrtc()`: the NVRTC library, found by its soname or in the `nvidia/*/lib` folders of the Python
  path (`AGENTQ_NVRTC` names a file to use instead); `NvrtcUnavailable` when there is none.
* `compile_cubin(source, arch)`: machine code for one architecture (``"sm_90"``); `NvrtcError` with
  NVRTC's log when the source does not compile. Cached per (source, arch, options) in the process.
* `CudaKernel`: one function of a compiled module, loaded once per device, launched on a stream with
  optional programmatic dependent launch (`cuLaunchKernelEx`), so that it is captured by CUDA graphs
  like any kernel launched on the capturing stream.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
import threading
from typing import Sequence

#: CUlaunchAttributeID: programmatic stream serialization (the attribute behind PDL)
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
#: CUfunction_attribute: the preferred shared-memory share of L1 (percent); the most dynamic shared memory
_ATTR_SHARED_CARVEOUT = 9
_ATTR_MAX_DYNAMIC_SHARED = 8


class NvrtcUnavailable(RuntimeError):
    """No NVRTC library could be loaded."""


class NvrtcError(RuntimeError):
    """NVRTC refused the source; the message holds its log."""


def _nvrtc_candidates() -> list[str]:
    names = []
    if os.environ.get("AGENTQ_NVRTC"):
        names.append(os.environ["AGENTQ_NVRTC"])
    try:
        import torch
        major = (torch.version.cuda or "").split(".")[0]
        if major:
            names.append(f"libnvrtc.so.{major}")
    except Exception:     # pragma: no cover - torch always imports where this runs
        pass
    names.append("libnvrtc.so")
    for root in sys.path:   # pip's CUDA wheels: nvidia/cu13/lib, nvidia/cuda_nvrtc/lib
        names += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*")))
    return names


@functools.lru_cache(maxsize=None)
def nvrtc() -> ctypes.CDLL:
    """The NVRTC library (see the module docstring for where it is looked for)."""
    tried = []
    for name in _nvrtc_candidates():
        if "builtins" in os.path.basename(name):
            continue
        try:
            # NVRTC opens its builtins library by name at compile time; a wheel's copy lies beside it,
            # where the loader does not look unless it is loaded already
            folder = os.path.dirname(name)
            for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))) if folder else []:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(name)
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            return lib
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise NvrtcUnavailable("no NVRTC library found (install PyTorch's CUDA build, or the nvidia-cuda-nvrtc "
                           "wheel, or set AGENTQ_NVRTC to libnvrtc.so's path); tried " + "; ".join(tried[:4]))


def nvrtc_version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


_compile_lock = threading.Lock()


@functools.lru_cache(maxsize=64)
def compile_cubin(source: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
    """`source` compiled by NVRTC for `arch` (e.g. ``"sm_90"``): the cubin's bytes."""
    lib = nvrtc()
    prog = ctypes.c_void_p()

    def check(res: int, what: str) -> None:
        if res != 0:
            raise NvrtcError(f"NVRTC {what}: {lib.nvrtcGetErrorString(res).decode()}")

    with _compile_lock:
        check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"agentq.cu", 0, None, None), "create")
        try:
            opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", *(o.encode() for o in options)]
            res = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            if res != 0:
                size = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetProgramLog(prog, log)
                raise NvrtcError(f"NVRTC could not compile for {arch}:\n{log.value.decode(errors='replace')}")
            size = ctypes.c_size_t()
            check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
            buf = ctypes.create_string_buffer(size.value)
            check(lib.nvrtcGetCUBIN(prog, buf), "cubin")
            return buf.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


# ---------------------------------------------------------------------- driver API
class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("value", ctypes.c_int)]


class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttrValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("num_attrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _check(res: int, what: str) -> None:
    if res != 0:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(res, ctypes.byref(msg))
        raise RuntimeError(f"CUDA driver: {what} failed: {(msg.value or b'error %d' % res).decode()}")


#: argument type codes of `CudaKernel.launch`: pointer (tensor or int address), fp32, int32, int64
_ARG_TYPES = {"p": ctypes.c_void_p, "f": ctypes.c_float, "i": ctypes.c_int32, "q": ctypes.c_int64}


class CudaKernel:
    """One `extern "C"` kernel of a cubin; its module is loaded once per device (the current
    device's primary context, which PyTorch makes current).

    Args:
        cubin: `compile_cubin`'s output.
        name: the kernel's (unmangled) name.
        signature: one type code per parameter (`_ARG_TYPES`): ``"p"`` pointer, ``"f"`` fp32,
            ``"i"`` int32, ``"q"`` int64.
        shared_carveout: the percent of L1 to prefer as shared memory (None: the driver's choice).
        dynamic_shared: bytes of dynamic shared memory each launch gets (`extern __shared__`).
    """

    def __init__(self, cubin: bytes, name: str, signature: str, shared_carveout: int | None = None,
                 dynamic_shared: int = 0):
        if any(c not in _ARG_TYPES for c in signature):
            raise ValueError(f"unknown argument type in {signature!r}; valid: {sorted(_ARG_TYPES)}")
        self.cubin, self.name, self.signature, self.shared_carveout = cubin, name, signature, shared_carveout
        self.dynamic_shared = dynamic_shared
        self._functions: dict[int, ctypes.c_void_p] = {}
        self._modules: list[ctypes.c_void_p] = []
        self._lock = threading.Lock()

    def function(self, device_index: int) -> ctypes.c_void_p:
        """The kernel loaded into `device_index`'s primary context (once; raises RuntimeError when the
        driver refuses the cubin or the launch attributes, e.g. more shared memory than the GPU has)."""
        fn = self._functions.get(device_index)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._functions.get(device_index)
            if fn is not None:
                return fn
            import torch
            with torch.cuda.device(device_index):
                torch.cuda.init()
                torch.empty(1, device=f"cuda:{device_index}")     # the primary context, current
                module, fn = ctypes.c_void_p(), ctypes.c_void_p()
                _check(_driver().cuModuleLoadData(ctypes.byref(module), self.cubin), f"loading {self.name}")
                _check(_driver().cuModuleGetFunction(ctypes.byref(fn), module, self.name.encode()),
                       f"finding {self.name}")
                if self.shared_carveout is not None:
                    _check(_driver().cuFuncSetAttribute(fn, _ATTR_SHARED_CARVEOUT, self.shared_carveout),
                           "setting the shared-memory carveout")
                if self.dynamic_shared > 48 * 1024:
                    _check(_driver().cuFuncSetAttribute(fn, _ATTR_MAX_DYNAMIC_SHARED, self.dynamic_shared),
                           f"allowing {self.dynamic_shared} bytes of dynamic shared memory")
            self._modules.append(module)
            self._functions[device_index] = fn
            return fn

    def launch(self, grid: Sequence[int], block: int, args: Sequence, stream: int, device_index: int,
               pdl: bool = False) -> None:
        """Queue the kernel on `stream` (a `cudaStream_t` as int). `args` follow `signature`
        (tensors for pointers). pdl: programmatic dependent launch (the kernel must start with
        ``griddepcontrol.wait``)."""
        if len(args) != len(self.signature):
            raise ValueError(f"{self.name} takes {len(self.signature)} arguments, got {len(args)}")
        values = [_ARG_TYPES[c](a.data_ptr() if c == "p" and hasattr(a, "data_ptr") else a)
                  for c, a in zip(self.signature, args)]
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        fn = self.function(device_index)
        current = ctypes.c_void_p()
        _check(_driver().cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if not current.value:       # a thread that has not touched CUDA: the device's primary context
            import torch
            torch.cuda.set_device(device_index)
        gx, gy, gz = (list(grid) + [1, 1])[:3]
        attr = _LaunchAttr(id=_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value.value = 1
        cfg = _LaunchConfig(gx, gy, gz, block, 1, 1, self.dynamic_shared, ctypes.c_void_p(stream),
                            ctypes.pointer(attr) if pdl else None, 1 if pdl else 0)
        _check(_driver().cuLaunchKernelEx(ctypes.byref(cfg), fn, params, None),
               f"launching {self.name}")
