"""The learner's scoring through the fused token log-prob op (`kernels/logprob.py`), which runs on
CUDA: forced here with backend "triton" under the Triton interpreter, against the CPU torch ops,
for padded and packed forwards of the tiny model (fp32) and the gradients they send to the weights.

Tolerances: log-probs ≤ 2e-6 (the sum of exponentials in another order; the kernel tests bound it
against fp64; measured 4.8e-7); weight gradients within 1e-5 · max|g| per tensor (measured 7.7e-7)."""
import functools

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentq.kernels import _interp
from agentq.kernels.logprob import token_logprobs
from agentq.learner import learner as learner_mod

MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_logprob")
pytestmark = [pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed"),
              pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test (Triton 3.6's "
                                 "interpreter cannot run the kernel's loop over a runtime bound)")]


@pytest.fixture
def interpreted_kernels():
    _interp.load_interpreted(MODULES)
    yield
    _interp.restore_compiled(MODULES)


def _score(model, ids, lengths, packed: bool, temperature: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    if packed:
        lp = learner_mod.packed_sequence_logprobs(model, ids, lengths, temperature)
    else:
        lp = learner_mod.sequence_logprobs(model, ids, None, temperature)
    mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    (lp * mask).sum().backward()
    return lp.detach() * mask, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("packed", [False, True])
def test_fused_scoring_matches_the_torch_ops(tiny_model_dir, interpreted_kernels, monkeypatch, packed):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    ids = torch.randint(3, model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([24, 9, 17])
    ref, ref_grads = _score(model, ids, lengths, packed, 0.7)
    monkeypatch.setattr(learner_mod, "token_logprobs", functools.partial(token_logprobs, backend="triton"))
    lp, grads = _score(model, ids, lengths, packed, 0.7)
    assert lp.shape == (3, 24) and bool((lp[:, 0] == 0).all())
    assert (lp - ref).abs().max() <= 2e-6 and ref[0, 1:].abs().min() > 0.1     # real log-probs compared
    for g, r in zip(grads, ref_grads):
        assert (g - r).abs().max() <= 1e-5 * r.abs().max()
