"""`_interp.cuda_half`: the one device/dtype condition of the GPU fast paths (engine fused kernels,
prefill kernel, learner varlen attention and CUDA graphs)."""
import pytest
import torch

from agentq.kernels._interp import cuda_half


@pytest.mark.parametrize("device, dtype, expected", [
    ("cuda", torch.bfloat16, True), ("cuda:1", torch.float16, True), (torch.device("cuda", 0), torch.bfloat16, True),
    ("cuda", torch.float32, False), ("cuda", torch.float64, False), ("cpu", torch.bfloat16, False),
    ("cpu", torch.float32, False), ("meta", torch.float16, False),
])
def test_cuda_half(device, dtype, expected):
    assert cuda_half(device, dtype) is expected


def test_learner_paths_share_it():
    """The learner's three checks read the same predicate: a CPU bf16 model takes none of them."""
    from agentq.learner import learner, qat
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    q = torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16)
    assert not learner.varlen_model(model)
    assert not qat._fused_causal_ok(q)
