"""`_launch.launch_kernel`, the direct launch of compiled Triton kernels.

On CPU (no driver, nothing compiles) three things are checked against Triton itself:
- the argument classes are at least as fine as Triton's own specializer (`native_specialize_impl`
  with the CUDA backend): two values of one class always get the same Triton specialization;
- the installed Triton's `JITFunction.run` ends in the launch the direct path mirrors;
- with a stand-in for the compiled kernel and the driver (the one fake here: a CPU machine has
  neither a CUDA driver nor a compiler for sm_90), a plan is reused for calls of one class, a new
  class goes through Triton's path, and the values handed to the launcher are, in order, the
  ones Triton's own binder (`create_function_from_signature`) makes of the same call.
The compiled path itself runs in every CUDA test on the GPU machine, and
`test_direct_launch_matches_triton_cuda` compares its outputs with Triton's path there.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.kernels import _interp, _launch

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")

EDGES = [0, 1, 2, 15, 16, 17, 32, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**63 - 16, 2**63, 2**63 + 16,
         2**64 - 16, 2**64 - 1, -1, -16, -(2**31), -(2**31) - 1, -(2**31) - 16]


@pytest.fixture(scope="module")
def specialize():
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import native_specialize_impl

    backend = make_backend(GPUTarget("cuda", 90, 32))
    return lambda v: native_specialize_impl(backend, v, False, True, True)


ints = st.one_of(st.sampled_from(EDGES), st.integers(-(2**40), 2**40), st.integers(0, 2**64 - 1))


@settings(max_examples=400, deadline=None)
@given(a=ints, b=ints)
def test_int_class_is_finer_than_triton(specialize, a, b):
    if _launch.arg_class(a) == _launch.arg_class(b):
        assert specialize(a) == specialize(b), (a, b)


def test_classes_are_not_finer_than_needed():
    """Row counts that Triton compiles once share a class (a plan per M would be a miss per call)."""
    cls = _launch.arg_class
    assert cls(32) == cls(4096) == cls(2**20)
    assert cls(17) == cls(8191)
    assert cls(1) != cls(2) and cls(16) != cls(17) and cls(2**31 - 16) != cls(2**31)
    assert cls(1.5) == cls(1e-6)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16, torch.float32])
def test_tensor_class_is_finer_than_triton(specialize, dtype):
    base = torch.zeros(8192, dtype=torch.int8)
    views = [base[o:o + 256].view(dtype) for o in range(0, 64, dtype.itemsize)]
    specs_by_class: dict = {}
    for v in views:
        specs_by_class.setdefault(_launch.arg_class(v), set()).add(specialize(v))
    assert all(len(specs) == 1 for specs in specs_by_class.values())
    assert len(specs_by_class) == 2             # 16-byte aligned or not: one plan each, not one per pointer


def test_scalars_none_bool_and_unkeyed(specialize):
    cls = _launch.arg_class
    for a, b in [(True, True), (False, False), (None, None), (0.5, 3.0)]:
        assert cls(a) == cls(b) and specialize(a) == specialize(b)
    assert cls(True) != cls(1) and cls(False) != cls(0)
    with pytest.raises(_launch._NoPlan):
        cls((1, 2))


def test_tensor_descriptor_class_is_finer_than_triton(specialize):
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t, block):
        return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block)
    a, b = torch.zeros(64, 128, dtype=torch.int8), torch.zeros(32, 256, dtype=torch.int8)
    cases = [desc(a, [16, 64]), desc(b, [16, 64]), desc(a, [32, 64]), desc(a.view(torch.int16)[:, :32], [16, 32])]
    for x in cases:
        for y in cases:
            if _launch.arg_class(x) == _launch.arg_class(y):
                assert specialize(x) == specialize(y)
    assert _launch.arg_class(cases[0]) == _launch.arg_class(cases[1])      # other base and shape: one plan
    assert _launch.arg_class(cases[0]) != _launch.arg_class(cases[2])      # other block: another kernel


def test_installed_triton_launch_is_the_mirrored_one(monkeypatch):
    """If this fails after a Triton upgrade, direct launches are off (Triton's path runs): update
    `MIRRORED_LAUNCH` and `_run_plan` to the new `JITFunction.run`."""
    monkeypatch.delenv("AGENTQ_FAST_LAUNCH", raising=False)
    _launch.enabled.cache_clear()
    try:
        assert _launch.enabled()
        monkeypatch.setenv("AGENTQ_FAST_LAUNCH", "0")
        _launch.enabled.cache_clear()
        assert not _launch.enabled()
    finally:
        _launch.enabled.cache_clear()


class _Compiled:
    """Stand-in for a CompiledKernel: records what the launcher is handed."""
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self):
        self.calls = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *values):
        self.calls.append(((g0, g1, g2), stream, function, packed, values))


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


@pytest.fixture
def kernel(monkeypatch):
    """A compiled-mode JITFunction whose Triton path is replaced by a recorder (no compiler here)."""
    if torch.cuda.is_available():
        pytest.skip("CPU stand-in test (the GPU machine launches real kernels: test_direct_launch_matches_triton_cuda)")
    import triton
    import triton.language as tl
    from triton.runtime.driver import driver

    with _interp.interpreter_env(False):
        @triton.jit
        def _k(x_ptr, out_ptr, n, scale, stride, FLAG: tl.constexpr, BLOCK: tl.constexpr = 64, MODE: tl.constexpr = 0):
            pass
    compiled = _Compiled()
    triton_calls = []

    def run(*args, grid, warmup, **kwargs):
        triton_calls.append((grid, args, kwargs))
        return compiled

    monkeypatch.setattr(_k, "run", run, raising=False)
    monkeypatch.delenv("AGENTQ_FAST_LAUNCH", raising=False)
    _launch.enabled.cache_clear()
    monkeypatch.setattr(driver, "_active", _Driver())
    yield _k, compiled, triton_calls
    _launch.enabled.cache_clear()


def test_plans_reused_per_class_and_values_in_triton_order(kernel):
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    k, compiled, triton_calls = kernel
    binder = create_function_from_signature(k.signature, k.params, make_backend(GPUTarget("cuda", 90, 32)))
    x = torch.zeros(256, dtype=torch.bfloat16)
    out = torch.zeros(256, dtype=torch.bfloat16)

    _launch.launch_kernel(k, (4,), x, out, 256, 0.5, 32, FLAG=True, num_warps=4)
    assert len(triton_calls) == 1 and not compiled.calls            # first call of its class: Triton's path
    _launch.launch_kernel(k, (8, 2), x, out, 4096, 2.0, 64, FLAG=True, num_warps=4)
    assert len(triton_calls) == 1 and len(compiled.calls) == 1      # same class: direct
    grid, stream, fn, packed, values = compiled.calls[0]
    assert (grid, stream, fn, packed) == ((8, 2, 1), 1234, "fn-handle", "packed")
    params, _, options = binder(x, out, 4096, 2.0, 64, FLAG=True, num_warps=4)
    assert list(values) == list(params.values()) and options == {"num_warps": 4}

    _launch.launch_kernel(k, (4,), x, out, 4096, 2.0, 64, FLAG=True, BLOCK=128, num_warps=4)    # constexpr value
    _launch.launch_kernel(k, (4,), x, out, 1, 2.0, 64, FLAG=True, num_warps=4)                  # n == 1
    _launch.launch_kernel(k, (4,), x[1:], out, 4096, 2.0, 64, FLAG=True, num_warps=4)           # misaligned x
    _launch.launch_kernel(k, (4,), x, out, 4096, 2.0, 64, FLAG=True, num_warps=8)               # option value
    _launch.launch_kernel(k, (4,), x, out, 4096, 2.0, 64, FLAG=False, num_warps=4)              # constexpr bool
    assert len(triton_calls) == 6 and len(compiled.calls) == 1
    _launch.launch_kernel(k, (4,), x, out, 48, 2.0, 64, FLAG=True, BLOCK=128, num_warps=4)
    params, _, _ = binder(x, out, 48, 2.0, 64, FLAG=True, BLOCK=128, num_warps=4)
    assert len(triton_calls) == 6 and list(compiled.calls[-1][4]) == list(params.values())


def test_interpreted_and_disabled_go_through_triton(kernel, monkeypatch):
    k, compiled, triton_calls = kernel
    x = torch.zeros(64)
    monkeypatch.setenv("AGENTQ_FAST_LAUNCH", "0")
    _launch.enabled.cache_clear()
    for _ in range(3):
        _launch.launch_kernel(k, (1,), x, x, 64, 1.0, 16, FLAG=True)
    assert len(triton_calls) == 3 and not compiled.calls
    monkeypatch.delenv("AGENTQ_FAST_LAUNCH")
    _launch.enabled.cache_clear()
    _launch.launch_kernel(k, lambda meta: (1,), x, x, 64, 1.0, 16, FLAG=True)     # callable grid: Triton's path
    _launch.launch_kernel(k, (1,), x, x, 64, 1.0, 16, FLAG=(1, 2))                # a tuple argument: unkeyed
    assert len(triton_calls) == 5 and not compiled.calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_direct_launch_matches_triton_cuda(monkeypatch):
    """Compiled kernels: the row quantization and the W8A8 GEMM (plain and persistent TMA rows) give
    the same bits through cached plans as through Triton's path, and repeated calls go direct."""
    from agentq.kernels import triton_gemm, triton_quant

    _interp.restore_compiled()

    def run(x, w, fast: bool):
        monkeypatch.setenv("AGENTQ_FAST_LAUNCH", "1" if fast else "0")
        _launch.enabled.cache_clear()
        xq, sx = triton_quant.quantize_rows(x, 1e-8, "half_away")
        wq, sw = triton_quant.quantize_rows(w, 1e-8, "half_away")
        y = triton_gemm.int8_gemm(xq, sx, wq, sw, None, torch.bfloat16)
        torch.cuda.synchronize()
        return xq, sx, y

    g = torch.Generator(device="cuda").manual_seed(0)
    try:
        for m in (16, 48, 8192):
            x = torch.randn(m, 2048, device="cuda", generator=g, dtype=torch.bfloat16)
            w = torch.randn(1024, 2048, device="cuda", generator=g, dtype=torch.bfloat16)
            ref = run(x, w, fast=False)
            before = _launch.counts["direct"]
            for got in (run(x, w, fast=True), run(x, w, fast=True)):
                for a, b in zip(ref, got):
                    assert torch.equal(a, b)
            assert _launch.counts["direct"] >= before + 3        # the second fast pass: three direct launches
    finally:
        _launch.enabled.cache_clear()
