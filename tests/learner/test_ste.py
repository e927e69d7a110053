"""The aligned linear's straight-through backward and its per-step weight cache.

* fp32: gradients are exactly the STE formula (dX = dY·W_fq, dW = dYᵀ·X_fq, db = Σ dY), the
  same bits as the fp32 backward before the bf16 variant existed;
* bf16: gradients match an fp32 computation of the same formula within bf16 GEMM accuracy
  (relative Frobenius error ≤ 1e-2, measured ≈ 3e-3);
* the cache quantizes a weight once per version and requantizes after an optimizer step;
* the Triton path (interpreted on CPU) gives the torch path's forward value bit for bit;
* the opt-in int8 dX (grad_input="int8"): its arithmetic bit for bit, its error within a derived
  bound and ≤ 2 % relative, grouped within rounding of the separate linears' sum, the transposed
  codes once per weight version; the option off is the backward above bit for bit.
"""
import pytest
import torch

from agentq.kernels import quant, ste
from agentq.kernels.quant_spec import QuantSpec

SPEC = QuantSpec.preset("w8a8_kv8")


def _inputs(dtype, m=6, k=2048, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(n, k, generator=g) * 0.02).to(dtype).requires_grad_()
    b = torch.randn(n, generator=g).to(dtype).requires_grad_()
    gy = torch.randn(m, n, generator=g).to(dtype)
    return x, w, b, gy


def _fp32_reference(x, w, gy):
    """The STE formula in fp32 from the same int8 codes."""
    w_q, s_w = quant.quantize_weight(w.detach(), SPEC)
    x_q, s_x = quant.quantize_act(x.detach(), SPEC)
    g = gy.float()
    return g @ quant.dequantize_rows(w_q, s_w), g.t() @ quant.dequantize_rows(x_q, s_x), g.sum(0)


def test_fp32_gradients_are_the_ste_formula_exactly():
    x, w, b, gy = _inputs(torch.float32)
    y = ste.w8a8_linear_ste(x, w, b, SPEC)
    w_q, s_w = quant.quantize_weight(w.detach(), SPEC)
    assert torch.equal(y.detach(), quant.w8a8_linear(x.detach(), w_q, s_w, b.detach(), SPEC))
    y.backward(gy)
    gx, gw, gb = _fp32_reference(x, w, gy)
    assert torch.equal(x.grad, gx) and torch.equal(w.grad, gw) and torch.equal(b.grad, gb)


