"""The learner's fused RMSNorm and SiLU·mul with autograd (`kernels.learner_ops`), Triton under
TRITON_INTERPRET=1 on CPU: forwards equal the engine's kernels, backwards equal independent
references (fp64 autograd of HF's formula; torch's own autograd ops for SiLU·mul, bit for bit)."""
import pytest
import torch
import torch.nn.functional as F

from agentq.kernels import _interp

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_norm")


@pytest.fixture
def K():
    """Interpreted norm kernels (per test; compiled ones put back afterwards) and the ops module."""
    if torch.cuda.is_available():
        pytest.skip("the GPU machine runs the compiled kernels (test_triton_norm's CUDA tests)")
    quant_mod, norm = _interp.load_interpreted(MODULES)
    from agentq.kernels import learner_ops
    yield norm, learner_ops
    _interp.restore_compiled(MODULES)


def _hf_rms_norm(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


@pytest.mark.parametrize("backward", ["triton", "torch"])
@pytest.mark.parametrize("quant", [None, (1e-8, "half_even")])
def test_rms_norm_forward_and_backward(K, monkeypatch, quant, backward):
    """backward="triton": the path CUDA bf16 takes (`triton_norm.rms_norm_backward`, interpreted
    here); "torch": the torch formula (CPU, AGENTQ_FUSED=0 between forward and backward)."""
    norm, ops = K
    calls = []
    real_bwd = norm.rms_norm_backward
    monkeypatch.setattr(norm, "rms_norm_backward", lambda *a: calls.append(1) or real_bwd(*a))
    monkeypatch.setattr(ops, "fused_applies", lambda x, weight=None: backward == "triton")
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 6, 96, generator=g) * 3).bfloat16().requires_grad_()
    w = (1 + 0.2 * torch.randn(96, generator=g)).bfloat16().requires_grad_()
    gy = torch.randn(2, 6, 96, generator=g).bfloat16()
    y, codes = ops.rms_norm(x, w, 1e-6, quant)
    assert torch.equal(y.detach(), norm.rms_norm(x.detach(), w.detach(), 1e-6))
    if quant is None:
        assert codes is None
    else:
        ref_c, ref_s = norm.quantize_rows(y.detach(), *quant)
        assert torch.equal(codes[0], ref_c) and torch.equal(codes[1], ref_s) and not codes[0].requires_grad
    y.backward(gy)
    assert len(calls) == (backward == "triton")
    # independent reference: fp64 autograd of the same formula (no intermediate roundings)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    h64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    (w64 * h64).backward(gy.double())
    for got, ref in ((x.grad, x64.grad), (w.grad, w64.grad)):
        rel = float((got.double() - ref).norm() / ref.norm())
        assert got.dtype == torch.bfloat16 and rel < 1e-2, rel
    # and HF's bf16 autograd, the path it replaces, agrees as closely
    xh, wh = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    _hf_rms_norm(xh, wh, 1e-6).backward(gy)
    assert float((x.grad.float() - xh.grad.float()).norm() / xh.grad.float().norm()) < 1e-2


def test_rms_norm_backward_formula_is_exact_in_fp64(K):
    """The closed-form backward itself (no bf16 roundings: fp64 in, fp64 out) equals autograd."""
    _, ops = K
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 40, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, generator=g, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(5, 40, generator=g, dtype=torch.float64)
    (w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))).backward(gy)
    gx, gw = ops.rms_norm_backward(x.detach(), w.detach(), 1e-5, gy)
    # the closed form runs in fp32 (float()) before rounding to the input dtype
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("quant", [None, (1e-8, "half_away")])
def test_silu_mul_forward_and_backward(K, quant):
    norm, ops = K
    g = torch.Generator().manual_seed(2)
    gate = (torch.randn(3, 300, generator=g) * 3).bfloat16().requires_grad_()
    up = torch.randn(3, 300, generator=g).bfloat16().requires_grad_()
    gy = torch.randn(3, 300, generator=g).bfloat16()
    y, codes = ops.silu_mul(gate, up, quant)
    assert torch.equal(y.detach(), norm.silu_mul(gate.detach(), up.detach()))
    if quant is not None:
        ref_c, ref_s = norm.quantize_rows(y.detach(), *quant)
        assert torch.equal(codes[0], ref_c) and torch.equal(codes[1], ref_s)
    y.backward(gy)
    gh, uh = gate.detach().clone().requires_grad_(), up.detach().clone().requires_grad_()
    (F.silu(gh) * uh).backward(gy)                 # torch's autograd: the same ops, the same bits
    assert torch.equal(gate.grad, gh.grad) and torch.equal(up.grad, uh.grad)


