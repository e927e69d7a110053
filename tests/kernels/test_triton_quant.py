"""`triton_quant.quantize_rows(..., col_scale=s)` (the learner's int8 dX quantizes dY · s_w in one
launch) under TRITON_INTERPRET=1 against its torch reference `quant.quantize_scaled_rows`: the same
codes and scales bit for bit, single- and two-pass rows, rows the tiled kernel would otherwise take,
zero and tiny rows, both roundings, the gradients' floor and the activations'."""
import pytest
import torch

from agentq.kernels import _interp, quant

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
MODULES = ("agentq.kernels.triton_quant",)


@pytest.fixture
def TQ():
    """triton_quant with interpreted kernels for one test, compiled ones put back afterwards; skipped on
    a GPU machine (the compiled path runs in tests/learner/test_ste.py's CUDA test there)."""
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test (the GPU machine runs the compiled tests)")
    (tq,) = _interp.load_interpreted(MODULES)
    assert tq.INTERPRETED
    yield tq
    _interp.restore_compiled(MODULES)


def _grad_like(rows: int, k: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(dY-like rows over many decades, per-column scales like s_w): a zero row, a row whose products
    are subnormal, a tie-heavy row, outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-12, 0, rows)[:, None]
    x[1] = 0.0
    x[2] = 1e-36 * torch.randn(k, generator=g)             # x · s subnormal: below the floor, codes 0
    x[3, ::5] *= 50.0
    s = torch.rand(k, generator=g) * 1e-3 + 1e-5
    s[4] = 0.0                                              # an all-zero weight channel (floored scale)
    return x.to(dtype), s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_col_scaled_rows_are_the_torch_reference_bit_for_bit(TQ, dtype, mode):
    x, s = _grad_like(9, 300, dtype)
    for floor in (quant.GRAD_SCALE_FLOOR, 1e-8):
        q_ref, s_ref = quant.quantize_scaled_rows(x, s, floor, mode)
        q_tri, s_tri = TQ.quantize_rows(x, floor, mode, col_scale=s)
        assert torch.equal(s_tri, s_ref)
        assert torch.equal(q_tri, q_ref), int((q_tri != q_ref).sum())
    assert torch.equal(q_tri[1], torch.zeros(300, dtype=torch.int8))
    assert torch.equal(q_ref, quant.quantize_rows(x.float() * s, 1e-8, mode)[0])   # the reference's definition


def test_col_scaled_two_pass_rows(TQ, monkeypatch):
    monkeypatch.setattr(TQ, "MAX_SINGLE_PASS", 64)         # rows of 200: the two-pass loop (16k+ on a GPU)
    x, s = _grad_like(6, 200, torch.bfloat16, seed=1)
    q_ref, s_ref = quant.quantize_scaled_rows(x, s, quant.GRAD_SCALE_FLOOR, "half_even")
    q_tri, s_tri = TQ.quantize_rows(x, quant.GRAD_SCALE_FLOOR, "half_even", col_scale=s)
    assert torch.equal(q_tri, q_ref) and torch.equal(s_tri, s_ref)


@pytest.mark.parametrize("min_k", [None, 64])
def test_col_scale_is_applied_where_the_tiled_kernel_would_run(TQ, monkeypatch, min_k):
    """Many short rows go to the tiled kernel, which has no column scales: with them the row kernel
    runs, and for rows longer than CHUNK_MIN_K the chunked one (strided input included)."""
    launched = []
    launch = TQ.launch_kernel
    monkeypatch.setattr(TQ, "launch_kernel", lambda kernel, *a, **kw: (launched.append(kernel), launch(kernel, *a, **kw)))
    if min_k:
        monkeypatch.setattr(TQ, "CHUNK_MIN_K", min_k)
    x, s = _grad_like(TQ.TILE_MIN_ROWS + 3, 96, torch.float32, seed=2)
    x = torch.cat([x, x], dim=1)[:, 96:]                   # a row stride of 192
    q_ref, s_ref = quant.quantize_scaled_rows(x, s, quant.GRAD_SCALE_FLOOR, "half_even")
    q_tri, s_tri = TQ.quantize_rows(x, quant.GRAD_SCALE_FLOOR, "half_even", col_scale=s)
    assert launched == [TQ._quant_row_chunks_kernel if min_k else TQ._quant_rows_kernel]
    assert torch.equal(q_tri, q_ref) and torch.equal(s_tri, s_ref)
    assert not torch.equal(q_tri, TQ.quantize_rows(x, quant.GRAD_SCALE_FLOOR, "half_even")[0])


@pytest.mark.parametrize("mode", ["half_even", "half_away"])
@pytest.mark.parametrize("col_scale", [True, False])
def test_chunked_rows_are_the_row_kernel_bit_for_bit(TQ, mode, col_scale):
    """`_quant_row_chunks_kernel` (BLOCK_M rows, BLOCK_K columns at a time): rows not a multiple of
    BLOCK_M, a last column block part-masked, three blocks per row; the same codes and scales as the
    torch reference and as the per-row kernel."""
    x, s = _grad_like(11, 200, torch.bfloat16, seed=3)
    cs = s if col_scale else None
    floor = quant.GRAD_SCALE_FLOOR if col_scale else 1e-8
    q_ref, s_ref = (quant.quantize_scaled_rows(x, s, floor, mode) if col_scale
                    else quant.quantize_rows(x, floor, mode))
    q_chk, s_chk = TQ.quantize_rows(x, floor, mode, col_scale=cs, chunks=(4, 64, 4))
    q_row, s_row = TQ.quantize_rows(x, floor, mode, col_scale=cs, launch=(256, True, 1))
    assert torch.equal(s_chk, s_ref) and torch.equal(q_chk, q_ref), int((q_chk != q_ref).sum())
    assert torch.equal(q_chk, q_row) and torch.equal(s_chk, s_row)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_weight_codes_by_the_kernel_are_the_torch_reference_bit_for_bit(TQ, dtype, mode):
    """`int8_linear.quantize_weight` (the engine's weight sync; one launch on CUDA) gives the codes
    and scales of `quant.quantize_weight`: rows of the sizes the engine loads (long rows take the
    two-pass kernel), a zero channel, a tie-heavy one and an outlier one."""
    import dataclasses

    from agentq.kernels import QuantSpec, int8_linear

    spec = dataclasses.replace(QuantSpec.preset("w8a8_kv8"), weight_rounding=mode)
    for n, k in ((48, 256), (6, 6144)):
        w = (torch.randn(n, k, generator=torch.Generator().manual_seed(k)) * 0.02).to(dtype)
        w[1] = 0.0
        w[2] = 0.0                              # scale exactly 2^-7: ±2.5 and ±3.5 codes, ties each way
        w[2, 0], w[2, 1::3], w[2, 2::3] = 127 / 128, 2.5 / 128, -3.5 / 128
        w[3, 7] = 3.0
        got = int8_linear.quantize_weight(w, spec, backend="triton")
        want = quant.quantize_weight(w, spec)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (n, k)
        assert got[0].dtype == torch.int8 and got[0].abs().max() == 127
        ties = want[0][2, 1:3].tolist()
        assert ties == ([2, -4] if mode == "half_even" else [3, -4]), ties      # the rounding was exercised