def test_bf16_gradients_match_fp32_reference_within_tolerance():
    x, w, b, gy = _inputs(torch.bfloat16, m=64, k=512, n=96)
    y = ste.w8a8_linear_ste(x, w, b, SPEC)
    assert y.dtype == torch.bfloat16
    y.backward(gy)
    gx, gw, gb = _fp32_reference(x, w, gy)
    for got, ref in ((x.grad, gx), (w.grad, gw), (b.grad, gb)):
        assert got.dtype == torch.bfloat16
        rel = float((got.float() - ref).norm() / ref.norm())
        assert rel <= 1e-2, rel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_grad_forward_skips_the_autograd_function(monkeypatch, dtype):
    """π_old / π_ref run under no_grad: the aligned linear and the KV round trip then compute
    their forward without an autograd Function (host time), with the same bits and the same
    weight-cache use."""
    x, w, b, _ = _inputs(dtype)
    kv = torch.randn(2, 3, 5, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    cache = ste.WeightCache()
    y_graph = ste.w8a8_linear_ste(x, w, b, SPEC, cache)
    kv_graph = ste.kv_fake_quant(kv.requires_grad_(), SPEC)

    def refuse(*a):
        raise AssertionError("an autograd Function was applied under no_grad")
    monkeypatch.setattr(ste._W8A8STE, "apply", refuse)
    monkeypatch.setattr(ste._KVSTE, "apply", refuse)
    with torch.no_grad():
        y = ste.w8a8_linear_ste(x, w, b, SPEC, cache)
        kv_direct = ste.kv_fake_quant(kv, SPEC)
    assert torch.equal(y, y_graph.detach()) and y.dtype == dtype
    assert torch.equal(kv_direct, kv_graph.detach())
    assert cache.recomputes == 1                     # the no-grad call reused the codes
    with pytest.raises(AssertionError, match="no_grad"):
        ste.w8a8_linear_ste(x, w, b, SPEC, cache)     # grad mode with grad-requiring inputs: the Function


def test_weight_cache_quantizes_once_per_optimizer_step():
    x, w, b, gy = _inputs(torch.float32, k=64)
    cache = ste.WeightCache()
    opt = torch.optim.AdamW([w, b], lr=1e-2)
    for _ in range(3):                    # π_old, π_ref-like passes and micro-batches: one quantization
        ste.w8a8_linear_ste(x, w, b, SPEC, cache).backward(gy)
    assert cache.recomputes == 1
    old_codes = cache.w_q.clone()
    opt.step()                            # in place: bumps the weight's version counter
    w_q, s_w = cache.get(w, SPEC)
    assert cache.recomputes == 2
    ref_q, ref_s = quant.quantize_weight(w.detach(), SPEC)
    assert torch.equal(w_q, ref_q) and torch.equal(s_w, ref_s) and not torch.equal(w_q, old_codes)
    with torch.no_grad():
        w.mul_(0.5)                       # any in-place write invalidates too
    assert torch.equal(cache.get(w, SPEC)[0], quant.quantize_weight(w.detach(), SPEC)[0])


def test_learner_model_cache_feeds_the_engine_sync(tiny_model_dir):
    """`qat.quantized_weights` (the learner's cached codes) == what the engine's sync stores."""
    from agentq.learner.learner import Learner
    from agentq.learner.qat import quantized_weights
    from agentq.rollout.torch_engine.engine import TorchEngine

    learner = Learner(str(tiny_model_dir), SPEC, use_reference=False)
    eng = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=1, max_len=16)
    eng.update_weights(learner.named_weights(), version=1)
    cached = quantized_weights(learner.model)
    assert len(cached) == 14
    layer = eng.model.layers[1]
    for fused, part in ((layer.qkv_proj, "v_proj"), (layer.gate_up_proj, "gate_proj"), (layer.down_proj, "down_proj")):
        a, b_ = fused.offsets[part]
        group = "self_attn" if part.endswith("v_proj") else "mlp"
        w_q, s_w = cached[f"model.layers.1.{group}.{part}.weight"]
        assert torch.equal(fused.w_q[a:b_], w_q) and torch.equal(fused.s_w[a:b_], s_w)


@pytest.fixture
def interpreted():
    """Interpreted kernels for one test (function scope: a CUDA test after it must get compiled ones)."""
    from agentq.kernels import _interp
    if not _interp.HAVE_TRITON:
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the compiled kernels (test_cuda_*); triton 3.6's interpreter there "
                    "cannot run the GEMM's runtime-bounded K loop")
    yield _interp.load_interpreted()
    _interp.restore_compiled()


