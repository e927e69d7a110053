"""Fused RMSNorm and SiLU·mul (Triton, run under TRITON_INTERPRET=1 on CPU) against torch."""
import pytest
import torch
import torch.nn.functional as F

from agentq.kernels import _interp
from agentq.kernels.quant_spec import QuantSpec

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_norm")
SPEC_KV = QuantSpec.preset("w8a8_kv8")


@pytest.fixture
def K():
    """The norm kernels (re)imported under the interpreter, compiled ones put back afterwards (per
    test: a CUDA test in between restores the compiled kernels into the same module objects).
    Skipped on a GPU machine: the compiled tests below run there (its Triton 3.6 interpreter
    cannot run the looped kernels: 'only 0-dimensional arrays can be converted')."""
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test (the GPU machine runs the compiled tests)")
    quant_mod, norm = _interp.load_interpreted(MODULES)
    assert norm.INTERPRETED
    norm.quantize_kv_to_cache = quant_mod.quantize_kv_to_cache
    yield norm
    _interp.restore_compiled(MODULES)


def _torch_rms_norm(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in representable steps of bf16/fp16 (both finite, same dtype)."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    sa = torch.where(ia < 0, -(ia & 0x7FFF), ia)          # sign-magnitude → ordered integers
    sb = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return int((sa - sb).abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [64, 96, 256])
def test_rms_norm_matches_torch_to_one_rounding_step(K, dtype, n):
    rms_norm = K.rms_norm
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(3, 5, n, generator=g) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    ref = _torch_rms_norm(x, w, 1e-6)
    out = rms_norm(x, w, 1e-6)
    assert out.shape == ref.shape and out.dtype == dtype
    assert _ulps(out, ref) <= 1
    assert (out != ref).float().mean() < 0.02        # almost every element is bit-identical


@pytest.mark.parametrize("n", [128, 320, 96])
def test_multi_row_rms_norm_is_the_one_row_kernel_bit_for_bit(K, n):
    """Short rows go several to a program (`_rms_norm_rows_kernel`): the same bits as one row per
    program and as the fused pre-norm, rows not a multiple of the program's rows included."""
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(3, 13, n, generator=g) * 3).bfloat16()           # 39 rows: 16 + 16 + 7
    w = (1 + 0.1 * torch.randn(n, generator=g)).bfloat16()
    assert K._multi_row_fits(x.reshape(-1, n), w, K.triton.next_power_of_2(n))
    multi = K.rms_norm(x, w, 1e-6)
    assert torch.equal(multi, K.rms_norm(x, w, 1e-6, multi_row=False))
    assert torch.equal(multi, K.rms_norm_and_codes(x, w, 1e-6, 1e-8, "half_even")[0])
    assert _ulps(multi, _torch_rms_norm(x, w, 1e-6)) <= 1


def _unit_roundoff(dtype) -> float:
    return 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11


def _assert_within_one_rounding(got, ref, u):
    """Within one step of the dtype (≤ 2u relative) plus fp32 noise (1e-5 of the largest value),
    and almost everywhere the same bits."""
    got, ref32 = got.float(), ref.float()
    torch.testing.assert_close(got, ref32, rtol=2 * u, atol=1e-5 * float(ref32.abs().max()))
    assert (got != ref32).float().mean() < 0.01


