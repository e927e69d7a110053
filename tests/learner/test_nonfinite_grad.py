"""`Learner.minibatch_step` with a NaN / inf gradient: clip_grad_norm_ cannot rescue it (its factor
max_norm / norm is NaN or 0, and 0 · inf = NaN), and AdamW would write NaN into every weight and
both moments for good. The step is skipped, the gradients dropped, and the update says so
(`skipped_nonfinite_grad`); the next finite minibatch steps as usual."""
import math

import pytest
import torch

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.learner.learner import Learner

from test_packing import mixed_batch, vocab  # noqa: F401  (vocab: a fixture)


def params(learner: Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nonfinite_gradient_skips_the_optimizer_step(tiny_model_dir, vocab, bad):  # noqa: F811
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), lr=1e-3, use_reference=False, micro_batch_size=4)
    objective = make_objective("grpo", kl_coef=0.0)
    batch = mixed_batch(vocab, lengths=[3, 30, 12, 21])
    batch.old_logp = learner.logprobs(batch) - 0.01 * batch.action_mask
    batch = batch.weighted(objective.prepare(batch))
    weight = next(learner.model.parameters())

    def poison(grad: torch.Tensor) -> torch.Tensor:       # one entry of one weight's gradient
        grad = grad.clone()
        grad.view(-1)[0] = bad
        return grad

    before = params(learner)
    hook = weight.register_hook(poison)
    stats = learner.update(batch, objective)
    hook.remove()
    assert stats["skipped_nonfinite_grad"] == 1 and stats["optimizer_steps"] == 0 and math.isnan(stats["grad_norm"])
    assert all(torch.equal(a, p) for a, p in zip(before, learner.model.parameters()))    # not one weight moved
    assert all(p.grad is None for p in learner.model.parameters())
    assert not learner.opt.state                                                         # AdamW never stepped
    stats = learner.update(batch, objective)                                             # a finite gradient
    assert stats["skipped_nonfinite_grad"] == 0 and stats["optimizer_steps"] == 1
    assert math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
    after = params(learner)
    assert all(bool(torch.isfinite(p).all()) for p in after)
    assert any(not torch.equal(a, p) for a, p in zip(before, after))
