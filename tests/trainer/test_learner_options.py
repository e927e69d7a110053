"""Trainer keys that only configure the learner reach `Learner` (through the placement): here
`trainer.grad_input`, the aligned linears' dX GEMM (default "bf16")."""
import pytest
import torch

from agentq.config import load_config
from agentq.trainer.rl import RLTrainer


class _Placement:
    """Records the learner's keyword arguments instead of building one."""

    def __init__(self):
        self.kw: dict = {}

    def learner(self, path, spec, **kw):
        self.kw = kw
        return object()


@pytest.mark.parametrize("overrides, want", [([], "bf16"), (["trainer.grad_input=int8"], "int8")])
def test_grad_input_key_reaches_the_learner(overrides, want):
    trainer = RLTrainer.__new__(RLTrainer)        # only the learner phase of construction
    trainer.cfg, trainer.placement = load_config(overrides), _Placement()
    trainer.dtype, trainer.device, trainer.init_path = torch.float32, torch.device("cpu"), "unused"
    trainer._build_learner("unused", resumed=False)
    assert trainer.placement.kw["grad_input"] == want
