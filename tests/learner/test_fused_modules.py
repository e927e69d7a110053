"""The aligned model's fused norms and SiLU MLPs (`learner.fused_modules`), run on CPU with the
Triton kernels under TRITON_INTERPRET=1 (on a GPU they run for bf16/fp16 models by themselves).

Asserted on the tiny Qwen3 in bf16: every RMSNorm and MLP is swapped and swapped back, and the
attention's RoPE is routed through the fused op; the fused launches hand q/k/v, gate/up and down
their activation codes (6 reuses per layer instead of 3),
which equal a fresh quantization; log-probs and gradients stay within bf16 rounding of HF's
eager modules; the fp32 / CPU model keeps HF's forward exactly."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentq.kernels import _interp
from agentq.kernels.quant_spec import QuantSpec

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
SPEC = QuantSpec.preset("w8a8_kv8")
MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_norm")


@pytest.fixture
def interpreted(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("the GPU machine runs the compiled kernels; its Triton interpreter cannot run these")
    _interp.load_interpreted(MODULES)
    from agentq.kernels import learner_ops
    yield learner_ops
    _interp.restore_compiled(MODULES)


def _model(path, dtype, spec=SPEC):
    from agentq.learner.qat import align_model
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    align_model(model, spec)
    return model


def _logp_and_grads(model, ids):
    from agentq.learner.learner import sequence_logprobs
    lp = sequence_logprobs(model, ids, None)
    lp[:, 1:].sum().backward()
    return lp.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_norms_and_mlps_are_swapped_and_restored(tiny_model_dir):
    from agentq.learner.fused_modules import FusedRMSNorm, FusedSiLUMLP
    from agentq.learner.qat import unalign_model
    model = _model(tiny_model_dir, torch.float32)
    layers = model.config.num_hidden_layers
    norms = [m for m in model.modules() if isinstance(m, FusedRMSNorm)]
    assert len(norms) == 4 * layers + 1                 # input, post-attention, q, k per layer + final
    assert sum(isinstance(m, FusedSiLUMLP) for m in model.modules()) == layers
    feeding = {n for n, m in model.named_modules() if isinstance(m, FusedRMSNorm) and m.agentq_codes}
    assert feeding == {f"model.layers.{i}.{k}" for i in range(layers) for k in ("input_layernorm",
                                                                               "post_attention_layernorm")}
    assert model.model.norm.agentq_codes is None        # the final norm feeds the (bf16) LM head
    unalign_model(model)
    assert not any(isinstance(m, (FusedRMSNorm, FusedSiLUMLP)) for m in model.modules())
    assert type(model.model.norm).__name__ == "Qwen3RMSNorm"


def test_an_unaligned_model_computes_the_hf_models_function(tiny_model_dir):
    """unalign_model restores the attention too (no K/V round trip): the HF model's logits, exactly."""
    from transformers import AutoModelForCausalLM

    from agentq.learner.qat import align_model, unalign_model
    ids = torch.randint(3, 120, (1, 24), generator=torch.Generator().manual_seed(0))
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    before = model.config._attn_implementation
    align_model(model, QuantSpec.preset("w8a8_kv8"))
    unalign_model(model)
    assert model.config._attn_implementation == before
    assert not any(hasattr(m, "agentq_spec") for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_rope_dispatcher_is_installed_once_and_falls_back_off_cuda(tiny_model_dir):
    """Aligning patches the modeling module's `apply_rotary_pos_emb` once (a second model finds it
    patched); off CUDA the dispatcher calls HF's own function: the same results, bit for bit."""
    from transformers.models.qwen3 import modeling_qwen3

    from agentq.learner.fused_modules import install_fused_rope
    _model(tiny_model_dir, torch.float32)
    patched = modeling_qwen3.apply_rotary_pos_emb
    assert patched.agentq_original is not None
    assert install_fused_rope(_model(tiny_model_dir, torch.float32)) == 0
    assert modeling_qwen3.apply_rotary_pos_emb is patched
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 64, generator=g), torch.randn(1, 2, 5, 64, generator=g)
    cos, sin = torch.rand(1, 5, 64, generator=g), torch.rand(1, 5, 64, generator=g)
    for a, b in zip(patched(q, k, cos, sin), patched.agentq_original(q, k, cos, sin)):
        assert torch.equal(a, b)


def test_unquantized_model_gets_fused_norms_without_codes(tiny_model_dir):
    from agentq.learner.fused_modules import FusedRMSNorm, FusedSiLUMLP
    model = _model(tiny_model_dir, torch.float32, QuantSpec.preset("none"))
    mods = [m for m in model.modules() if isinstance(m, (FusedRMSNorm, FusedSiLUMLP))]
    assert mods and all(m.agentq_codes is None for m in mods)


def test_fp32_on_cpu_keeps_hf_forward_bit_for_bit(tiny_model_dir):
    """Off CUDA / in fp32 the swapped modules run HF's own forward: the same log-probs as a model
    whose norms were never swapped."""
    from agentq.learner.fused_modules import remove_fused_elementwise
    from agentq.learner.learner import sequence_logprobs
    ids = torch.randint(3, 200, (2, 20), generator=torch.Generator().manual_seed(0))
    swapped, plain = _model(tiny_model_dir, torch.float32), _model(tiny_model_dir, torch.float32)
    remove_fused_elementwise(plain)
    with torch.no_grad():
        assert torch.equal(sequence_logprobs(swapped, ids, None), sequence_logprobs(plain, ids, None))


