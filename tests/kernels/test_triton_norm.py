"""Fused RMSNorm and SiLU·mul (Triton, run under TRITON_INTERPRET=1 on CPU) against torch."""
import pytest
import torch
import torch.nn.functional as F

from agentq.kernels import _interp

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_norm")


@pytest.fixture(scope="module")
def K():
    """The norm kernels (re)imported under the interpreter, compiled ones put back afterwards."""
    _, norm = _interp.load_interpreted(MODULES)
    assert norm.INTERPRETED
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
