"""QuantSpec numerics: worked numbers (docs/quantization.md), rounding-mode ties, and
bit-identical codes across the reference quantizers, the engine's layers and the learner's fake quant."""
from dataclasses import fields

import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.kernels import quant, ste
from agentq.kernels.quant_spec import DEFAULT_IGNORED, PRESETS

SPEC = QuantSpec.preset("w8a8_kv8")


def test_w8a8_worked_example():
    W = torch.tensor([[0.5, -1.0, 0.25], [0.02, 0.01, -0.03]])
    X = torch.tensor([[1.0, -2.0, 0.5], [0.1, 0.0, -0.3]])
    w_q, s_w = quant.quantize_weight(W, SPEC)
    x_q, s_x = quant.quantize_act(X, SPEC)
    # by hand: scale = row absmax / 127; codes = round_half_even(x / scale)
    # W row 0: s = 1/127, 0.5·127 = 63.5 → 64 (tie to even), 0.25·127 = 31.75 → 32
    # W row 1: s = 0.03/127, 0.02/s = 84.67 → 85, 0.01/s = 42.33 → 42
    # X row 0: s = 2/127, 1·63.5 → 64, 0.5·63.5 = 31.75 → 32; X row 1: s = 0.3/127, 0.1/s = 42.33 → 42
    assert w_q.tolist() == [[64, -127, 32], [85, 42, -127]]
    assert x_q.tolist() == [[64, -127, 32], [42, 0, -127]]
    s_w_hand, s_x_hand = [1.0 / 127, 0.03 / 127], [2.0 / 127, 0.3 / 127]
    assert s_w.tolist() == pytest.approx(s_w_hand, rel=1e-6) and s_x.tolist() == pytest.approx(s_x_hand, rel=1e-6)
    acc = quant.int8_matmul(x_q, w_q)
    # acc[m][n] = Σ_k x_q[m,k]·w_q[n,k], e.g. 64·64 + 127·127 + 32·32 = 21249
    acc_hand = [[64 * 64 + 127 * 127 + 32 * 32, 64 * 85 - 127 * 42 - 32 * 127],
                [42 * 64 + 0 * -127 + 127 * -32, 42 * 85 + 0 * 42 + 127 * 127]]
    assert acc.tolist() == acc_hand == [[21249, -3958], [-1376, 19699]]
    assert torch.equal(acc, quant.int8_matmul_ref(x_q, w_q))
    y = quant.w8a8_linear(X, w_q, s_w, None, SPEC)
    # y = acc · s_x[m] · s_w[n] (fp32 in the code; fp64 here): [[2.634881, −0.014724], [−0.025594, 0.010992]]
    y_hand = [[acc_hand[m][n] * s_x_hand[m] * s_w_hand[n] for n in range(2)] for m in range(2)]
    torch.testing.assert_close(y, torch.tensor(y_hand), atol=2e-6, rtol=0)


def test_kv_int8_worked_example():
    k = torch.tensor([0.3, -1.2, 0.05, 0.7])
    codes, scale = quant.quantize_kv(k, SPEC)
    # by hand: scale = 1.2 / 127 = 0.0094488; k / scale = 31.75, −127, 5.29, 74.08 → 32, −127, 5, 74
    assert codes.tolist() == [32, -127, 5, 74]
    assert float(scale) == pytest.approx(1.2 / 127, rel=1e-6)
    # the round trip is codes · scale: 0.302362, −1.2, 0.047244, 0.699213
    torch.testing.assert_close(quant.kv_roundtrip(k, SPEC), torch.tensor([c * 1.2 / 127 for c in (32, -127, 5, 74)]),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode,expected", [("half_even", [62, -62, 64, 0, -2, 2, 0]),
                                           ("half_away", [63, -63, 64, 0, -3, 2, 1])])
def test_rounding_modes_pin_ties(mode, expected):
    x = torch.tensor([62.5, -62.5, 63.5, 0.49999997, -2.5, 1.5, 0.5])
    assert quant.round_half(x, mode).tolist() == expected


