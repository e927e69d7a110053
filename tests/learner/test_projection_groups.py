"""q/k/v_proj and gate/up_proj of the aligned model run as one W8A8 GEMM each (`qat.ProjectionGroup`).

Asserted against the same model with every linear alone (`group_projections=False`): the logits
bit for bit (per-channel codes, per-token scales and exact int32 sums do not depend on the stacking);
every gradient within 1e-5 of the largest entry (dX is one GEMM over the stacked weights instead of
a sum of three: fp32 re-association, measured ~1e-7 here); 4 aligned GEMM calls per decoder layer
instead of 7; with and without biases (Qwen2-style q/k/v bias). And: a member called with another
input, or after an in-place write, recomputes; held outputs go after each forward; the stacked codes
are computed once per optimizer step and are each weight's own (the engine sync reads them)."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from agentq.kernels import quant, ste
from agentq.kernels.quant_spec import QuantSpec
from agentq.learner.learner import sequence_logprobs
from agentq.learner.qat import ProjectionGroup, QATLinear, align_model, quantized_weights

SPEC = QuantSpec.preset("w8a8_kv8")


def _model(path, grouped: bool, bias: bool = False, seed: int = 0):
    cfg = AutoConfig.from_pretrained(path)
    if bias:
        cfg.attention_bias = True
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    align_model(model, SPEC, group_projections=grouped)
    return model


def _pair(path, bias: bool):
    grouped = _model(path, True, bias)
    alone = _model(path, False, bias)
    alone.load_state_dict(grouped.state_dict())
    return grouped, alone


def _loss_and_grads(model, ids):
    logits = model(input_ids=ids).logits
    loss = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_forward_is_bit_exact_and_gradients_agree(tiny_model_dir, bias, monkeypatch):
    grouped, alone = _pair(tiny_model_dir, bias)
    layers = grouped.config.num_hidden_layers
    assert len(grouped.agentq_groups) == 2 * layers and alone.agentq_groups == []
    calls = []
    real = ste._int8_linear
    monkeypatch.setattr(ste, "_int8_linear", lambda *a: calls.append(a[2].shape[0]) or real(*a))
    ids = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    logits_g, grads_g = _loss_and_grads(grouped, ids)
    n_grouped = len(calls)
    calls.clear()
    logits_a, grads_a = _loss_and_grads(alone, ids)
    assert n_grouped == 4 * layers and len(calls) == 7 * layers       # qkv, o, gate_up, down vs one per linear
    assert torch.equal(logits_g, logits_a)
    assert grads_g.keys() == grads_a.keys()
    if bias:
        assert any(n.endswith("q_proj.bias") for n in grads_g)
    for n in grads_g:
        scale = float(grads_a[n].abs().max())
        assert scale > 0, n
        assert float((grads_g[n] - grads_a[n]).abs().max()) <= 1e-5 * scale, n


def test_a_member_alone_recomputes_and_held_outputs_are_released(tiny_model_dir):
    grouped, alone = _pair(tiny_model_dir, bias=False)
    attn_g, attn_a = grouped.model.layers[0].self_attn, alone.model.layers[0].self_attn
    group = attn_g.k_proj.group
    assert isinstance(group, ProjectionGroup) and group.members == [attn_g.q_proj, attn_g.k_proj, attn_g.v_proj]
    x = torch.randn(3, grouped.config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        k = attn_g.k_proj(x)                          # k first: computes all three, holds q and v
        assert torch.equal(k, attn_a.k_proj(x)) and group.held is not None
        assert torch.equal(attn_g.v_proj(x), attn_a.v_proj(x))
        x.mul_(3.0)                                   # in place: what is held no longer matches x
        assert torch.equal(attn_g.q_proj(x), attn_a.q_proj(x))
        y = torch.randn_like(x)
        assert torch.equal(attn_g.v_proj(y), attn_a.v_proj(y))      # another tensor: recomputed
        assert group.held is not None
        ids = torch.randint(3, 200, (1, 8), generator=torch.Generator().manual_seed(3))
        sequence_logprobs(grouped, ids, None)
    assert all(g.held is None for g in grouped.agentq_groups)       # released after the forward


def test_stacked_codes_once_per_step_and_each_weights_own(tiny_model_dir):
    model = _model(tiny_model_dir, True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(4))
    for _ in range(3):                                # π_old, π_ref-like passes and micro-batches
        _loss_and_grads(model, ids)
    assert all(g.cache.recomputes == 1 for g in model.agentq_groups)
    opt.step()
    _loss_and_grads(model, ids)
    assert all(g.cache.recomputes == 2 for g in model.agentq_groups)
    cached = quantized_weights(model)
    for name, m in model.named_modules():
        if isinstance(m, QATLinear):
            w_q, s_w = quant.quantize_weight(m.weight.detach(), SPEC)
            assert torch.equal(cached[f"{name}.weight"][0], w_q) and torch.equal(cached[f"{name}.weight"][1], s_w)


def test_weight_cache_of_stacked_weights_is_each_weights_codes():
    g = torch.Generator().manual_seed(5)
    ws = (torch.randn(8, 16, generator=g), torch.randn(4, 16, generator=g) * 7, torch.randn(4, 16, generator=g))
    cache = ste.WeightCache()
    w_q, s_w = cache.get(ws, SPEC)
    ref = [quant.quantize_weight(w, SPEC) for w in ws]
    assert torch.equal(w_q, torch.cat([r[0] for r in ref])) and torch.equal(s_w, torch.cat([r[1] for r in ref]))
    assert cache.get(ws, SPEC)[0] is w_q and cache.recomputes == 1
    ws[1].add_(1.0)                                    # any member's in-place write invalidates
    assert cache.get(ws, SPEC)[0] is not w_q and cache.recomputes == 2


def test_groups_are_only_formed_from_fitting_members(tiny_model_dir):
    model = _model(tiny_model_dir, True)
    mlp = model.model.layers[0].mlp
    assert ProjectionGroup.fits([mlp.gate_proj, mlp.up_proj])
    assert not ProjectionGroup.fits([mlp.gate_proj, mlp.down_proj])          # different input widths
    plain = torch.nn.Linear(mlp.gate_proj.in_features, 4)
    assert not ProjectionGroup.fits([mlp.gate_proj, plain])                  # not an aligned linear


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200)")
def test_cuda_grouped_model_matches_linears_alone():
    """Compiled kernels at a 1B-model width in bf16 (the fused norms / SiLU·mul hand the groups
    their codes): log-probs bit for bit, gradients within 1 % (bf16 GEMMs summing in another order)."""
    from transformers import Qwen3Config
    cfg = Qwen3Config(hidden_size=2048, intermediate_size=6144, num_hidden_layers=2, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=4096, max_position_embeddings=1024)
    torch.manual_seed(0)
    with torch.device("cuda"):
        grouped = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        alone = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    alone.load_state_dict(grouped.state_dict())
    align_model(grouped, SPEC, group_projections=True)
    align_model(alone, SPEC, group_projections=False)
    ids = torch.randint(0, 4096, (4, 512), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    (lg, gg), (la, ga) = _loss_and_grads(grouped, ids), _loss_and_grads(alone, ids)
    assert torch.equal(lg, la)
    worst = max(float((gg[n] - ga[n]).norm() / ga[n].norm().clamp_min(1e-12)) for n in ga)
    print(f"grouped vs alone on CUDA: logits equal, worst relative gradient difference {worst:.2e}")
    assert worst < 1e-2


def test_grouping_default_is_cuda_only_unless_forced(tiny_model_dir, monkeypatch):
    """Grouping saves GPU launch time; on the CPU it would only re-associate the fp32 backward's
    sums (and move the default run's trajectory), so a CPU model stays ungrouped by default."""
    from agentq.learner.qat import grouping_default
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    monkeypatch.delenv("AGENTQ_GROUPED", raising=False)
    assert grouping_default(model) is False
    monkeypatch.setenv("AGENTQ_GROUPED", "1")
    assert grouping_default(model) is True
    align_model(model, SPEC)
    assert len(model.agentq_groups) == 2 * model.config.num_hidden_layers
    monkeypatch.setenv("AGENTQ_GROUPED", "0")
    assert grouping_default(model) is False
