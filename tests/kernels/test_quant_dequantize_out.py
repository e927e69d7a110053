"""`quant.dequantize_rows` with `out=` / `work=` (the KV cache's reusable read buffers): the same
bits as the plain form, written into the given tensor; bad buffers refused."""
import pytest
import torch

from agentq.kernels import quant

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
SHAPES = [(1, 1), (3, 7), (2, 5, 13), (2, 3, 1, 31)]


def _codes_scale(shape, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)
    scale = torch.rand(shape[:-1], generator=g) * 0.1 + 1e-3
    return codes.to(device), scale.to(device)


def _forms(codes, scale, dtype):
    """Every out/work combination's result, with the `out` tensor each was given (or None)."""
    dev = codes.device
    for with_out in (True, False):
        for with_work in (True, False):
            if not (with_out or with_work):
                continue
            out = torch.full(codes.shape, 7.0, dtype=dtype, device=dev) if with_out else None
            work = torch.full(codes.shape, 3.0, device=dev) if with_work else None
            yield out, quant.dequantize_rows(codes, scale, dtype, out=out, work=work)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_form_equals_plain_form_bit_for_bit_and_writes_into_out(dtype, shape):
    codes, scale = _codes_scale(shape, seed=len(shape))
    want = quant.dequantize_rows(codes, scale, dtype)
    for c in (codes, codes.float()):                     # int8 codes, and the same codes held in fp32
        held = c.clone()
        for out, got in _forms(c, scale, dtype):
            assert got.dtype == dtype and torch.equal(got, want)
            if out is not None:
                assert got.data_ptr() == out.data_ptr()
        assert torch.equal(c, held)                      # the codes are never written


@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_scale_is_one_scale_for_every_element(dtype):
    """A float or 0-d tensor (the fp8 KV cache's per-tensor scale) multiplies every code, in fp32."""
    g = torch.Generator().manual_seed(3)
    codes = (torch.randn(2, 3, 9, generator=g) * 50).to(torch.float8_e4m3fn)
    for s in (0.37, torch.tensor(0.37)):
        want = (codes.float() * s).to(dtype)
        assert torch.equal(quant.dequantize_rows(codes, s, dtype), want)
        for out, got in _forms(codes, s, dtype):
            assert torch.equal(got, want) and (out is None or got.data_ptr() == out.data_ptr())


def test_non_contiguous_out_and_work():
    codes, scale = _codes_scale((4, 6, 10), seed=5)
    want = quant.dequantize_rows(codes, scale, torch.bfloat16)
    out = torch.empty(10, 6, 4, dtype=torch.bfloat16).permute(2, 1, 0)
    work = torch.empty(4, 10, 6).transpose(1, 2)
    got = quant.dequantize_rows(codes, scale, torch.bfloat16, out=out, work=work)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, want)


@pytest.mark.parametrize(("kw", "match"), [
    (lambda c: {"out": torch.empty(3, 6)}, r"out must be torch.float32 of the codes' shape \(3, 7\)"),
    (lambda c: {"out": torch.empty(3, 7, dtype=torch.bfloat16)}, r"out must be torch.float32 .* got torch.bfloat16"),
    (lambda c: {"work": torch.empty(3, 7, dtype=torch.float64)}, r"work must be torch.float32 .* got torch.float64"),
    (lambda c: {"work": torch.empty(7, 3)}, r"work must be torch.float32 .* got torch.float32 \(7, 3\)"),
    (lambda c: {"work": torch.empty(3, 7).numpy()}, r"work must be a tensor"),
])
def test_bad_out_or_work_is_a_clear_value_error(kw, match):
    codes, scale = _codes_scale((3, 7))
    with pytest.raises(ValueError, match=match):
        quant.dequantize_rows(codes, scale, torch.float32, **kw(codes))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_out_form_and_scalar_scale_give_the_plain_bits(dtype):
    """CUDA: the out/work form equals the one-kernel plain form, which equals the CPU's bits; an
    fp8 per-tensor scale gives `(codes.float() * s).to(dtype)` (the fp8 cache's read before)."""
    codes, scale = _codes_scale((5, 3, 33), seed=9, device="cuda")
    want = quant.dequantize_rows(codes, scale, dtype)
    assert torch.equal(want.cpu(), quant.dequantize_rows(codes.cpu(), scale.cpu(), dtype))
    for out, got in _forms(codes, scale, dtype):
        assert torch.equal(got, want) and (out is None or got.data_ptr() == out.data_ptr())
    f8 = (torch.randn(5, 3, 33, device="cuda") * 50).to(torch.float8_e4m3fn)
    for s in (0.37, torch.tensor(0.37, device="cuda")):
        ref = (f8.float() * s).to(dtype)
        assert torch.equal(quant.dequantize_rows(f8, s, dtype), ref)
        for out, got in _forms(f8, s, dtype):
            assert torch.equal(got, ref) and (out is None or got.data_ptr() == out.data_ptr())
