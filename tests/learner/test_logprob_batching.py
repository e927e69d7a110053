"""The no-grad forwards' own micro-batching (`Learner(logprob_micro_batch_size=, logprob_pack_tokens=)`):
π_old / π_ref take their own row groups while the update keeps the training ones; the log-probs do
not depend on the grouping; bad values are refused; no forward fills an HF KV cache.

Tolerance: log-probs ≤ 1e-6 between groupings (fp32 CPU; rows padded to another length or packed
with other rows, as `test_packing.py` measures)."""
import pytest
import torch
from transformers import AutoConfig
from transformers.cache_utils import DynamicCache

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.learner import learner as learner_mod
from agentq.learner.learner import Learner, MicroBatching

from test_packing import LENGTHS, mixed_batch


@pytest.fixture(scope="module")
def vocab(tiny_model_dir) -> int:
    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size


def counted_forwards(monkeypatch) -> list[int]:
    """Rows per call of `rows_logprobs` (one model forward each), in call order."""
    calls: list[int] = []
    real = Learner.rows_logprobs

    def spy(self, model, input_ids, attention_mask, pack_tokens, scored=None):
        calls.append(input_ids.shape[0])
        return real(self, model, input_ids, attention_mask, pack_tokens, scored)

    monkeypatch.setattr(Learner, "rows_logprobs", spy)
    return calls


def test_micro_batching_groups_by_hand():
    lengths = torch.tensor(LENGTHS)            # [3, 70, 12, 41, 130, 8, 55, 2]
    # packing off: chunks of 3 rows by length, 130 70 55 | 41 12 8 | 3 2
    groups = [sorted(g.tolist()) for g in MicroBatching(3).groups(lengths)]
    assert sorted(groups) == [[0, 7], [1, 4, 6], [2, 3, 5]]
    # packing on: first-fit decreasing within 100 tokens (`test_packing.py` checks the planner)
    assert [g.tolist() for g in MicroBatching(3, 100).groups(lengths)] == [[4], [1, 2, 5, 0, 7], [6, 3]]


@pytest.mark.parametrize("spec", ["w8a8_kv8", "none"])
def test_logprob_groups_are_their_own_and_change_no_logprob(tiny_model_dir, vocab, spec, monkeypatch):
    batch = mixed_batch(vocab)
    base = Learner(str(tiny_model_dir), QuantSpec.preset(spec), use_reference=False, micro_batch_size=2)
    wide = Learner(str(tiny_model_dir), QuantSpec.preset(spec), use_reference=False, micro_batch_size=2,
                   logprob_micro_batch_size=8)
    packed = Learner(str(tiny_model_dir), QuantSpec.preset(spec), use_reference=False, micro_batch_size=2,
                     logprob_pack_tokens=200)
    calls = counted_forwards(monkeypatch)
    lp_base = base.logprobs(batch)
    assert calls == [2, 2, 2, 2]
    calls.clear()
    lp_wide = wide.logprobs(batch)
    assert calls == [8]                          # all eight rows in one forward
    calls.clear()
    lp_packed = packed.logprobs(batch)
    # first fit decreasing in 200 tokens: 130 + 70 | 55 + 41 + 12 + 8 + 3 + 2
    assert [g.tolist() for g in packed.logprob_batching.groups(batch.attention_mask.sum(1))] == [[4, 1],
                                                                                           [6, 3, 2, 5, 0, 7]]
    assert calls == [2, 6]
    real = batch.attention_mask.bool()
    assert (lp_wide - lp_base)[real].abs().max() <= 1e-6
    assert (lp_packed - lp_base)[real].abs().max() <= 1e-6
    assert lp_base[real].abs().max() > 1.0

    # the update keeps the training groups (2 rows per forward), not the no-grad ones
    objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.0, loss_agg="token_mean")
    batch.old_logp = lp_wide
    batch = batch.weighted(objective.prepare(batch))
    calls.clear()
    assert wide.accumulate_grads(batch, objective, {})
    assert calls == [2, 2, 2, 2]


@pytest.mark.parametrize("key", ["logprob_micro_batch_size", "logprob_pack_tokens", "pack_tokens",
                                 "micro_batch_size"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, "8"])
def test_bad_batching_values_are_refused(tiny_model_dir, key, bad):
    with pytest.raises(ValueError, match=f"Learner {key}="):
        Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False, **{key: bad})


def test_no_forward_fills_a_kv_cache(tiny_model_dir, vocab, monkeypatch):
    """HF builds a DynamicCache by default in eval mode; the learner never reads one, and filling it
    costs two concatenations per layer on every forward."""
    updates: list[int] = []
    real = DynamicCache.update

    def spy(self, *a, **k):
        updates.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(DynamicCache, "update", spy)
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False)
    batch = mixed_batch(vocab)
    learner.logprobs(batch)
    learner_mod.sequence_logprobs(learner.model, batch.input_ids[:1, :3], None)
    assert updates == []
    learner.model(input_ids=batch.input_ids[:1, :3])         # the spy does see HF's default
    assert updates