def _hf_norm_grads(x, w, gy, eps, dtype):
    """(dx, dw) from torch autograd through HF's Qwen3RMSNorm module in `dtype`."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    norm = Qwen3RMSNorm(x.shape[-1], eps=eps).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w.to(dtype))
    xr = x.to(dtype).requires_grad_()
    norm(xr).backward(gy.to(dtype))
    return xr.grad, norm.weight.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,rows", [(128, 77), (96, 45), (1000, 11), (2048, 5)])
@pytest.mark.parametrize("sms", [None, 1])
def test_rms_norm_backward_matches_torch_formula_and_hf_autograd(K, monkeypatch, dtype, n, rows, sms):
    """`rms_norm_backward` (Triton) against (a) the learner's torch formula, (b) torch autograd of
    HF's Qwen3RMSNorm in fp32 and (c) in the dtype. Row counts are no multiple of a program's rows;
    sms=1: `BWD_PROGRAMS_PER_SM` programs in all, each looping over several row blocks."""
    from agentq.kernels.learner_ops import rms_norm_backward as torch_formula
    if sms:
        monkeypatch.setattr(K, "num_sms", lambda device=None: sms)
    g = torch.Generator().manual_seed(n + rows)
    x = (torch.randn(rows, n, generator=g) * 3).to(dtype)
    w = (1 + 0.2 * torch.randn(n, generator=g)).to(dtype)
    gy = torch.randn(rows, n, generator=g).to(dtype)
    dx, dw = K.rms_norm_backward(x, w, 1e-6, gy)
    assert dx.dtype == dtype and dw.dtype == dtype and dx.shape == x.shape and dw.shape == (n,)
    u = _unit_roundoff(dtype)
    # (a) the same formula, sums in another order: within one rounding of the dtype of each value
    # (+ fp32 noise where dx cancels), almost all bit-identical
    rx, rw = torch_formula(x, w, 1e-6, gy)
    _assert_within_one_rounding(dx, rx, u)
    _assert_within_one_rounding(dw, rw, u)
    # (b) fp32 autograd of HF's module: dx is the exact gradient rounded once (≤ u relative); dw
    # differs by h's rounding to the dtype in the forward: |Δdw| ≤ u·Σ|gy·h| + u·|dw|
    hx, hw = _hf_norm_grads(x, w, gy, 1e-6, torch.float32)
    assert ((dx.float() - hx).abs() <= u * hx.abs() * 1.001 + 1e-5 * float(hx.abs().max())).all()
    h = _torch_rms_norm(x, torch.ones_like(w), 1e-6).float()
    bound = u * (gy.float() * h).abs().sum(0) + u * hw.abs() * 1.001
    assert ((dw.float() - hw).abs() <= bound).all()
    # (c) HF's autograd in the dtype, the path this replaces (more roundings: relative norms 3e-3 here)
    for got, ref in zip((dx, dw), _hf_norm_grads(x, w, gy, 1e-6, dtype)):
        assert float((got.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


def test_rms_norm_backward_reads_strided_gradients_and_refuses_long_rows(K):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 64, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(64, generator=g)).bfloat16()
    gy = torch.randn(6, 4, 64, generator=g).bfloat16().transpose(0, 1)       # no row-contiguous layout
    dx, dw = K.rms_norm_backward(x, w, 1e-6, gy)
    rx, rw = K.rms_norm_backward(x, w, 1e-6, gy.contiguous())
    assert torch.equal(dx, rx) and torch.equal(dw, rw)
    dx, dw = K.rms_norm_backward(x[:0], w, 1e-6, gy[:0])                      # no rows: dw = 0
    assert dx.shape == (0, 6, 64) and torch.equal(dw, torch.zeros_like(w))
    with pytest.raises(ValueError, match="BWD_MAX_N"):
        K.rms_norm_backward(torch.zeros(1, K.BWD_MAX_N + 1).bfloat16(), torch.ones(K.BWD_MAX_N + 1).bfloat16(),
                            1e-6, torch.zeros(1, K.BWD_MAX_N + 1).bfloat16())


def test_norm_reads_per_head_views_of_a_wider_row_in_place(K, monkeypatch):
    """Qwen3's q/k norms over [B, T, H, D] column slices of a grouped projection's output: the rows
    are reached with two strides (`_row_layout`, no copy) and normed bit for bit as a contiguous
    copy, forward (one-row and multi-row launches) and backward."""
    g = torch.Generator().manual_seed(9)
    b, t, h, d, wide = 2, 5, 3, 64, 7 * 64          # q = heads 0-2 of a 7-head-wide row
    out = (torch.randn(b, t, wide, generator=g) * 3).bfloat16()
    q = out[..., : h * d].view(b, t, h, d)
    k = out[..., h * d: (h + 2) * d].view(b, t, 2, d)
    w = (1 + 0.1 * torch.randn(d, generator=g)).bfloat16()
    x2, rows, inner, s_outer, s_inner = K._row_layout(q)
    assert (rows, inner, s_outer, s_inner) == (b * t * h, h, wide, d) and x2.data_ptr() == q.data_ptr()
    assert K._row_layout(q.contiguous())[2:] == (1, d, 0)
    copies = []
    real_rows = K._rows
    monkeypatch.setattr(K, "_rows", lambda x: copies.append(x) or real_rows(x))
    for view in (q, k):
        ref = K.rms_norm(view.contiguous(), w, 1e-6)
        assert torch.equal(K.rms_norm(view, w, 1e-6), ref)
        assert torch.equal(K.rms_norm(view, w, 1e-6, multi_row=False), ref)
        gy = torch.randn(view.shape, generator=g).bfloat16()
        dx, dw = K.rms_norm_backward(view, w, 1e-6, gy)
        rx, rw = K.rms_norm_backward(view.contiguous(), w, 1e-6, gy)
        assert torch.equal(dx, rx) and torch.equal(dw, rw) and dx.shape == view.shape
    assert not any(c is q or c is k for c in copies)    # the views were never copied to plain rows
    bad = out.transpose(1, 2)[..., :d]                  # last dim not contiguous: copied, same result
    assert torch.equal(K.rms_norm(bad, w, 1e-6), K.rms_norm(bad.contiguous(), w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_mul_matches_torch_to_one_rounding_step(K, dtype):
    silu_mul = K.silu_mul
    g = torch.Generator().manual_seed(1)
    gate = (torch.randn(4, 1500, generator=g) * 4).to(dtype)     # 1500: a partial second block
    up = torch.randn(4, 1500, generator=g).to(dtype)
    ref = F.silu(gate) * up
    out = silu_mul(gate, up)
    # exp in another implementation, and (under the interpreter) numpy's fp16 casts: a rare element
    # lands two rounding steps away (1 of 6,000 here); bf16 rounding is done by hand and stays at 1
    assert _ulps(out, ref) <= (1 if dtype == torch.bfloat16 else 2)
    assert (out != ref).float().mean() < 0.005


def _torch_qk_norm_rope(q, k, qw, kw, cos, sin, eps):
    """The engine's torch code: per-head RMSNorm, transpose, x·cos + rotate_half(x)·sin."""
    def rot(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)
    if qw is not None:
        q, k = _torch_rms_norm(q, qw, eps), _torch_rms_norm(k, kw, eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * c + rot(q) * s).transpose(1, 2), (k * c + rot(k) * s).transpose(1, 2)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("t", [1, 3])