def _within_one_bf16_step(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Fraction of elements equal bit for bit; asserts the rest differ by at most one bf16 step."""
    step = ref.float().abs().clamp_min(1e-30) * 2.0 ** -7
    assert bool(((got.float() - ref.float()).abs() <= step).all())
    return float((got == ref).float().mean())


@pytest.mark.parametrize("stacked", [False, True])
def test_silu_mul_backward_launch_matches_torch_autograd(K, monkeypatch, stacked):
    """The one-launch backward (interpreted here) against torch's autograd of F.silu(g) * u in bf16:
    d up and d gate within one bf16 step (the exponential and the FMA contraction may differ in fp32's
    last bit; measured equal here for all but a few elements). Stacked: gate and up are the halves of
    one grouped gate_up output, whose gradient comes back as one tensor, the halves' gradients side
    by side, and the forward is the same bits as over the halves apart."""
    norm, ops = K
    monkeypatch.setattr(ops, "fused_applies", lambda x, weight=None: x.dtype == torch.bfloat16)
    calls = []
    real = norm.silu_mul_backward
    monkeypatch.setattr(norm, "silu_mul_backward", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(5)
    n = 1100                                   # > one 1024-column program per row
    gu = (torch.randn(2, 3, 2 * n, generator=g) * 4).bfloat16()
    gy = torch.randn(2, 3, n, generator=g).bfloat16()
    if stacked:
        x = gu.clone().requires_grad_()
        y, _ = ops.silu_mul_stacked(x, n, None)
        y.backward(gy)
        got_g, got_u = x.grad[..., :n], x.grad[..., n:]
    else:
        gate, up = gu[..., :n].clone().requires_grad_(), gu[..., n:].clone().requires_grad_()
        y, _ = ops.silu_mul(gate, up, None)
        y.backward(gy)
        got_g, got_u = gate.grad, up.grad
    assert torch.equal(y.detach(), norm.silu_mul(gu[..., :n], gu[..., n:])) and calls == [1]
    gh, uh = gu[..., :n].clone().requires_grad_(), gu[..., n:].clone().requires_grad_()
    (F.silu(gh) * uh).backward(gy)
    assert _within_one_bf16_step(got_u, uh.grad) > 0.99
    assert _within_one_bf16_step(got_g, gh.grad) > 0.99


def test_fused_applies_only_to_half_precision_cuda(K, monkeypatch):
    _, ops = K
    assert not ops.fused_applies(torch.zeros(2, 4, dtype=torch.bfloat16))          # CPU
    assert not ops.fused_applies(torch.zeros(2, 4))                                # fp32


def test_rope_forward_and_backward_are_hf_bit_for_bit(K):
    """`rope` on HF's layout (transposed [B, H, T, D] views, cos/sin [B, T, D]) gives exactly HF's
    `apply_rotary_pos_emb` and exactly torch autograd's gradients, in bf16."""
    from transformers.models.qwen3 import modeling_qwen3

    _, ops = K
    hf = getattr(modeling_qwen3.apply_rotary_pos_emb, "agentq_original", modeling_qwen3.apply_rotary_pos_emb)
    g = torch.Generator().manual_seed(3)
    B, T, Hq, Hkv, D = 2, 7, 4, 2, 64
    q = (torch.randn(B, T, Hq, D, generator=g) * 2).bfloat16().transpose(1, 2).requires_grad_()
    k = (torch.randn(B, T, Hkv, D, generator=g) * 2).bfloat16().transpose(1, 2).requires_grad_()
    ang = torch.arange(T)[None, :, None] * torch.logspace(0, -3, D // 2).repeat(2)[None, None, :] + torch.rand(B, 1, 1, generator=g)
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    gq, gk = torch.randn(q.shape, generator=g).bfloat16(), torch.randn(k.shape, generator=g).bfloat16()
    assert ops.rope_applies(q, k, cos, sin) is False                   # CPU: only when forced
    oq, ok = ops.rope(q, k, cos, sin)
    torch.autograd.backward((oq, ok), (gq, gk))
    q2, k2 = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    rq, rk = hf(q2, k2, cos, sin)
    torch.autograd.backward((rq, rk), (gq, gk))
    assert oq.shape == rq.shape and ok.shape == rk.shape
    assert torch.equal(oq, rq) and torch.equal(ok, rk)
    assert torch.equal(q.grad, q2.grad) and torch.equal(k.grad, k2.grad)


def test_no_grad_forwards_skip_the_autograd_functions(K, monkeypatch):
    """Under no_grad (π_old, π_ref) the fused ops run their forward directly: the same bits as the
    recorded path, and no autograd Function is applied (each `apply` would cost host time)."""
    norm, ops = K
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(5, 96, generator=g) * 3).bfloat16()
    w = (1 + 0.2 * torch.randn(96, generator=g)).bfloat16()
    gate, up = torch.randn(5, 300, generator=g).bfloat16(), torch.randn(5, 300, generator=g).bfloat16()
    q = torch.randn(1, 6, 4, 64, generator=g).bfloat16().transpose(1, 2)
    k = torch.randn(1, 6, 2, 64, generator=g).bfloat16().transpose(1, 2)
    cos, sin = torch.rand(1, 6, 64, generator=g).bfloat16(), torch.rand(1, 6, 64, generator=g).bfloat16()
    quant = (1e-8, "half_away")
    recorded = {name: fn() for name, fn in {
        "norm": lambda: ops.rms_norm(x.requires_grad_(), w, 1e-6, quant),
        "silu": lambda: ops.silu_mul(gate.requires_grad_(), up, quant),
        "rope": lambda: ops.rope(q.requires_grad_(), k, cos, sin)}.items()}
    for t in (x, gate, q):
        t.requires_grad_(False)

    def refuse(*a):
        raise AssertionError("an autograd Function was applied under no_grad")
    for fn in (ops._RMSNormFn, ops._SiLUMulFn, ops._RoPEFn):
        monkeypatch.setattr(fn, "apply", refuse)
    with torch.no_grad():
        direct = {"norm": ops.rms_norm(x, w, 1e-6, quant), "silu": ops.silu_mul(gate, up, quant),
                  "rope": ops.rope(q, k, cos, sin)}
    for name in ("norm", "silu"):
        (y0, (c0, s0)), (y1, (c1, s1)) = recorded[name], direct[name]
        assert torch.equal(y0.detach(), y1) and torch.equal(c0, c1) and torch.equal(s0, s1), name
    assert all(torch.equal(a.detach(), b) for a, b in zip(recorded["rope"], direct["rope"]))