def test_spec_rounding_applies_per_tensor_kind():
    # a row whose absmax is 127 → scale 1.0 exactly, so x/scale keeps the .5 ties
    row = torch.tensor([[127.0, 62.5, -62.5, 0.5]])
    assert quant.quantize_act(row, SPEC)[0].tolist() == [[127, 62, -62, 0]]       # half_even (vLLM acts)
    assert quant.quantize_kv(row, SPEC)[0].tolist() == [[127, 63, -63, 1]]        # half_away (vLLM int8 KV)


def test_zero_rows_hit_the_scale_floor():
    codes, scale = quant.quantize_act(torch.zeros(2, 8), SPEC)
    assert codes.abs().sum() == 0 and torch.all(scale == SPEC.act_scale_floor)
    codes, scale = quant.quantize_kv(torch.zeros(3, 4), SPEC)
    assert torch.all(scale == SPEC.kv_scale_floor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_dequantize_gives_the_one_kernel_formula_bits_and_keeps_fp32_codes(dtype):
    """On a CPU `dequantize_rows` computes (codes.float() · scale).to(dtype); it equals the
    mixed-type mul with an `out` of `dtype` (the CUDA formula) bit for bit, from int8 codes or the
    same codes held in fp32, and never writes into fp32 codes."""
    g = torch.Generator().manual_seed(6)
    codes = torch.randint(-128, 128, (3, 5, 64), dtype=torch.int8, generator=g)
    scale = torch.rand(3, 5, generator=g) * 0.1
    one_kernel = torch.mul(codes, scale.unsqueeze(-1), out=torch.empty(codes.shape, dtype=dtype))
    held = codes.float()
    for c in (codes, held):
        assert torch.equal(quant.dequantize_rows(c, scale, dtype), one_kernel)
    assert torch.equal(held, codes.float())


def test_ste_linear_value_equals_engine_path_and_gradients_flow():
    torch.manual_seed(0)
    x = torch.randn(5, 2048, requires_grad=True)     # K > 1040: a float matmul of dequantized values is not exact
    w = torch.randn(64, 2048, requires_grad=True)
    b = torch.randn(64, requires_grad=True)
    y = ste.w8a8_linear_ste(x, w, b, SPEC)
    w_q, s_w = quant.quantize_weight(w.detach(), SPEC)
    assert torch.equal(y.detach(), quant.w8a8_linear(x.detach(), w_q, s_w, b.detach(), SPEC))
    y.sum().backward()
    # straight-through: d/dW of Σ X_fq W_fqᵀ = Σ_rows X_fq
    x_q, s_x = quant.quantize_act(x.detach(), SPEC)
    torch.testing.assert_close(w.grad, quant.dequantize_rows(x_q, s_x).sum(0).expand_as(w), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad, quant.dequantize_rows(w_q, s_w).sum(0).expand_as(x), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.grad, torch.full((64,), 5.0))


def test_engine_and_learner_int8_weight_codes_are_identical(tiny_model_dir):
    """The engine's requantized buffers and the learner's fake quant give the same codes and scales."""
    from transformers import AutoModelForCausalLM

    from agentq.rollout.torch_engine.engine import TorchEngine

    eng = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=2, max_len=64)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for i, layer in enumerate(eng.model.layers):
        for fused, part, hf_lin in [(layer.qkv_proj, "k_proj", hf.model.layers[i].self_attn.k_proj),
                                    (layer.gate_up_proj, "up_proj", hf.model.layers[i].mlp.up_proj),
                                    (layer.down_proj, "down_proj", hf.model.layers[i].mlp.down_proj)]:
            a, b = fused.offsets[part]
            w_q, s_w = quant.quantize_weight(hf_lin.weight.detach(), SPEC)
            assert torch.equal(fused.w_q[a:b], w_q)
            assert torch.equal(fused.s_w[a:b], s_w)


def test_spec_audit_refuses_unknown_or_missing_linears():
    with pytest.raises(ValueError, match="does not say how to run"):
        SPEC.check_linears(["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.mystery_proj"])
    with pytest.raises(ValueError, match="no such linear layers"):
        SPEC.check_linears(["model.layers.0.self_attn.q_proj", "lm_head"])
    with pytest.raises(ValueError, match="unknown quantization preset"):
        QuantSpec.preset("w4a4")


