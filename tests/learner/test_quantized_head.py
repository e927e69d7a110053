"""Preset `w8a8_kv8_head`: the LM head is a W8A8 linear in the engine and in the aligned learner
alike (tied and untied heads), its logits are what per-channel int8 weights times per-token int8
activations give by hand, and a weight sync keeps the two sides equal."""
import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.learner.learner import Learner, sequence_logprobs
from agentq.rollout import SamplingParams, TurnRequest
from agentq.rollout.torch_engine.engine import TorchEngine

HEAD = QuantSpec.preset("w8a8_kv8_head")
CTXS = [[3 + (5 * j + 7 * i) % 300 for j in range(12 + 3 * i)] for i in range(3)]


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    """A random-init Qwen3 with its own LM head (the tiny model ties it to the embedding)."""
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("untied")
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def engine_vs_learner(eng: TorchEngine, learner: Learner) -> float:
    """max |Δ log-prob| over the engine's sampled tokens of CTXS, the learner scoring them."""
    sp = SamplingParams(max_new_tokens=16)
    out = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(CTXS)])
    gap = 0.0
    for i, (c, r) in enumerate(zip(CTXS, out)):
        eng.release(i)
        with torch.no_grad():
            lp = sequence_logprobs(learner.model, torch.tensor([c + r.token_ids]), None)[0, len(c):]
        gap = max(gap, float((lp - torch.tensor(r.logprobs)).abs().max()))
    return gap


@pytest.mark.parametrize("tied", [True, False])
def test_quantized_head_engine_matches_aligned_learner(tied, tiny_model_dir, untied_model_dir):
    path = str(tiny_model_dir if tied else untied_model_dir)
    eng = TorchEngine.from_pretrained(path, HEAD, max_slots=3, max_len=128)
    learner = Learner(path, HEAD, use_reference=False)
    assert eng.model.audit["quantized"][-1] == "lm_head" and "lm_head" not in eng.model.audit["ignored"]
    layers = 2
    assert learner.report() == {"quantized_linears": 7 * layers + 1, "full_precision_linears": 0}
    gap = engine_vs_learner(eng, learner)
    # the head is really quantized: a learner with a full-precision head sees the difference
    fp_head = engine_vs_learner(eng, Learner(path, QuantSpec.preset("w8a8_kv8"), use_reference=False))
    print(f"\ntied={tied}: max|Δlogp| aligned {gap:.2e}, against a full-precision head {fp_head:.2e}")
    assert gap <= 1e-5 and fp_head > 1e-3

    # a weight sync (the tied head's codes come from the embedding) keeps the two sides equal
    with torch.no_grad():
        name = "model.embed_tokens.weight" if tied else "lm_head.weight"
        dict(learner.model.named_parameters())[name].mul_(1.5).add_(0.01)
    sync = eng.update_weights(learner.named_weights(), version=1)
    assert sync.int8_codes_changed > 0
    assert engine_vs_learner(eng, learner) <= 1e-5


def test_quantized_head_logits_by_hand(untied_model_dir):
    """The aligned learner's head logits = (int8 h codes · int8 W codes) · s_h · s_w, with
    s = absmax / 127 per token (h) and per vocabulary row (W), codes rounded half to even."""
    learner = Learner(str(untied_model_dir), HEAD, use_reference=False)
    ids = torch.tensor([CTXS[2]])
    out = learner.model(input_ids=ids, output_hidden_states=True, use_cache=False)
    h = out.hidden_states[-1][0].detach()                   # after the final norm: the head's input
    w = learner.model.lm_head.weight.detach()
    s_w, s_h = w.abs().amax(1) / 127, h.abs().amax(1) / 127
    acc = torch.round(h / s_h[:, None]).double() @ torch.round(w / s_w[:, None]).double().T
    by_hand = (acc * s_h.double()[:, None] * s_w.double()[None, :]).float()
    assert torch.allclose(out.logits[0].detach(), by_hand, rtol=1e-5, atol=1e-5)
    assert (out.logits[0].detach() - h @ w.T).abs().max() > 1e-3     # not the full-precision head


def test_quantized_head_preset_is_checked():
    assert "lm_head" in HEAD.quantized_modules and HEAD.ignored_modules == ("embed_tokens",)
    assert HEAD.quantizes("lm_head") and HEAD.quantizes("q_proj") and not HEAD.quantizes("embed_tokens")
    assert not QuantSpec.preset("w8a8_kv8").quantizes("lm_head")
    assert not QuantSpec.preset("kv8").quantizes("q_proj")          # lists it, but quantizes no linear
    with pytest.raises(ValueError, match="both quantized and ignored"):
        QuantSpec(quantized_modules=HEAD.quantized_modules)


def test_head_takes_the_fused_norms_codes_like_rows(untied_model_dir, monkeypatch):
    """Where the final norm is fused (CUDA) it hands the W8A8 head per-token codes, and a decode
    step keeps token 0 of each row of those codes: the logits equal the row path's. The fused norm
    is stood in for by the reference quantizer on CPU (the CUDA tests run the real one)."""
    from agentq.kernels import quant

    model = TorchEngine.from_pretrained(str(untied_model_dir), HEAD, max_slots=2, max_len=64).model
    x = torch.randn(3, 1, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    rows = model.logits(x, None, first_token=True)
    norm_rows = model.norm.add_and_norm

    def fused(x, delta, quant_args=None):
        s, h = norm_rows(x, delta)
        assert quant_args == (HEAD.act_scale_floor, HEAD.act_rounding)
        return s, quant.quantize_rows(h, *quant_args)
    monkeypatch.setattr(model.norm, "add_and_norm", fused)
    codes = model.logits(x, None, first_token=True)
    assert rows.shape == (3, model.config.vocab_size) and torch.equal(codes, rows)
