"""The per-RL-step learning rate (`lr_factor`) against hand numbers, and `Learner.update(lr=...)`:
the same weights as a learner whose optimizer was built at that rate."""
import math

import pytest
import torch

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.learner.learner import Learner
from agentq.learner.lr_schedule import lr_factor

from test_packing import mixed_batch, vocab  # noqa: F401  (vocab: a fixture)


def test_warmup_then_constant():
    assert [lr_factor(s, 10, warmup_steps=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(s, 3) for s in range(3)] == [1.0, 1.0, 1.0]


def test_linear_decay_by_hand():
    # p = step / 10: 1 − p
    assert [lr_factor(s, 10, schedule="linear") for s in (0, 5, 9)] == pytest.approx([1.0, 0.5, 0.1])
    # m = 0.2: 1 − 0.8 p; warmup 2, then p = (step − 2) / 8
    assert lr_factor(6, 10, warmup_steps=2, schedule="linear", min_ratio=0.2) == pytest.approx(1 - 0.8 * 0.5)


def test_cosine_decay_by_hand():
    f = [lr_factor(s, 10, warmup_steps=2, schedule="cosine", min_ratio=0.1) for s in range(10)]
    assert f[:3] == pytest.approx([0.5, 1.0, 1.0])                  # warmup, then p = 0
    assert f[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))      # p = 4/8: 0.55
    assert f[9] == pytest.approx(0.1 + 0.45 * (1 + math.cos(7 * math.pi / 8)))      # p = 7/8: 0.134254
    assert f[9] == pytest.approx(0.134254, abs=1e-6)
    assert all(a > b for a, b in zip(f[2:], f[3:]))                  # strictly decreasing after warmup


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="valid"):
        lr_factor(0, 10, schedule="step")
    with pytest.raises(ValueError, match="min ratio"):
        lr_factor(0, 10, schedule="cosine", min_ratio=1.5)
    with pytest.raises(ValueError):
        lr_factor(0, 10, warmup_steps=-1)


def test_update_at_a_rate_equals_an_optimizer_built_at_it(tiny_model_dir, vocab):  # noqa: F811
    objective = make_objective("grpo", kl_coef=0.0)
    batch = mixed_batch(vocab, lengths=[3, 30, 12, 21])
    made = Learner(str(tiny_model_dir), QuantSpec.preset("none"), lr=2.5e-4, use_reference=False, micro_batch_size=4)
    batch.old_logp = made.logprobs(batch) - 0.01 * batch.action_mask
    batch = batch.weighted(objective.prepare(batch))
    set_ = Learner(str(tiny_model_dir), QuantSpec.preset("none"), lr=1e-3, use_reference=False, micro_batch_size=4)
    made.update(batch, objective)
    set_.update(batch, objective, lr=2.5e-4)
    assert all(g["lr"] == 2.5e-4 for g in set_.opt.param_groups)
    assert all(torch.equal(a, b) for a, b in zip(made.model.parameters(), set_.model.parameters()))
    moved = Learner(str(tiny_model_dir), QuantSpec.preset("none"), lr=1e-3, use_reference=False, micro_batch_size=4)
    moved.update(batch, objective)                                      # the built rate: other weights
    assert any(not torch.equal(a, b) for a, b in zip(made.model.parameters(), moved.model.parameters()))
    with pytest.raises(ValueError, match="learning rate"):
        set_.set_lr(float("nan"))