@pytest.mark.parametrize("field", ["weight_scale_floor", "act_scale_floor", "kv_scale_floor"])
@pytest.mark.parametrize("floor", [0.0, -1e-6, -1, float("nan"), float("inf")])
def test_scale_floors_must_be_finite_and_positive(field, floor):
    # a floor of 0 gives an all-zero row the scale 0 and NaN codes (x / 0); weight_scale_floor went unchecked
    with pytest.raises(ValueError) as e:
        QuantSpec(**{field: floor})
    assert str(e.value) == f"QuantSpec.{field}={floor!r} must be a finite number > 0"


@pytest.mark.parametrize("quantized, ignored, inside, group", [
    (("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"), ("up_proj",), ["gate_proj"],
     ["gate_proj", "up_proj"]),
    (("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"), ("gate_proj",), ["up_proj"],
     ["gate_proj", "up_proj"]),
    (("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), ("k_proj", "v_proj"), ["q_proj"],
     ["q_proj", "k_proj", "v_proj"]),
    (("k_proj", "v_proj", "o_proj"), ("q_proj", "gate_proj", "up_proj", "down_proj"), ["k_proj", "v_proj"],
     ["q_proj", "k_proj", "v_proj"]),
])
def test_a_spec_splitting_a_fused_group_is_refused_when_made(quantized, ignored, inside, group):
    """The torch engine and vLLM run q/k/v and gate/up as one linear each; a spec quantizing part of a
    group was taken by QuantSpec and the learner, then refused by the engine when its layers were built."""
    with pytest.raises(ValueError) as e:
        QuantSpec(quantized_modules=quantized, ignored_modules=DEFAULT_IGNORED + ignored)
    assert str(e.value) == (f"QuantSpec quantizes {inside} but not all of {group}: the torch engine and vLLM run "
                            "these projections as one fused linear with one scheme; quantize all or none of them")


def test_whole_groups_and_unquantized_linears_pass_and_every_preset_is_made():
    attn_only = QuantSpec(quantized_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
                          ignored_modules=DEFAULT_IGNORED + ("gate_proj", "up_proj", "down_proj"))
    assert not attn_only.quantizes("gate_proj") and attn_only.quantizes("k_proj")
    # no linear quantized (kv8-like): the module lists decide nothing, as in the engine
    QuantSpec(weights="none", acts="none", quantized_modules=("q_proj",),
              ignored_modules=DEFAULT_IGNORED + ("k_proj", "v_proj"))
    for name, spec in PRESETS.items():
        assert QuantSpec(**{f.name: getattr(spec, f.name) for f in fields(spec)}) == spec, name


@pytest.mark.parametrize("spec, said", [
    (QuantSpec.preset("none"), "none: nothing quantized"),
    (QuantSpec.preset("kv8"), "kv8: int8 KV per token and head; q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
     "down_proj, embed_tokens, lm_head in the compute dtype"),
    (QuantSpec(kv="none", act_rounding="half_away", act_scale_floor=0.1, name="floors"),
     "floors: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj W8A8 (int8 weights per channel, int8 "
     "activations per token); KV in the compute dtype; embed_tokens, lm_head in the compute dtype; act_rounding "
     "half_away; act_scale_floor 0.1"),
    (QuantSpec.preset("w8a8_kv8_head"), "w8a8_kv8_head: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
     "down_proj, lm_head W8A8 (int8 weights per channel, int8 activations per token); int8 KV per token and "
     "head; embed_tokens in the compute dtype"),
    (QuantSpec(kv="fp8_e4m3_per_tensor", quantized_modules=("o_proj",), ignored_modules=("q_proj",)),
     "custom: o_proj W8A8 (int8 weights per channel, int8 activations per token); fp8 KV per tensor; q_proj in "
     "the compute dtype"),
])
def test_a_spec_says_what_it_quantizes_and_what_it_leaves(spec, said):
    assert spec.describe() == said
