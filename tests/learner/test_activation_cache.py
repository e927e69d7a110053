"""The aligned model quantizes an input several linears read once: q/k/v_proj share one
quantization of the attention input, gate/up_proj one of the MLP input (`ste.ActivationCache`).
These tests run the linears one by one (`group_projections=False`, AGENTQ_GROUPED=0), where the
sharing is the cache's; grouped (the default) each group is one call (`test_projection_groups.py`).

Asserted: 3 reuses per decoder layer (k, v, up), in the forward's quantization and in the
backward's dequantized input X_fq; log-probs and every gradient are bit-identical to the same model
with one cache per linear (no sharing); an in-place write to the cached tensor invalidates it; the
learner releases the cache after each forward and each backward."""
import torch
from transformers import AutoModelForCausalLM

from agentq.kernels import ste
from agentq.kernels.quant_spec import QuantSpec
from agentq.learner.qat import QATLinear, align_model

SPEC = QuantSpec.preset("w8a8_kv8")


def _aligned(path, shared: bool):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    align_model(model, SPEC, group_projections=False)
    if not shared:
        for m in model.modules():
            if isinstance(m, QATLinear):
                m.act_cache = ste.ActivationCache()
    return model


def _loss_and_grads(model, ids):
    logits = model(input_ids=ids).logits
    loss = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_shared_activation_quantization_keeps_every_bit(tiny_model_dir):
    ids = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    shared, apart = _aligned(tiny_model_dir, True), _aligned(tiny_model_dir, False)
    cache = next(m.act_cache for m in shared.modules() if isinstance(m, QATLinear))
    logits_s, grads_s = _loss_and_grads(shared, ids)
    logits_a, grads_a = _loss_and_grads(apart, ids)
    assert cache.hits == 3 * shared.config.num_hidden_layers           # k, v, up per layer
    assert cache.deq_hits == 3 * shared.config.num_hidden_layers       # their backwards share X_fq too
    assert torch.equal(logits_s, logits_a)
    assert grads_s.keys() == grads_a.keys()
    assert all(torch.equal(grads_s[n], grads_a[n]) for n in grads_s)


def test_an_in_place_write_invalidates_the_cached_codes():
    cache = ste.ActivationCache()
    x = torch.randn(4, 32)
    first = cache.get(x, SPEC, "torch")
    assert cache.get(x, SPEC, "torch") is first and cache.hits == 1
    x.mul_(2.0)
    again = cache.get(x, SPEC, "torch")
    assert again is not first and cache.hits == 1
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], 2 * first[1])
    assert cache.get(x.clone(), SPEC, "torch") is not again        # another tensor object: no reuse


def test_the_learner_releases_the_cached_activation_after_each_forward(tiny_model_dir):
    """The cache serves one forward; afterwards it must not keep the last input (and its codes)
    alive, and the learner's scores are what the model computes with the cache in use."""
    from agentq.learner.learner import sequence_logprobs

    model = _aligned(tiny_model_dir, True)
    cache = model.agentq_act_cache
    assert all(m.act_cache is cache for m in model.modules() if isinstance(m, QATLinear))
    ids = torch.randint(3, 200, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, None)
        assert cache.x is None and cache.codes is None and cache.hits == 3 * model.config.num_hidden_layers
        logits = model(input_ids=ids).logits                          # a bare forward keeps it
    assert cache.x is not None
    ref = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.allclose(lp[:, 1:], ref, atol=1e-5)


def test_the_learner_releases_the_backward_input_after_each_backward(tiny_model_dir, monkeypatch,
                                                                    two_episode_batch):
    from agentq.algos import make_objective
    from agentq.learner.learner import Learner

    monkeypatch.setenv("AGENTQ_GROUPED", "0")          # the Learner aligns the model again
    model = _aligned(tiny_model_dir, True)
    learner = Learner(model, SPEC, use_reference=False)
    cache = learner.model.agentq_act_cache
    batch = two_episode_batch
    learner.fill_old_and_ref(batch)
    learner.update(batch, make_objective("grpo"))
    assert cache.deq_hits == 3 * model.config.num_hidden_layers       # the backward shared X_fq...
    assert cache._deq is None and cache.x is None                     # ...and let it go afterwards
