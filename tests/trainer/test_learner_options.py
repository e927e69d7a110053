"""Trainer keys that only configure the learner reach `Learner` (through the placement): here
`trainer.grad_input`, the aligned linears' dX GEMM (default "bf16"), `trainer.cuda_graphs`
(default false) and `trainer.share_prefix` (default true)."""
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


def learner_kwargs(overrides: list[str]) -> dict:
    trainer = RLTrainer.__new__(RLTrainer)        # only the learner phase of construction
    trainer.cfg, trainer.placement = load_config(overrides), _Placement()
    trainer.dtype, trainer.device, trainer.init_path = torch.float32, torch.device("cpu"), "unused"
    trainer._build_learner("unused", resumed=False)
    return trainer.placement.kw


@pytest.mark.parametrize("overrides, want", [([], "bf16"), (["trainer.grad_input=int8"], "int8")])
def test_grad_input_key_reaches_the_learner(overrides, want):
    assert learner_kwargs(overrides)["grad_input"] == want


@pytest.mark.parametrize("overrides, want", [([], False), (["trainer.cuda_graphs=true"], True)])
def test_cuda_graphs_key_reaches_the_learner(overrides, want):
    assert learner_kwargs(overrides)["cuda_graphs"] is want


@pytest.mark.parametrize("overrides, want", [([], True), (["trainer.share_prefix=false"], False)])
def test_share_prefix_key_reaches_the_learner(overrides, want):
    assert learner_kwargs(overrides)["share_prefix"] is want