def test_fused_bf16_model_hands_codes_and_matches_hf(tiny_model_dir, interpreted, monkeypatch):
    learner_ops = interpreted
    monkeypatch.setenv("AGENTQ_GROUPED", "1")          # grouped q/k/v, gate/up: the CUDA default
    ids = torch.randint(3, 200, (2, 20), generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(learner_ops, "fused_applies", lambda x, weight=None: False)
    ref_model = _model(tiny_model_dir, torch.bfloat16)
    lp_ref, g_ref = _logp_and_grads(ref_model, ids)
    hits_ref = ref_model.agentq_act_cache.hits
    monkeypatch.setattr(learner_ops, "fused_applies",
                        lambda x, weight=None: x.dtype == torch.bfloat16 and (weight is None or weight.dtype == x.dtype))
    model = _model(tiny_model_dir, torch.bfloat16)
    cache = model.agentq_act_cache
    seen = []
    real_put = cache.put

    def put(x, codes, floor, rounding, backend=None):     # every handed-over code = a fresh quantization
        from agentq.kernels import quant
        ref = quant.quantize_rows(x.detach(), floor, rounding)
        seen.append(torch.equal(codes[0], ref[0]) and torch.equal(codes[1], ref[1]))
        real_put(x, codes, floor, rounding, backend)

    cache.put = put
    rope_calls, norm_backwards = [], []
    real_rope = learner_ops.rope
    monkeypatch.setattr(learner_ops, "rope", lambda *a: rope_calls.append(1) or real_rope(*a))
    from agentq.kernels import triton_norm
    real_bwd = triton_norm.rms_norm_backward
    monkeypatch.setattr(triton_norm, "rms_norm_backward", lambda *a: norm_backwards.append(1) or real_bwd(*a))
    lp, g = _logp_and_grads(model, ids)
    layers = model.config.num_hidden_layers
    assert len(rope_calls) == layers                                  # the attention's RoPE ran fused too
    assert len(norm_backwards) == 4 * layers + 1                      # every norm's backward ran in Triton
    # q/k/v and gate/up run grouped (one call each): unfused, each group quantizes its input once
    # (no reuse); fused, the groups and down take their codes from the launch before them
    assert hits_ref == 0 and cache.hits == 3 * layers
    assert len(seen) == 3 * layers and all(seen)
    # the norms agree with HF's to one bf16 step at most (0 here, measured); the backward is the
    # fp32 closed form (one Triton launch) instead of bf16 autograd (4.3e-3 relative here, measured)
    assert float((lp - lp_ref).abs().max()) < 2e-2
    for n in g_ref:
        rel = float((g[n] - g_ref[n]).norm() / g_ref[n].norm().clamp_min(1e-12))
        assert rel < 2e-2, (n, rel)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200)")
def test_cuda_fused_model_matches_hf_modules():
    """Compiled kernels at a 1B-model width: the fused aligned model vs the same model with HF's
    norm / MLP modules (log-probs, gradients), and the codes reuse."""
    from transformers import Qwen3Config

    from agentq.learner.fused_modules import remove_fused_elementwise
    from agentq.learner.qat import align_model
    cfg = Qwen3Config(hidden_size=2048, intermediate_size=6144, num_hidden_layers=2, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=4096, max_position_embeddings=1024)
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    fused, plain = base, AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda()
    plain.load_state_dict(base.state_dict())
    align_model(fused, SPEC)
    align_model(plain, SPEC)
    remove_fused_elementwise(plain)
    ids = torch.randint(0, 4096, (4, 512), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    (lp_f, g_f), (lp_p, g_p) = _logp_and_grads(fused, ids), _logp_and_grads(plain, ids)
    print(f"fused vs HF modules: max|dlogp| {float((lp_f - lp_p).abs().max()):.3e}")
    assert fused.agentq_act_cache.hits == 3 * cfg.num_hidden_layers      # qkv, gate_up (grouped) and down
    assert float((lp_f - lp_p).abs().max()) < 5e-2
    for n in g_p:
        assert float((g_f[n] - g_p[n]).norm() / g_p[n].norm().clamp_min(1e-12)) < 2e-2, n
    # RoPE (process-wide in both models above): HF's bits exactly, both directions, compiled
    from transformers.models.qwen3 import modeling_qwen3

    from agentq.kernels import learner_ops
    hf = modeling_qwen3.apply_rotary_pos_emb.agentq_original
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(4, 512, 16, 128, device="cuda", generator=g).bfloat16().transpose(1, 2).requires_grad_()
    k = torch.randn(4, 512, 8, 128, device="cuda", generator=g).bfloat16().transpose(1, 2).requires_grad_()
    ang = torch.rand(4, 512, 128, device="cuda", generator=g) * 100
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    assert learner_ops.rope_applies(q, k, cos, sin)
    out = learner_ops.rope(q, k, cos, sin)
    torch.autograd.backward(out, (gq, gk))
    q2, k2 = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    ref = hf(q2, k2, cos, sin)
    torch.autograd.backward(ref, (gq, gk))
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert torch.equal(q.grad, q2.grad) and torch.equal(k.grad, k2.grad)
