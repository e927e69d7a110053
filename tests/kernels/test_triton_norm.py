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
    test: a CUDA test in between restores the compiled kernels into the same module objects)."""
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
