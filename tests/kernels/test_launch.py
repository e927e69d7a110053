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


def test_stand_ins_take_their_own_call():
    calls = []

    class Spy:                                                   # what a test puts in a kernel's place
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    launch.launch_kernel(Spy(), (2, 3), 1, BLOCK=4)
    assert calls == [((2, 3), (1,), {"BLOCK": 4})]
