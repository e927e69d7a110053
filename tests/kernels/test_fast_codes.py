"""The default codes path (`triton_quant._codes_values` with FAST; `AGENTQ_FAST_CODES=0` turns it
off): a row's reciprocal + two fma corrections instead of a per-element IEEE division, half-even
rounding by an add pair. Under TRITON_INTERPRET=1, whose fma rounds once as the GPU's does: the
codes and scales of `quant.quantize_rows` bit for bit, for every finite bf16 value against hundreds
of row scales, for fp32 values placed on and one ulp around the half-integer quotients, where a
quotient off by an ulp would change a code, and for rows whose scale is infinite."""
import pytest
import torch

from agentq.kernels import _interp, quant

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
MODULES = ("agentq.kernels.triton_quant",)


@pytest.fixture(params=[True, False], ids=["fast", "division"])
def TQ(request, monkeypatch):
    """triton_quant interpreted, with the switch on (and off, the reference path, for contrast)."""
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test (the GPU machine runs the compiled tests)")
    if request.param and not _interp.interpreter_fma_rounds_once():
        pytest.skip("this Triton's interpreter rounds fma twice: the fast path stays off under it")
    monkeypatch.setenv("AGENTQ_FAST_CODES", "1" if request.param else "0")
    (tq,) = _interp.load_interpreted(MODULES)
    assert bool(tq.FAST_CODES) == request.param
    yield tq
    monkeypatch.delenv("AGENTQ_FAST_CODES")
    _interp.restore_compiled(MODULES)


def _all_finite_bf16() -> torch.Tensor:
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16)
    return x[torch.isfinite(x.float())]


def _rows_of_every_bf16(n_rows: int, seed: int) -> torch.Tensor:
    """Row i: every finite bf16 value of magnitude ≤ a_i, and a_i itself (the row's absmax, so its
    scale is a_i / 127); a_i spans the bf16 magnitudes from 1e-30 to 1e30 (and a few exact powers of
    two and all-ones significands), zeros pad the rows."""
    every = _all_finite_bf16()
    g = torch.Generator().manual_seed(seed)
    mags = torch.exp(torch.empty(n_rows).uniform_(-69.0, 69.0, generator=g)).to(torch.bfloat16)
    mags[:4] = torch.tensor([1.0, 2.0 ** -20, 1.9921875, 3.3895314e38], dtype=torch.float32).to(torch.bfloat16)
    rows = torch.zeros(n_rows, every.numel(), dtype=torch.bfloat16)
    for i, a in enumerate(mags):
        keep = every[every.float().abs() <= a.float()]
        rows[i, :keep.numel()] = keep
    return rows


@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_codes_of_every_bf16_value_against_many_scales(TQ, mode):
    x = _rows_of_every_bf16(48, seed=1 if mode == "half_even" else 2)
    codes, scales = TQ.quantize_rows(x, 1e-8, mode)
    ref_codes, ref_scales = quant.quantize_rows(x, 1e-8, mode)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(codes, ref_codes), (codes != ref_codes).sum()


def _near_half_integers(n_rows: int, seed: int) -> torch.Tensor:
    """fp32 rows whose quotients x / scale sit on the half-integers k + 1/2 (|k| ≤ 126) as closely
    as fp32 allows, and one and two ulps to either side: x = nextafter^j(RN((k + 1/2) · s))."""
    g = torch.Generator().manual_seed(seed)
    amax = torch.exp(torch.empty(n_rows).uniform_(-20.0, 20.0, generator=g))
    s = torch.clamp(amax / 127.0, min=1e-8)
    k = torch.arange(-127, 127, dtype=torch.float32) + 0.5
    base = (k[None, :] * s[:, None]).reshape(n_rows, -1)
    cols = [base]
    for toward in (float("inf"), float("-inf")):
        step = base
        for _ in range(2):
            step = torch.nextafter(step, torch.full_like(step, toward))
            cols.append(step)
    x = torch.cat(cols + [amax[:, None]], dim=1)
    return x[:, torch.randperm(x.shape[1], generator=g)]


@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_codes_on_and_around_half_integer_quotients(TQ, mode):
    x = _near_half_integers(64, seed=3)
    for rows in (x, x[:, :1000]):                   # the long-row kernel and the row-tile kernel
        codes, scales = TQ.quantize_rows(rows, 1e-8, mode)
        ref_codes, ref_scales = quant.quantize_rows(rows, 1e-8, mode)
        assert torch.equal(scales, ref_scales)
        assert torch.equal(codes, ref_codes), (codes != ref_codes).sum()


@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_rows_with_an_infinite_scale_give_the_division_codes(TQ, mode):
    """An inf in a row makes its scale inf: x / inf is ±0 for finite x (code 0), where the
    reciprocal's corrections alone would give NaN (0 · inf). Finite entries are compared; the inf's
    own code (NaN to int8) is not defined in either path."""
    x = torch.tensor([[1.0, -3.0, float("inf"), 0.5, 1e38, -1e-30],
                      [2.0, float("-inf"), 7.0, 0.0, -4.0, 3.0],
                      [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], dtype=torch.float32)
    codes, scales = TQ.quantize_rows(x, 1e-8, mode)
    ref_codes, ref_scales = quant.quantize_rows(x, 1e-8, mode)
    finite = torch.isfinite(x)
    assert torch.equal(scales, ref_scales) and torch.isinf(scales[:2]).all()
    assert torch.equal(codes[finite], ref_codes[finite])
    assert (codes[:2][finite[:2]] == 0).all() and codes[2].tolist() == [21, 42, 64, 85, 106, 127]


def test_the_fma_probe_tells_single_from_double_rounding(monkeypatch):
    """`interpreter_fma_rounds_once` against this Triton (3.9 rounds once, what the tests above rest
    on; 3.6 rounds twice) and against an interpreter patched to multiply, round, then add, as Triton < 3.9's
    does; under that one triton_quant keeps the division path even with the switch on."""
    import numpy as np
    from triton.runtime import interpreter as ti

    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test")
    import triton
    from packaging.version import Version

    assert _interp.interpreter_fma_rounds_once() == (Version(triton.__version__).release >= (3, 9))

    def twice(self, x, y, z):
        return ti.TensorHandle(np.asarray(x.data * y.data, dtype=np.float32) + z.data, z.dtype.scalar)

    monkeypatch.setattr(ti.InterpreterBuilder, "create_fma", twice)
    assert not _interp.interpreter_fma_rounds_once()
    monkeypatch.setenv("AGENTQ_FAST_CODES", "1")
    try:
        (tq,) = _interp.load_interpreted(MODULES)
        assert not bool(tq.FAST_CODES)
    finally:
        _interp.restore_compiled(MODULES)