@pytest.mark.parametrize("grad_input", ste.GRAD_INPUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_path_equals_torch_path_bit_for_bit(interpreted, dtype, grad_input):
    """The GPU path (Triton quant + int8 GEMM, here under TRITON_INTERPRET=1) computes the same
    forward bits, and the same gradients, as the torch reference path (with the int8 dX: the fused
    dY·s_w quantization and the int8 GEMM over the transposed codes)."""
    x, w, b, gy = _inputs(dtype, m=5, k=96, n=40)
    out = {}
    for backend in ("torch", "triton"):
        xb, wb, bb = (t.detach().clone().requires_grad_() for t in (x, w, b))
        y = ste.w8a8_linear_ste(xb, wb, bb, SPEC, ste.WeightCache(), backend=backend, grad_input=grad_input)
        y.backward(gy)
        kv = ste.kv_roundtrip(x.detach().reshape(5, 4, 24), SPEC, backend=backend)
        out[backend] = (y.detach(), xb.grad, wb.grad, bb.grad, kv)
    for a, b_ in zip(out["torch"], out["triton"]):
        assert torch.equal(a, b_)


def test_triton_path_without_tiled_launches_is_the_same(interpreted, monkeypatch):
    """AGENTQ_QUANT_TILES=0 (the way around a failing tiled launch) keeps the K/V round trip and
    the backward's X_fq on the row kernel and torch's dequantization: the same bits."""
    x, w, b, gy = _inputs(torch.bfloat16, m=5, k=96, n=40)
    kv = x.detach().reshape(5, 4, 24)
    tiled = ste.kv_roundtrip(kv, SPEC, backend="triton")
    monkeypatch.setenv("AGENTQ_QUANT_TILES", "0")
    assert torch.equal(ste.kv_roundtrip(kv, SPEC, backend="triton"), tiled)
    assert torch.equal(tiled, ste.kv_roundtrip(kv, SPEC, backend="torch"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200)")
def test_cuda_fast_path_equals_torch_path_and_bf16_gradients_are_close():
    """On CUDA: the Triton forward (quant + int8 GEMM) == the torch path bit for bit at a 1B-model
    shape, and the bf16 backward is within 1e-2 (relative) of the fp32 STE formula."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 2048, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(6144, 2048, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
    gy = torch.randn(4096, 6144, device="cuda", generator=g).bfloat16()
    y_fast = ste.w8a8_linear_ste(x, w, None, SPEC)
    y_ref = ste.w8a8_linear_ste(x.detach(), w.detach(), None, SPEC, backend="torch")
    assert torch.equal(y_fast.detach(), y_ref)
    y_fast.backward(gy)
    gx, gw, _ = _fp32_reference(x, w, gy)
    for got, ref in ((x.grad, gx), (w.grad, gw)):
        rel = float((got.float() - ref).norm() / ref.norm())
        print(f"bf16 STE grad rel err {rel:.2e}")
        assert rel <= 1e-2
    kv = torch.randn(2, 8, 512, 128, device="cuda", generator=g).bfloat16()
    assert torch.equal(ste.kv_roundtrip(kv, SPEC), ste.kv_roundtrip(kv, SPEC, backend="torch"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200)")
def test_cuda_int8_grad_input_equals_torch_path_and_is_within_the_bound():
    """On CUDA at a 1B shape (gate/up stacked: N = 12288, K = 2048, 4096 tokens): the int8 dX of the
    Triton path (fused dY·s_w quantization, int8 GEMM) == the torch path's bit for bit, and within
    2 % (relative) of the fp32 STE formula; dW is the bf16 option's."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 2048, device="cuda", generator=g).bfloat16()
    w = (torch.randn(12288, 2048, device="cuda", generator=g) * 0.02).bfloat16()
    gy = (torch.randn(4096, 12288, device="cuda", generator=g) * 1e-6).bfloat16()
    grads = {}
    for backend, grad_input in ((None, "int8"), ("torch", "int8"), (None, "bf16")):
        xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
        ste.w8a8_linear_ste(xb, wb, None, SPEC, backend=backend, grad_input=grad_input).backward(gy)
        grads[backend, grad_input] = (xb.grad, wb.grad)
    fast, ref = grads[None, "int8"], grads["torch", "int8"]
    assert torch.equal(fast[0], ref[0])
    assert torch.equal(fast[1], grads[None, "bf16"][1])
    w_q, s_w = quant.quantize_weight(w, SPEC)
    exact = gy.float() @ quant.dequantize_rows(w_q, s_w)
    rel, rel_bf16 = (float((gx.float() - exact).norm() / exact.norm()) for gx in (fast[0], grads[None, "bf16"][0]))
    print(f"int8 dX rel err {rel:.2e} (bf16 dX {rel_bf16:.2e})")
    assert rel <= 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_rows_is_the_fp32_product_rounded_once(dtype):
    codes = torch.randint(-128, 128, (33, 70), dtype=torch.int8)
    scale = torch.rand(33) * 0.03
    assert torch.equal(quant.dequantize_rows(codes, scale, dtype), (codes.float() * scale[:, None]).to(dtype))


def test_activation_checkpointing_gives_the_same_update(tiny_model_dir):
    """Recomputing decoder layers in backward changes memory, not the gradients (fp32, CPU)."""
    from agentq.algos import make_objective
    from agentq.eval.bench_learner import synthetic_batch
    from agentq.learner.learner import Learner
    from transformers import AutoConfig

    batch = synthetic_batch(3, 40, AutoConfig.from_pretrained(tiny_model_dir).vocab_size)
    grads = []
    for ckpt in (False, True):
        learner = Learner(str(tiny_model_dir), SPEC, use_reference=False, lr=1e-3, micro_batch_size=2,
                          activation_checkpointing=ckpt)
        batch.old_logp = learner.logprobs(batch)
        obj = make_objective("grpo", kl_coef=0.0)
        batch = batch.weighted(obj.prepare(batch))
        learner.update(batch, obj)          # the step's gradients stay in .grad after the step
        grads.append([p.grad.clone() for p in learner.model.parameters()])
    for a, b in zip(*grads):
        assert a.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------- int8 dX (grad_input="int8")
def _int8_dx_by_hand(gy, w_q, s_w):
    """The int8 dX's arithmetic written out on its own: G' = fp32(dY)·s_w, a per-row absmax scale
    (floored at GRAD_SCALE_FLOOR), codes by round-half-even (the activations' rounding), exact sums
    in fp64, one fp32 product per element. Returns (dX fp32, codes, row scales)."""
    gp = gy.float() * s_w
    amax = gp.abs().amax(1)
    s_g = torch.clamp(amax / torch.full_like(amax, 127.0), min=quant.GRAD_SCALE_FLOOR)
    codes = torch.round(gp / s_g[:, None]).clamp(-128, 127)
    return (codes.double() @ w_q.double()).float() * s_g[:, None], codes, s_g


def _int8_grads(x, w, b, gy, cache=None, **kw):
    xb, wb, bb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ste.w8a8_linear_ste(xb, wb, bb, SPEC, cache, grad_input="int8", **kw).backward(gy)
    return xb.grad, wb.grad, bb.grad


def _rel(got, ref):
    return float((got.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_grad_input_is_its_arithmetic_exactly(dtype):
    """dX is the quantized G' times the codes, bit for bit (n = 1100: the CPU GEMM's exact fp32 path
    sums the reduction in chunks of 1024); dW and db are the bf16 option's, untouched."""
    x, w, b, gy = _inputs(dtype, m=48, k=96, n=1100)
    gx, gw, gb = _int8_grads(x, w, b, gy)
    w_q, s_w = quant.quantize_weight(w.detach(), SPEC)
    assert gx.dtype == dtype and torch.equal(gx, _int8_dx_by_hand(gy, w_q, s_w)[0].to(dtype))
    xb, wb, bb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ste.w8a8_linear_ste(xb, wb, bb, SPEC).backward(gy)
    assert torch.equal(gw, wb.grad) and torch.equal(gb, bb.grad)


def test_int8_grad_input_error_is_bounded():
    """Against the exact dX = dY·W_fq (fp64). Each code of G' is off by at most s_g/2 (e, per row),
    so ‖dX_int8 − dX‖_F = ‖e·W_q‖_F ≤ ‖e‖_F·‖W_q‖₂ ≤ ½·sqrt(N·Σ s_g²)·‖W_q‖₂: asserted (plus fp32
    slack). Typically each rounding error is uniform in ±s_g/2 (rms s_g/√12) and a Gaussian-like row
    has absmax ≈ 3.5–4.5 σ at N = 10²–10⁴, so the relative error is ≈ 4/(127·√12) ≈ 0.9 %: asserted
    ≤ 2 % (measured 0.6–0.9 %). Rows far below the activations' 1e-8 scale floor (dY·s_w ~ 1e-17
    here, real ones ~1e-10–1e-6) lose nothing: dX scales with dY exactly."""
    for m, k, n in ((64, 512, 96), (128, 256, 2048)):
        x, w, b, gy = _inputs(torch.float32, m=m, k=k, n=n, seed=n)
        w_q, s_w = quant.quantize_weight(w.detach(), SPEC)
        exact = gy.double() @ quant.dequantize_rows(w_q, s_w).double()
        gx = _int8_grads(x, w, b, gy)[0]
        _, _, s_g = _int8_dx_by_hand(gy, w_q, s_w)
        bound = 0.5 * float((n * (s_g.double() ** 2).sum()).sqrt()) * float(torch.linalg.matrix_norm(w_q.double(), 2))
        assert float((gx.double() - exact).norm()) <= bound * (1 + 1e-5)
        assert _rel(gx, exact) <= 0.02, _rel(gx, exact)
        tiny = _int8_grads(x, w, b, gy * 2.0 ** -40)[0]          # powers of two: the same codes, exactly scaled
        assert torch.equal(tiny, gx * 2.0 ** -40)


def test_grouped_int8_dx_is_the_separate_linears_sum_within_rounding():
    """q/k/v as one call: per-token scales span the stacked row, so the codes differ from each linear's
    alone, and the two dX agree within their int8 roundings (each ≤ 2 % of the exact dX: ≤ 4 % apart,
    measured 0.5 %). The grouped dX is its own arithmetic over the stacked codes exactly."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 256, generator=g).requires_grad_()
    ws = [(torch.randn(n, 256, generator=g) * 0.02).requires_grad_() for n in (256, 64, 64)]
    gy = torch.randn(40, 384, generator=g) * torch.tensor([1.0] * 256 + [0.3] * 128)   # k/v gradients smaller
    ste.w8a8_linear_ste(x, tuple(ws), None, SPEC, grad_input="int8").backward(gy)
    grouped, x.grad = x.grad, None
    for w, part in zip(ws, gy.split([256, 64, 64], dim=1)):
        ste.w8a8_linear_ste(x, w, None, SPEC, grad_input="int8").backward(part)
    w_q, s_w = quant.quantize_weight(torch.cat([w.detach() for w in ws]), SPEC)
    exact = gy.double() @ quant.dequantize_rows(w_q, s_w).double()
    assert torch.equal(grouped, _int8_dx_by_hand(gy, w_q, s_w)[0])
    assert _rel(grouped, exact) <= 0.02 and _rel(x.grad, exact) <= 0.02
    assert 0 < _rel(grouped, x.grad) <= 0.04


def test_transposed_codes_are_built_once_per_weight_version():
    x, w, b, gy = _inputs(torch.float32, k=64)
    cache = ste.WeightCache()
    opt = torch.optim.AdamW([w, b], lr=1e-2)
    for _ in range(3):                      # micro-batches of one step: one transpose
        ste.w8a8_linear_ste(x, w, b, SPEC, cache, grad_input="int8").backward(gy)
    assert cache.transposes == 1 and cache._deq is None          # the int8 dX never needs W_fq
    first = cache.transposed()[0]
    assert torch.equal(first, cache.w_q.t()) and first.is_contiguous()
    opt.step()                              # in place: a new weight version
    ste.w8a8_linear_ste(x, w, b, SPEC, cache, grad_input="int8").backward(gy)
    assert cache.transposes == 2 and cache.recomputes == 2
    assert torch.equal(cache.transposed()[0], quant.quantize_weight(w.detach(), SPEC)[0].t())
    assert not torch.equal(cache.transposed()[0], first)
    cache.invalidate()
    assert cache._t is None
    bf16 = ste.WeightCache()
    ste.w8a8_linear_ste(x, w, b, SPEC, bf16).backward(gy)
    assert bf16.transposes == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_grad_input_is_todays_backward_bit_for_bit(dtype):
    """The option off (its default) runs the backward as before: dX = dY·W_fq in the compute dtype."""
    x, w, b, gy = _inputs(dtype, m=16, k=128, n=96)
    out = []
    for kw in ({}, {"grad_input": "bf16"}):
        xb, wb, bb = (t.detach().clone().requires_grad_() for t in (x, w, b))
        ste.w8a8_linear_ste(xb, wb, bb, SPEC, **kw).backward(gy)
        out.append((xb.grad, wb.grad, bb.grad))
    w_q, s_w = quant.quantize_weight(w.detach(), SPEC)
    cd = ste.grad_dtype(dtype)
    assert torch.equal(out[0][0], (gy.to(cd) @ quant.dequantize_rows(w_q, s_w, cd)).to(dtype))
    for a, b_ in zip(*out):
        assert torch.equal(a, b_)


def test_bad_grad_input_is_refused():
    x, w, b, _ = _inputs(torch.float32, k=64)
    with pytest.raises(ValueError, match=r"grad_input='fp8'; valid: \['bf16', 'int8'\]"):
        ste.w8a8_linear_ste(x, w, b, SPEC, grad_input="fp8")
