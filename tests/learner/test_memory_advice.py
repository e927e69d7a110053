"""A pass of the learner that runs out of device memory says which settings bound its memory.

A real CUDA out-of-memory error cannot be raised on the CPU (the CPU allocator's failure is a plain
RuntimeError), so the forward is replaced by one that raises `torch.OutOfMemoryError` with CUDA's
wording: the only fake here, standing in for the device. Nothing is lost: no optimizer step is
taken, and a failed no-grad pass leaves the model in the mode it found it in."""
import pytest
import torch

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.learner.learner import Learner

CUDA_WORDS = "CUDA out of memory. Tried to allocate 1.23 GiB."


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError(CUDA_WORDS)


@pytest.mark.parametrize("pack_tokens, knob", [(None, "trainer.micro_batch_size"), (64, "trainer.pack_tokens")])
@pytest.mark.parametrize("ckpt", [False, True])
def test_an_update_out_of_memory_names_its_settings_and_steps_nothing(tiny_model_dir, monkeypatch, pack_tokens,
                                                                      knob, ckpt, two_episode_batch):
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False,
                      pack_tokens=pack_tokens, activation_checkpointing=ckpt)
    batch = two_episode_batch
    learner.fill_old_and_ref(batch)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    monkeypatch.setattr(learner, "rows_logprobs", _out_of_memory)
    with pytest.raises(torch.OutOfMemoryError) as err:
        learner.update(batch, make_objective("grpo"))
    text = str(err.value)
    assert text.startswith(CUDA_WORDS) and f"Lower {knob}" in text
    assert ("activation_checkpointing=true" in text) is (not ckpt)
    assert isinstance(err.value.__cause__, torch.OutOfMemoryError)
    # no optimizer step was taken: the weights are the ones before the update
    assert all(torch.equal(p, before[n]) for n, p in learner.model.named_parameters())
    assert learner.version == 0


@pytest.mark.parametrize("logprob_pack, knob", [(None, "trainer.logprob_micro_batch_size"),
                                                (128, "trainer.logprob_pack_tokens")])
def test_a_no_grad_pass_out_of_memory_names_the_logprob_settings(tiny_model_dir, monkeypatch, logprob_pack, knob,
                                                                  two_episode_batch):
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False,
                      logprob_pack_tokens=logprob_pack)
    assert learner.model.training
    monkeypatch.setattr(learner, "rows_logprobs", _out_of_memory)
    with pytest.raises(torch.OutOfMemoryError, match=f"no-grad .* Lower {knob}\\.$"):
        learner.logprobs(two_episode_batch)
    assert learner.model.training            # the failed pass's eval() was undone


def test_with_cuda_graphs_the_hint_names_them_and_not_checkpointing(tiny_model_dir):
    """A graphed learner's pool holds about the largest pack's peak, which eager passes cannot use
    (an H100 update ran out of memory beside a 38.6 GiB pool): the hint names trainer.cuda_graphs,
    and not activation checkpointing, which graphs refuse. (CUDA graphs cannot be made on the CPU:
    the flag is set on a CPU learner, with a pool that captures nothing, to check the words.)"""
    from agentq.learner.graphs import GraphPool
    from agentq.learner.learner import memory_hint

    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, pack_tokens=64)
    plain = memory_hint(learner, train=True)
    assert "cuda_graphs" not in plain and "activation_checkpointing=true" in plain
    learner.cuda_graphs, learner.graph_pool = True, GraphPool(capture=False)
    text = memory_hint(learner, train=True)
    assert text == ("agentq: the update (forward + backward; AdamW's state, 8 bytes a parameter, exists from the "
                    "first optimizer step on) ran out of device memory with packs of at most 64 tokens. Lower "
                    "trainer.pack_tokens, or set trainer.cuda_graphs=false: the CUDA graphs keep about the "
                    "largest pack's peak in a memory pool of their own, which the eager passes (packs of shapes "
                    "not captured) cannot use.")
