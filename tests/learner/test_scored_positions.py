"""The LM head only where a log-prob is wanted (`sequence_logprobs(scored=...)`): the objectives read
log-probs of action tokens only, so the learner computes the head's logits at the positions that
predict them. Checked against the whole-row computation (every token scored, then masked), padded
and packed, aligned and not, and in the gradients an update sends to the weights.

Tolerances: the head's GEMM over fewer rows may round in another order on the CPU, so log-probs are
compared within 1e-6 and gradients within 1e-5 · max|g| per tensor; unscored tokens are exactly 0."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from agentq.kernels import QuantSpec
from agentq.learner import learner as learner_mod
from agentq.learner.batch import PolicyBatch
from agentq.learner.qat import align_model

LENGTHS = torch.tensor([24, 9, 17])


@pytest.fixture(params=["none", "w8a8_kv8"])
def model(request, tiny_model_dir):
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    align_model(m, QuantSpec.preset(request.param))
    return m


def _rows(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and a multi-turn action mask: two action spans per row, prompts unscored."""
    ids = torch.randint(3, vocab, (3, 24), generator=torch.Generator().manual_seed(0))
    scored = torch.zeros(3, 24, dtype=torch.bool)
    scored[0, 6:10] = scored[0, 15:24] = True
    scored[1, 4:7] = True
    scored[2, 8:11] = scored[2, 13:17] = True
    return ids, scored


def _batch(tiny_model_dir) -> tuple[PolicyBatch, torch.Tensor]:
    """`_rows` as a PolicyBatch (actions = the scored tokens), and the scored mask."""
    ids, scored = _rows(AutoConfig.from_pretrained(tiny_model_dir).vocab_size)
    return PolicyBatch(input_ids=ids, attention_mask=(torch.arange(24) < LENGTHS[:, None]).long(),
                       action_mask=scored.float(), seg_id=torch.zeros(3, 24, dtype=torch.long),
                       rollout_logp=torch.zeros(3, 24), adv=torch.zeros(3)), scored


def _head_rows(model, monkeypatch) -> list[int]:
    """Rows (positions × batch) the LM head is applied to, per forward."""
    rows: list[int] = []
    head = model.get_output_embeddings()
    real = head.forward
    monkeypatch.setattr(head, "forward", lambda x: (rows.append(x.shape[0] * x.shape[1]), real(x))[1])
    return rows


def _score(model, ids, scored, packed: bool, only_scored: bool):
    model.zero_grad()
    kw = {"scored": scored} if only_scored else {}
    if packed:
        lp = learner_mod.packed_sequence_logprobs(model, ids, LENGTHS, 0.8, **kw)
    else:
        lp = learner_mod.sequence_logprobs(model, ids, None, 0.8, **kw)
    lp = lp if only_scored else lp * scored
    (lp * torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)).sum().backward()
    return lp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("packed", [False, True])
def test_scored_positions_match_the_whole_rows(model, monkeypatch, packed):
    ids, scored = _rows(model.config.vocab_size)
    heads = _head_rows(model, monkeypatch)
    ref, ref_grads = _score(model, ids, scored, packed, only_scored=False)
    lp, grads = _score(model, ids, scored, packed, only_scored=True)
    # by hand: packed, one head row per scored token (4 + 9 + 3 + 3 + 4 = 23); padded, the union
    # over the rows of the columns t − 1 before a scored t: 3..9 and 12..22 → 7 + 11 columns × 3 rows
    assert heads == ([24 + 9 + 17, 23] if packed else [3 * 24, 3 * 18])
    assert bool((lp[~scored] == 0).all()) and lp[scored].abs().min() > 0.1     # real log-probs compared
    assert (lp - ref).abs().max() <= 1e-6
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        assert (g - r).abs().max() <= 1e-5 * r.abs().max()


def test_nothing_scored_is_zeros_and_still_differentiable(model):
    ids, _ = _rows(model.config.vocab_size)
    lp = learner_mod.packed_sequence_logprobs(model, ids, LENGTHS, scored=torch.zeros(3, 24, dtype=torch.bool))
    assert lp.shape == (3, 24) and bool((lp == 0).all())
    lp.sum().backward()                     # a loss of a micro-batch without actions (weight 0) backpropagates


def test_learner_scores_the_action_tokens_unless_asked_for_every_token(tiny_model_dir):
    batch, scored = _batch(tiny_model_dir)
    learner = learner_mod.Learner(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), use_reference=False,
                                  pack_tokens=64)
    actions, every = learner.logprobs(batch), learner.logprobs(batch, every_token=True)
    real = batch.attention_mask.bool()
    real[:, 0] = False
    assert bool((actions[~scored] == 0).all()) and bool((every[real] != 0).all())
    assert (actions - every * scored).abs().max() <= 1e-6


def test_head_tokens_all_scores_every_position_and_a_bad_value_is_refused(tiny_model_dir):
    batch, scored = _batch(tiny_model_dir)
    spec = QuantSpec.preset("none")
    every = learner_mod.Learner(str(tiny_model_dir), spec, use_reference=False, head_tokens="all").logprobs(batch)
    actions = learner_mod.Learner(str(tiny_model_dir), spec, use_reference=False).logprobs(batch)
    assert bool((every[:, 1:][batch.attention_mask[:, 1:].bool()] != 0).all())
    assert (actions - every * scored).abs().max() <= 1e-6
    with pytest.raises(ValueError, match="head_tokens='logits'; valid"):
        learner_mod.Learner(str(tiny_model_dir), spec, head_tokens="logits")


class _NoKeepLM(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (a custom model): HF's underneath, every
    position's logits out."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kw):
        kw.pop("logits_to_keep", None)         # were it passed through **kw, it would be dropped here
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache, **kw)


@pytest.mark.parametrize("packed", [False, True])
def test_a_model_without_logits_to_keep_is_scored_alike(model, packed):
    ids, scored = _rows(model.config.vocab_size)
    plain = _NoKeepLM(model)
    assert learner_mod.keeps_logits(model) and not learner_mod.keeps_logits(plain)
    with torch.no_grad():
        if packed:
            want = learner_mod.packed_sequence_logprobs(model, ids, LENGTHS, scored=scored)
            got = learner_mod.packed_sequence_logprobs(plain, ids, LENGTHS, scored=scored)
        else:
            want = learner_mod.sequence_logprobs(model, ids, None, scored=scored)
            got = learner_mod.sequence_logprobs(plain, ids, None, scored=scored)
    assert (got - want).abs().max() <= 1e-6 and want[scored].abs().min() > 0.1