def test_qk_norm_rope_matches_torch(K, norm, t):
    g = torch.Generator().manual_seed(t)
    b, hq, hkv, d = 2, 4, 2, 64
    fused = torch.randn(b, t, (hq + 2 * hkv) * d, generator=g).to(torch.bfloat16)   # q|k|v rows, like qkv_proj
    q = fused[..., : hq * d].reshape(b, t, hq, d)
    k = fused[..., hq * d:(hq + hkv) * d].reshape(b, t, hkv, d)
    qw = (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16) if norm else None
    kw = (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16) if norm else None
    ang = torch.randn(b, t, d // 2, generator=g) * 3
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(torch.bfloat16)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(torch.bfloat16)
    rq, rk = _torch_qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6)
    oq, ok = K.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6)
    for o, r in ((oq, rq), (ok, rk)):
        assert o.shape == r.shape
        if norm:       # the per-head mean may round differently (see rms_norm)
            assert _ulps(o, r.contiguous()) <= 2 and (o != r).float().mean() < 0.03
        else:          # RoPE alone: the same roundings, bit for bit
            assert torch.equal(o, r)


@pytest.mark.parametrize("hq,hkv,hb", [(4, 2, 2), (6, 2, 4), (3, 3, 8)])
def test_rope_over_head_tiles_is_torch_bit_for_bit(K, hq, hkv, hb):
    """`rope` (several heads per program, partial head tiles masked) = torch's RoPE to the bit,
    on strided q/k views of a fused projection and a non-power-of-two head dim."""
    g = torch.Generator().manual_seed(hq * 10 + hb)
    b, t, d = 2, 3, 48
    fused = torch.randn(b, t, (hq + hkv) * d, generator=g).to(torch.bfloat16)
    q = fused[..., : hq * d].reshape(b, t, hq, d)
    k = fused[..., hq * d:].reshape(b, t, hkv, d)
    ang = torch.randn(b, t, d // 2, generator=g) * 3
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(torch.bfloat16)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(torch.bfloat16)
    rq, rk = _torch_qk_norm_rope(q, k, None, None, cos, sin, 0.0)
    oq, ok = K.rope(q, k, cos, sin, heads_per_program=hb)
    assert oq.is_contiguous() and ok.is_contiguous()
    assert torch.equal(oq, rq) and torch.equal(ok, rk)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_kernels_on_cuda_match_torch():
    from agentq.kernels import triton_norm

    _interp.restore_compiled(MODULES)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 4096, generator=g, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(4096, generator=g, device="cuda")).bfloat16()
    assert _ulps(triton_norm.rms_norm(x, w, 1e-6).cpu(), _torch_rms_norm(x, w, 1e-6).cpu()) <= 1
    gate, up = (torch.randn(64, 12288, generator=g, device="cuda") * 4).bfloat16(), x.repeat(1, 3)
    assert _ulps(triton_norm.silu_mul(gate, up).cpu(), (F.silu(gate) * up).cpu()) <= 1
    qkv = torch.randn(64, 1, 48 * 128, generator=g, device="cuda").bfloat16()
    q, k = qkv[..., :32 * 128].reshape(64, 1, 32, 128), qkv[..., 32 * 128:40 * 128].reshape(64, 1, 8, 128)
    ang = torch.randn(64, 1, 64, generator=g, device="cuda") * 3
    cos, sin = torch.cat([ang.cos()] * 2, -1).bfloat16(), torch.cat([ang.sin()] * 2, -1).bfloat16()
    nw = (1 + 0.1 * torch.randn(128, generator=g, device="cuda")).bfloat16()
    oq, ok = triton_norm.qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6)
    rq, rk = _torch_qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6)
    # the per-head mean may round differently, and x·cos + rot(x)·sin can cancel: compare in
    # absolute terms against the operands' scale (bf16 steps are 2⁻⁸ relative)
    for o, r in ((oq, rq), (ok, rk)):
        assert (o.float() - r.float()).abs().max() < 2 * 2 ** -8 * 4 and (o != r).float().mean() < 0.05
    x = torch.randn(2, 1000, 40 * 128, generator=g, device="cuda").bfloat16()   # 2 × 1000 tokens, 32 + 8 heads
    q, k = x[..., :32 * 128].reshape(2, 1000, 32, 128), x[..., 32 * 128:].reshape(2, 1000, 8, 128)
    ang = torch.randn(2, 1000, 64, generator=g, device="cuda") * 3
    cos, sin = torch.cat([ang.cos()] * 2, -1).bfloat16(), torch.cat([ang.sin()] * 2, -1).bfloat16()
    rq, rk = _torch_qk_norm_rope(q, k, None, None, cos, sin, 0.0)
    oq, ok = triton_norm.rope(q, k, cos, sin)
    assert torch.equal(oq, rq) and torch.equal(ok, rk)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,n", [(8192, 2048), (8192 * 16, 128)])
