"""The aligned learner's weight caches after an optimizer step that does not bump the weights'
version counters: torch's fused AdamW kernels (`fused=True`) write the parameters without it, so a
cache keyed on (storage, version) alone would keep serving the old weights' codes to the forward and
to the weight sync. `Learner.optimizer_step` drops the caches after every step."""
import torch

from agentq.algos import make_objective
from agentq.kernels import QuantSpec, quant
from agentq.learner import qat
from agentq.learner.learner import Learner

from test_packing import mixed_batch, vocab  # noqa: F401  (vocab: a fixture)


def test_fused_adamw_does_not_bump_versions():
    """The premise, so the test below keeps testing something if torch changes."""
    p = torch.nn.Parameter(torch.randn(4, 4))
    opt = torch.optim.AdamW([p], fused=True)
    p.grad = torch.randn(4, 4)
    before = p.detach().clone()
    opt.step()
    assert not torch.equal(before, p.detach()) and p._version == 0


def test_the_aligned_forward_sees_a_fused_optimizers_step(tiny_model_dir, vocab):  # noqa: F811
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), lr=1e-2, use_reference=False,
                      micro_batch_size=4)
    learner.opt = torch.optim.AdamW(learner.model.parameters(), lr=1e-2, fused=True)
    objective = make_objective("grpo", kl_coef=0.0)
    batch = mixed_batch(vocab, lengths=[3, 30, 12, 21])
    batch.old_logp = learner.logprobs(batch) - 0.01 * batch.action_mask
    batch = batch.weighted(objective.prepare(batch))
    assert learner.update(batch, objective)["optimizer_steps"] == 1
    served = learner.logprobs(batch)
    qat.invalidate_weight_caches(learner.model)          # every code recomputed from today's weights
    fresh = learner.logprobs(batch)
    assert not torch.equal(served, batch.old_logp + 0.01 * batch.action_mask)   # the weights moved
    assert torch.equal(served, fresh)
    for name, (w_q, _) in qat.quantized_weights(learner.model).items():          # what a weight sync sends
        w = learner.model.get_parameter(name)
        assert torch.equal(w_q.to(torch.int8), quant.quantize_weight(w.detach(), learner.spec)[0])
