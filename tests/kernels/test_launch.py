"""`kernels.launch`: the launch cache's key and its fallbacks (CPU). The cached launches
themselves run on a GPU: `test_triton_cuda.py::test_launch_cache_*`."""
import pytest
import torch

from agentq.kernels import _interp, launch

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")


def test_key_is_at_least_as_fine_as_tritons_specialization():
    k = launch._value_key
    buf = torch.zeros(64, dtype=torch.int8)
    assert k(buf[16:]) == k(buf) != k(buf[1:])                  # 16-byte alignment of pointers
    assert k(buf) != k(buf.view(torch.uint8))                    # dtype
    assert k(16) != k(32) and k(17) != k(33)                     # every integer value, not only % 16
    assert k(True) != k(1) and k(None) != k(0)
    assert k(1.0) == k(2.5)                                      # floats are runtime values for Triton too
    import triton.language as tl
    assert k(tl.float16) != k(tl.bfloat16)                       # constexpr dtypes


def test_interpreted_kernels_take_tritons_path():
    (tq,) = _interp.load_interpreted(("agentq.kernels.triton_quant",))
    try:
        x = torch.randn(3, 40)
        tq.quantize_rows(x, 1e-8, "half_away")
        tq.quantize_rows(x, 1e-8, "half_away")
        used = [c for c in launch._CACHES.values() if c.kernel in (tq._quant_rows_kernel, tq._quant_row_tiles_kernel)]
        assert used                                              # the launch went through launch_kernel
        assert all(not c.compiled_kernel and c.hits == c.misses == 0 and not c.entries for c in used)
    finally:
        _interp.restore_compiled(("agentq.kernels.triton_quant",))


def test_a_launch_hook_turns_the_cache_off(monkeypatch):
    """Triton >= 3.4 keeps launch hooks in `knobs.runtime` (None, or an empty chain when unset);
    a profiler's hook must see every launch, so the cache steps aside while one is set."""
    import triton

    (tg,) = _interp.load_compiled(("agentq.kernels.triton_gemm",))
    cache = launch.cache_of(tg._w8a8_gemm_kernel)
    assert cache.compiled_kernel and "w_ptr" in cache.arg_names
    runtime = triton.knobs.runtime
    assert launch._fast_path(cache)                              # no hook set: the cache is on
    if hasattr(runtime.launch_enter_hook, "add"):
        hook = lambda metadata: None                             # noqa: E731
        runtime.launch_enter_hook.add(hook)
        try:
            assert not launch._fast_path(cache)
        finally:
            runtime.launch_enter_hook.remove(hook)
    else:
        monkeypatch.setattr(runtime, "launch_enter_hook", lambda metadata: None)
        assert not launch._fast_path(cache)
    monkeypatch.setenv("AGENTQ_LAUNCH_CACHE", "0")
    assert not launch._fast_path(cache)


def test_stand_ins_take_their_own_call():
    calls = []

    class Spy:                                                   # what a test puts in a kernel's place
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    launch.launch_kernel(Spy(), (2, 3), 1, BLOCK=4)
    assert calls == [((2, 3), (1,), {"BLOCK": 4})]
