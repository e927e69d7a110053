"""The learner's numbers do not depend on recycled heap memory (`agentq.utils.malloc_tuning`).

With glibc tuned, large tensors reuse freed heap blocks that still hold an earlier tensor's values
instead of fresh zeroed pages, so an op that read memory it did not write would change a result.
A subprocess with the tuning on scores and trains on batch A, frees NaN-filled blocks of every size
the forwards use, then does the same on batch B; its log-probs, loss statistics and gradients of B
must be bit-identical to a fresh learner's in this (untuned) process. Rows are long enough that the
forwards' tensors (8 rows × 2100 tokens: [16800, 512] fp32, attention's fp64 q) pass 32 MiB, glibc's
largest dynamic mmap threshold, which before the tuning always came as fresh pages."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.learner.learner import Learner
from agentq.utils import malloc_tuning

from test_packing import mixed_batch

HERE = Path(__file__).resolve().parent

CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from agentq.utils.malloc_tuning import tune_malloc
assert tune_malloc().startswith("on"), "tuning not applied"
from test_heap_reuse import poison_heap, results
model_dir, a, b, out = sys.argv[2:]
results(model_dir, torch.load(a, weights_only=False))
poison_heap()
torch.save(results(model_dir, torch.load(b, weights_only=False)), out)
"""


def results(model_dir: str, batch) -> dict:
    """π_old log-probs, then one accumulated gradient of the InterQ loss (its statistics and every
    parameter's gradient), of a fresh learner."""
    torch.manual_seed(0)
    learner = Learner(model_dir, QuantSpec.preset("w8a8_kv8"), use_reference=False, micro_batch_size=8)
    objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.0, loss_agg="token_mean")
    batch.old_logp = learner.logprobs(batch)
    batch = batch.weighted(objective.prepare(batch))
    sums: dict[str, float] = {}
    assert learner.accumulate_grads(batch, objective, sums)
    grads = {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    return {"old_logp": batch.old_logp, "sums": sums, "grads": grads}


def poison_heap() -> None:
    """Free NaN-filled blocks from 1 to 256 MiB: later tensors of those sizes reuse them."""
    blocks = [torch.full((mib << 18,), float("nan")) for mib in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256)]
    del blocks


@pytest.mark.skipif(malloc_tuning.glibc_version() is None, reason="glibc only")
def test_tuned_heap_changes_no_logprob_loss_or_gradient(tiny_model_dir, tmp_path):
    from conftest import malloc_tuning_in_a_child      # here: the child imports this file from its own folder

    if not (outcome := malloc_tuning_in_a_child()).startswith("on"):
        pytest.skip(outcome)
    assert not str(malloc_tuning.outcome()).startswith("on"), "this pytest process was tuned: so would the reference be"
    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    a, b = mixed_batch(vocab, [2100] * 8, seed=1), mixed_batch(vocab, [2100, 2090, 2080, 2050, 2040, 2030, 2000, 1990], seed=2)
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    env = {k: v for k, v in os.environ.items() if k != malloc_tuning.ENV_VAR}
    subprocess.run([sys.executable, "-c", CHILD, str(HERE), str(tiny_model_dir), str(tmp_path / "a.pt"),
                    str(tmp_path / "b.pt"), str(tmp_path / "out.pt")], env=env, check=True, timeout=600)
    tuned = torch.load(tmp_path / "out.pt", weights_only=False)
    fresh = results(str(tiny_model_dir), b)
    assert torch.equal(tuned["old_logp"], fresh["old_logp"])
    assert tuned["sums"] == fresh["sums"]
    assert tuned["grads"].keys() == fresh["grads"].keys() and len(fresh["grads"]) > 0
    for name, g in fresh["grads"].items():
        assert torch.equal(tuned["grads"][name], g), name
    assert fresh["old_logp"][b.action_mask.bool()].abs().min() > 0        # real log-probs were compared