def test_compiled_learner_norm_at_1b_shapes(rows, n):
    """The learner's norms at 1B shapes (hidden 2048; Qwen3's q/k norms over 16 heads): the
    multi-row forward is the one-row kernel and the fused pre-norm bit for bit; the backward is the
    torch formula within one bf16 rounding, and the same bits on a second run (no atomics)."""
    from agentq.kernels import triton_norm
    from agentq.kernels.learner_ops import rms_norm_backward as torch_formula

    _interp.restore_compiled(MODULES)
    g = torch.Generator(device="cuda").manual_seed(n)
    x = (torch.randn(rows, n, generator=g, device="cuda") * 3).bfloat16()
    w = (1 + 0.2 * torch.randn(n, generator=g, device="cuda")).bfloat16()
    gy = torch.randn(rows, n, generator=g, device="cuda").bfloat16()
    y = triton_norm.rms_norm(x, w, 1e-6)
    assert torch.equal(y, triton_norm.rms_norm(x, w, 1e-6, multi_row=False))
    assert torch.equal(y, triton_norm.rms_norm_and_codes(x, w, 1e-6, 1e-8, "half_even")[0])
    dx, dw = triton_norm.rms_norm_backward(x, w, 1e-6, gy)
    rx, rw = torch_formula(x, w, 1e-6, gy)
    _assert_within_one_rounding(dx, rx, 2.0 ** -8)
    _assert_within_one_rounding(dw, rw, 2.0 ** -8)
    dx2, dw2 = triton_norm.rms_norm_backward(x, w, 1e-6, gy)
    assert torch.equal(dx, dx2) and torch.equal(dw, dw2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_silu_mul_backward_at_1b_shapes():
    """The one-launch SiLU·mul backward over a grouped gate_up output at 1B shapes (8,192 tokens,
    2 × 6,144 columns) against torch autograd's ops: each gradient within one bf16 step, the
    fraction of elements that differ printed (the exponential and FMA contraction may differ)."""
    from agentq.kernels import triton_norm

    _interp.restore_compiled(MODULES)
    g = torch.Generator(device="cuda").manual_seed(7)
    n = 6144
    gu = (torch.randn(8192, 2 * n, generator=g, device="cuda") * 4).bfloat16()
    gy = torch.randn(8192, n, generator=g, device="cuda").bfloat16()
    out = torch.empty_like(gu)
    dg, du = triton_norm.silu_mul_backward(gy, gu[:, :n], gu[:, n:], (out[:, :n], out[:, n:]))
    gh, uh = gu[:, :n].clone().requires_grad_(), gu[:, n:].clone().requires_grad_()
    (F.silu(gh) * uh).backward(gy)
    for got, ref in ((dg, gh.grad), (du, uh.grad)):
        _assert_within_one_rounding(got, ref, 2.0 ** -8)
    print(f"silu_mul_backward vs torch autograd: d gate {float((dg != gh.grad).float().mean()):.2e}, "
          f"d up {float((du != uh.grad).float().mean()):.2e} of elements differ (≤ one bf16 step)")
    assert torch.equal(out[:, :n], dg) and torch.equal(out[:, n:], du)


# ---------------------------------------------------------------- fused pre-norm / quant / KV-write kernels
def _rows_codes(K, h, floor=1e-8, rounding="half_even"):
    """The two-launch path the fused kernels replace: codes + scales of already-computed rows."""
    return K.quantize_rows(h, floor, rounding)


@pytest.mark.parametrize("quant", [None, (1e-8, "half_even"), (1e-5, "half_away")])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_equals_add_then_norm_then_quant(K, quant, with_delta):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(2, 3, 320, generator=g) * 2).bfloat16()        # 320: a masked tail of the block
    d = torch.randn(2, 3, 320, generator=g).bfloat16() if with_delta else None
    w = (1 + 0.1 * torch.randn(320, generator=g)).bfloat16()
    s, h = K.add_rms_norm(x, d, w, 1e-6, quant)
    ref_s = x + d if with_delta else x                               # torch's bf16 add: one rounding
    assert torch.equal(s, ref_s)
    ref_h = K.rms_norm(ref_s, w, 1e-6)
    if quant is None:
        assert torch.equal(h, ref_h)
    else:
        codes, scales = h
        ref_c, ref_sc = K.quantize_rows(ref_h, *quant)
        assert codes.shape == (2, 3, 320) and scales.shape == (2, 3)
        assert torch.equal(codes, ref_c) and torch.equal(scales, ref_sc)
        assert int(codes.abs().max()) == 127                         # each row's absmax maps to ±127


def test_silu_mul_quant_equals_silu_mul_then_quant(K, monkeypatch):
    g = torch.Generator().manual_seed(3)
    gate = (torch.randn(3, 700, generator=g) * 4).bfloat16()
    up = torch.randn(3, 700, generator=g).bfloat16()
    ref = K.quantize_rows(K.silu_mul(gate, up), 1e-8, "half_even")
    out = K.silu_mul_quant(gate, up, 1e-8, "half_even")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    monkeypatch.setattr(K, "SILU_QUANT_CHUNKED_ROWS", 2)              # many rows: chunks of 256, a masked tail
    monkeypatch.setattr(K, "SILU_QUANT_CHUNK", 256)
    out3 = K.silu_mul_quant(gate, up, 1e-8, "half_even")
    assert torch.equal(out3[0], ref[0]) and torch.equal(out3[1], ref[1])
    y, (codes, scales) = K.silu_mul_and_codes(gate, up, 1e-8, "half_even")
    assert torch.equal(y, K.silu_mul(gate, up)) and torch.equal(codes, ref[0]) and torch.equal(scales, ref[1])
    monkeypatch.setattr(K, "SILU_QUANT_MAX", 512)                    # rows too long: the two-kernel path
    out2 = K.silu_mul_quant(gate, up, 1e-8, "half_even")
    assert torch.equal(out2[0], ref[0]) and torch.equal(out2[1], ref[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm_and_silu_with_codes_store_both_outputs(K, dtype):
    """The learner's variants keep the product too: the normed rows / the SiLU·mul product equal
    `rms_norm` / `silu_mul`, and the codes equal `quantize_rows` of them, bit for bit."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(2, 3, 320, generator=g) * 2).to(dtype)
    w = (1 + 0.1 * torch.randn(320, generator=g)).to(dtype)
    y, (codes, scales) = K.rms_norm_and_codes(x, w, 1e-6, 1e-8, "half_away")
    assert torch.equal(y, K.rms_norm(x, w, 1e-6))
    ref_c, ref_s = K.quantize_rows(y, 1e-8, "half_away")
    assert torch.equal(codes, ref_c) and torch.equal(scales, ref_s) and scales.shape == (2, 3)
    gate, up = (torch.randn(3, 700, generator=g) * 4).to(dtype), torch.randn(3, 700, generator=g).to(dtype)
    p, (codes, scales) = K.silu_mul_and_codes(gate, up, 1e-8, "half_even")
    assert torch.equal(p, K.silu_mul(gate, up))
    ref_c, ref_s = K.quantize_rows(p, 1e-8, "half_even")
    assert torch.equal(codes, ref_c) and torch.equal(scales, ref_s)


@pytest.mark.parametrize("kv", ["int8", "bf16"])
def test_qk_norm_rope_to_cache_writes_what_the_three_launches_write(K, kv):
    g = torch.Generator().manual_seed(11)
    b, hq, hkv, d, S, L = 3, 4, 2, 64, 5, 9
    fused = torch.randn(b, 1, (hq + 2 * hkv) * d, generator=g).bfloat16()
    q = fused[..., : hq * d].reshape(b, 1, hq, d)
    k = fused[..., hq * d:(hq + hkv) * d].reshape(b, 1, hkv, d)
    v = fused[..., (hq + hkv) * d:].reshape(b, 1, hkv, d)
    nw = (1 + 0.1 * torch.randn(d, generator=g)).bfloat16()
    ang = torch.randn(b, 1, d // 2, generator=g) * 3
    cos, sin = torch.cat([ang.cos()] * 2, -1).bfloat16(), torch.cat([ang.sin()] * 2, -1).bfloat16()
    slots, pos = torch.tensor([4, 0, 2]), torch.tensor([0, 8, 3])
    dt = torch.int8 if kv == "int8" else torch.bfloat16
    caches = [torch.full((S, hkv, L, d), 7, dtype=dt) for _ in range(4)]     # 7: "not written"
    scales = [torch.full((S, hkv, L), 0.5) for _ in range(4)] if kv == "int8" else [None] * 4
    quant = (SPEC_KV.kv_scale_floor, SPEC_KV.kv_rounding) if kv == "int8" else None
    oq = K.qk_norm_rope_to_cache(q, k, v, nw, nw, cos, sin, 1e-6, caches[0], caches[1], scales[0], scales[1],
                                 slots, pos, quant)
    rq, rk = K.qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6)
    assert torch.equal(oq, rq)
    for x, c, sc in ((rk[:, 0], caches[2], scales[2]), (v[:, 0], caches[3], scales[3])):
        if kv == "int8":
            K.quantize_kv_to_cache(x, c, sc, slots, pos, SPEC_KV)
        else:
            c[slots, :, pos] = x
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    if kv == "int8":
        assert torch.equal(scales[0], scales[2]) and torch.equal(scales[1], scales[3])
        assert int((caches[0] != 7).sum()) > 0.9 * b * hkv * d            # the rows were written ...
        assert int((scales[0] != 0.5).sum()) == b * hkv                   # ... and nothing else


@pytest.mark.parametrize("kv, dtype, norm", [("int8", torch.bfloat16, True), ("int8", torch.float16, False),
                                             ("values", torch.bfloat16, True), ("values", torch.float16, False)])
def test_qk_norm_rope_to_cache_writes_the_valid_tokens_of_a_prefill_chunk(K, kv, dtype, norm):
    _check_prefill_chunk_write(K, K.quantize_kv_to_cache, kv, dtype, norm, d=16, device="cpu")


def _check_prefill_chunk_write(norm_mod, quantize_kv_to_cache, kv, dtype, norm, d, device):
    """A padded prefill chunk (T > 1, rows of 3, 1, 0 and 2 valid tokens, three of them a second
    turn's delta prefill starting past position 0) through `norm_mod.qk_norm_rope_to_cache`: the
    valid tokens' K/V land at their positions exactly as `qk_norm_rope` + `quantize_kv_to_cache`
    (or a copy) of those tokens store them; padding (whose position is 0, as the engine pads) and
    every other entry stay untouched; q is `qk_norm_rope`'s, padding tokens included."""
    g = torch.Generator().manual_seed(5)
    b, t, hq, hkv, S, L = 4, 3, 4, 2, 5, 8
    fused = torch.randn(b, t, (hq + 2 * hkv) * d, generator=g).to(device, dtype)
    q = fused[..., : hq * d].reshape(b, t, hq, d)
    k = fused[..., hq * d:(hq + hkv) * d].reshape(b, t, hkv, d)
    v = fused[..., (hq + hkv) * d:].reshape(b, t, hkv, d)
    nw = (1 + 0.1 * torch.randn(d, generator=g)).to(device, dtype) if norm else None
    ang = torch.randn(b, t, d // 2, generator=g) * 3
    cos, sin = (torch.cat([f(ang)] * 2, -1).to(device, dtype) for f in (torch.cos, torch.sin))
    slots = torch.tensor([3, 0, 4, 1], device=device)
    n_new = torch.tensor([3, 1, 0, 2], dtype=torch.int32, device=device)
    valid = torch.arange(t, device=device)[None, :] < n_new[:, None]
    start = torch.tensor([0, 5, 2, 4], device=device)[:, None]
    positions = torch.where(valid, start + torch.arange(t, device=device), 0)      # [B, T]
    dt = torch.int8 if kv == "int8" else dtype
    caches = [torch.full((S, hkv, L, d), 7, dtype=dt, device=device) for _ in range(4)]     # 7: "not written"
    scales = [torch.full((S, hkv, L), 0.5, device=device) for _ in range(4)] if kv == "int8" else [None] * 4
    quant = (SPEC_KV.kv_scale_floor, SPEC_KV.kv_rounding) if kv == "int8" else None
    oq = norm_mod.qk_norm_rope_to_cache(q, k, v, nw, nw, cos, sin, 1e-6, caches[0], caches[1], scales[0], scales[1],
                                        slots, positions, quant, n_new)
    rq, rk = norm_mod.qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6)
    assert torch.equal(oq, rq)
    sl, pos = slots[:, None].expand(b, t)[valid], positions[valid]
    for x, c, sc in ((rk[valid], caches[2], scales[2]), (v[valid], caches[3], scales[3])):
        if kv == "int8":
            quantize_kv_to_cache(x, c, sc, sl, pos, SPEC_KV)
        else:
            c[sl, :, pos] = x
    written = torch.zeros(S, 1, L, dtype=torch.bool, device=device)
    written[sl, 0, pos] = True                                           # 6 (slot, position) pairs
    for i in (0, 1):
        assert torch.equal(caches[i], caches[i + 2])
        assert torch.equal((caches[i] != 7).any(-1), written.expand(S, hkv, L))
        if kv == "int8":
            assert torch.equal(scales[i], scales[i + 2])
            assert torch.equal(scales[i] != 0.5, written.expand(S, hkv, L))


def test_rope_tokens_per_program_rule(K, monkeypatch):
    """The default above decode's rows, $AGENTQ_ROPE_TOKENS there, one token a program at decode
    rows always, and a clear error for a value the kernel cannot take."""
    monkeypatch.delenv(K.ROPE_TOKENS_ENV, raising=False)
    assert K.rope_tokens_per_program(32768) == K.ROPE_TOKENS_PER_PROGRAM
    monkeypatch.setenv(K.ROPE_TOKENS_ENV, "8")
    assert K.rope_tokens_per_program(32768) == K.rope_tokens_per_program(K.ROPE_DECODE_MAX_ROWS + 1) == 8
    assert K.rope_tokens_per_program(1) == K.rope_tokens_per_program(K.ROPE_DECODE_MAX_ROWS) == 1
    for bad in ("3", "0", "32", "four", "-2"):
        monkeypatch.setenv(K.ROPE_TOKENS_ENV, bad)
        with pytest.raises(ValueError, match="AGENTQ_ROPE_TOKENS"):
            K.rope_tokens_per_program(64)


def test_rope_heads_per_program_rule(K, monkeypatch):
    """`ROPE_DECODE_HEADS` per program for decode-sized launches, `ROPE_HEADS_PER_PROGRAM` above; the
    environment variable overrides both and must name a power of two up to 32."""
    monkeypatch.delenv(K.ROPE_HEADS_ENV, raising=False)
    assert K.rope_heads_per_program(1) == K.rope_heads_per_program(K.ROPE_DECODE_MAX_ROWS) == K.ROPE_DECODE_HEADS
    assert K.rope_heads_per_program(K.ROPE_DECODE_MAX_ROWS + 1) == K.ROPE_HEADS_PER_PROGRAM
    monkeypatch.setenv(K.ROPE_HEADS_ENV, "4")
    assert K.rope_heads_per_program(1) == K.rope_heads_per_program(32768) == 4
    for bad in ("3", "0", "64"):
        monkeypatch.setenv(K.ROPE_HEADS_ENV, bad)
        with pytest.raises(ValueError):
            K.rope_heads_per_program(1)


def _rope_heads_run(K, q, k, v, nw, cos, sin, kv, slots, positions, n_new):
    """(q, k) of `qk_norm_rope`, then q and the caches + scales `qk_norm_rope_to_cache` leaves in
    sentinel-filled caches (7 codes / values, 0.5 scales: "not written")."""
    S, L, hkv, d = 4, 8, k.shape[2], k.shape[3]
    dt = torch.int8 if kv == "int8" else q.dtype
    caches = [torch.full((S, hkv, L, d), 7, dtype=dt) for _ in range(2)]
    scales = [torch.full((S, hkv, L), 0.5) for _ in range(2)] if kv == "int8" else [None, None]
    quant = (SPEC_KV.kv_scale_floor, SPEC_KV.kv_rounding) if kv == "int8" else None
    rq, rk = K.qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6)
    oq = K.qk_norm_rope_to_cache(q, k, v, nw, nw, cos, sin, 1e-6, caches[0], caches[1], scales[0], scales[1],
                                 slots, positions, quant, n_new)
    return [rq, rk, oq, *caches, *(sc for sc in scales if sc is not None)]


@pytest.mark.parametrize("kv, dtype, norm", [("int8", torch.bfloat16, True), ("int8", torch.float32, True),
                                             ("values", torch.bfloat16, True), ("values", torch.float32, False)])
def test_qk_norm_rope_head_groups_store_the_same_bits(K, monkeypatch, kv, dtype, norm):
    """`_qk_norm_rope_kernel` over groups of 1, 2 and 8 heads per program (`AGENTQ_ROPE_HEADS`)
    and 1, 2, 8 and 16 tokens per program (`AGENTQ_ROPE_TOKENS`; 12 tokens in rows of 3, so a
    program's tokens span rows and the last program's run past the end): 6 q and 2 k/v heads, so
    the last q group and every k/v group of 8 are partly masked; a ragged prefill chunk (rows of 3,
    1, 0 and 2 valid tokens of 3). q, k, the caches and the scales are the same bits for every
    launch, and padding tokens leave the sentinels untouched."""
    g = torch.Generator().manual_seed(17)
    b, t, hq, hkv, d = 4, 3, 6, 2, 32
    fused = torch.randn(b, t, (hq + 2 * hkv) * d, generator=g).to(dtype)
    q = fused[..., : hq * d].reshape(b, t, hq, d)
    k = fused[..., hq * d:(hq + hkv) * d].reshape(b, t, hkv, d)
    v = fused[..., (hq + hkv) * d:].reshape(b, t, hkv, d)
    nw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype) if norm else None
    ang = torch.randn(b, t, d // 2, generator=g) * 3
    cos, sin = (torch.cat([f(ang)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))
    slots = torch.tensor([3, 0, 2, 1])
    n_new = torch.tensor([3, 1, 0, 2], dtype=torch.int32)
    valid = torch.arange(t)[None, :] < n_new[:, None]
    positions = torch.where(valid, torch.tensor([0, 5, 2, 4])[:, None] + torch.arange(t), 0)
    assert K._heads_fit(q, k, d)                                   # so the groups below are launched
    monkeypatch.setattr(K, "ROPE_DECODE_MAX_ROWS", 0)              # tokens per program at these 12 rows too
    outs = {}
    for heads, tokens in ((1, 1), (2, 1), (8, 1), (1, 2), (8, 8), (2, 16)):
        monkeypatch.setenv(K.ROPE_HEADS_ENV, str(heads))
        monkeypatch.setenv(K.ROPE_TOKENS_ENV, str(tokens))
        outs[heads, tokens] = _rope_heads_run(K, q, k, v, nw, cos, sin, kv, slots, positions, n_new)
    for key in list(outs)[1:]:
        assert all(torch.equal(x, y) for x, y in zip(outs[1, 1], outs[key])), key
    written = torch.zeros(4, 1, 8, dtype=torch.bool)
    written[slots[:, None].expand(b, t)[valid], 0, positions[valid]] = True      # 6 (slot, position) pairs
    for cache in outs[8, 1][3:5]:
        assert torch.equal((cache != 7).any(-1), written.expand(4, hkv, 8))
    if kv == "int8":
        for sc in outs[8, 1][5:]:
            assert torch.equal(sc != 0.5, written.expand(4, hkv, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_compiled_qk_norm_rope_head_groups_store_the_same_bits(monkeypatch, dtype):
    """On the GPU: `qk_norm_rope` and `qk_norm_rope_to_cache` (int8 cache, ragged rows) at Qwen3-8B
    heads (32 q, 8 k/v, head dim 128) store the same bits for 1, 2, 4, 8 and 16 heads and 1, 2, 4, 8
    and 16 tokens per program (each head keeps the one-head program's layout, so the norm sums in
    the same order); 4 × 301 tokens, so the last program of 8 or 16 runs past the end."""
    from agentq.kernels import triton_norm

    _interp.restore_compiled(MODULES)
    g = torch.Generator(device="cuda").manual_seed(3)
    b, t, hq, hkv, d = 4, 301, 32, 8, 128
    fused = (torch.randn(b, t, (hq + 2 * hkv) * d, generator=g, device="cuda") * 2).to(dtype)
    q = fused[..., : hq * d].reshape(b, t, hq, d)
    k = fused[..., hq * d:(hq + hkv) * d].reshape(b, t, hkv, d)
    v = fused[..., (hq + hkv) * d:].reshape(b, t, hkv, d)
    nw = (1 + 0.1 * torch.randn(d, generator=g, device="cuda")).to(dtype)
    ang = torch.randn(b, t, d // 2, generator=g, device="cuda") * 3
    cos, sin = (torch.cat([f(ang)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))
    slots = torch.tensor([3, 0, 2, 1], device="cuda")
    n_new = torch.tensor([301, 17, 0, 256], dtype=torch.int32, device="cuda")
    positions = torch.arange(t, device="cuda").repeat(b, 1)
    kvq = (SPEC_KV.kv_scale_floor, SPEC_KV.kv_rounding)
    outs = []
    for heads, tokens in ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (1, 4), (8, 2), (8, 4), (8, 8), (4, 16)):
        monkeypatch.setenv(triton_norm.ROPE_HEADS_ENV, str(heads))
        monkeypatch.setenv(triton_norm.ROPE_TOKENS_ENV, str(tokens))
        caches = [torch.full((4, hkv, t, d), 7, dtype=torch.int8, device="cuda") for _ in range(2)]
        scl = [torch.full((4, hkv, t), 0.5, device="cuda") for _ in range(2)]
        oq = triton_norm.qk_norm_rope_to_cache(q, k, v, nw, nw, cos, sin, 1e-6, caches[0], caches[1], scl[0],
                                               scl[1], slots, positions, kvq, n_new)
        outs.append([*triton_norm.qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6), oq, *caches, *scl])
    for other in outs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(outs[0], other))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv", ["int8", "values"])
def test_compiled_prefill_chunk_kv_write_equals_the_separate_kernels(kv):
    """`_check_prefill_chunk_write` with the compiled kernels (head_dim 128, bf16)."""
    from agentq.kernels import triton_norm, triton_quant

    _interp.restore_compiled(MODULES)
    _check_prefill_chunk_write(triton_norm, triton_quant.quantize_kv_to_cache, kv, torch.bfloat16, True, d=128,
                               device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_fused_prenorm_quant_and_kv_write_equal_the_separate_kernels():
    """On the GPU the fused launches store exactly what the separate compiled kernels store."""
    from agentq.kernels import triton_norm, triton_quant

    _interp.restore_compiled(MODULES)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(64, 4096, generator=g, device="cuda").bfloat16()
    d = torch.randn(64, 4096, generator=g, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(4096, generator=g, device="cuda")).bfloat16()
    q8 = (SPEC_KV.act_scale_floor, SPEC_KV.act_rounding)
    s, (codes, scales) = triton_norm.add_rms_norm(x, d, w, 1e-6, q8)
    assert torch.equal(s, x + d)
    ref_c, ref_s = triton_quant.quantize_rows(triton_norm.rms_norm(x + d, w, 1e-6), *q8)
    assert torch.equal(codes, ref_c) and torch.equal(scales, ref_s)
    gate, up = (torch.randn(64, 12288, generator=g, device="cuda") * 4).bfloat16(), x.repeat(1, 3)
    c2, s2 = triton_norm.silu_mul_quant(gate, up, *q8)
    r2 = triton_quant.quantize_rows(triton_norm.silu_mul(gate, up), *q8)
    assert torch.equal(c2, r2[0]) and torch.equal(s2, r2[1])
    gate, up = gate.repeat(8, 1), up.repeat(8, 1)                      # 512 rows: the chunked two-pass kernel
    y3, (c3, s3) = triton_norm.silu_mul_and_codes(gate, up, *q8)
    r3 = triton_quant.quantize_rows(triton_norm.silu_mul(gate, up), *q8)
    assert torch.equal(y3, triton_norm.silu_mul(gate, up)) and torch.equal(c3, r3[0]) and torch.equal(s3, r3[1])
    qkv = torch.randn(64, 1, 48 * 128, generator=g, device="cuda").bfloat16()
    q = qkv[..., :32 * 128].reshape(64, 1, 32, 128)
    k = qkv[..., 32 * 128:40 * 128].reshape(64, 1, 8, 128)
    v = qkv[..., 40 * 128:].reshape(64, 1, 8, 128)
    ang = torch.randn(64, 1, 64, generator=g, device="cuda") * 3
    cos, sin = torch.cat([ang.cos()] * 2, -1).bfloat16(), torch.cat([ang.sin()] * 2, -1).bfloat16()
    nw = (1 + 0.1 * torch.randn(128, generator=g, device="cuda")).bfloat16()
    slots = torch.randperm(80, device="cuda")[:64]
    pos = torch.randint(0, 300, (64,), device="cuda")
    kvq = (SPEC_KV.kv_scale_floor, SPEC_KV.kv_rounding)
    caches = [torch.zeros(80, 8, 300, 128, dtype=torch.int8, device="cuda") for _ in range(4)]
    scl = [torch.zeros(80, 8, 300, device="cuda") for _ in range(4)]
    oq = triton_norm.qk_norm_rope_to_cache(q, k, v, nw, nw, cos, sin, 1e-6, caches[0], caches[1], scl[0], scl[1],
                                           slots, pos, kvq)
    rq, rk = triton_norm.qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6)
    triton_quant.quantize_kv_to_cache(rk[:, 0], caches[2], scl[2], slots, pos, SPEC_KV)
    triton_quant.quantize_kv_to_cache(v[:, 0], caches[3], scl[3], slots, pos, SPEC_KV)
    assert torch.equal(oq, rq)
    assert all(torch.equal(caches[i], caches[i + 2]) and torch.equal(scl[i], scl[i + 2]) for i in (0, 1))
