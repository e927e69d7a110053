"""`Learner.update(old_logp_mode="bypass")`: π_old from the update's own forward at θ_old, the
objective's weights per micro-batch. One update in bypass mode equals one in recompute mode (a
no-grad π_old pass, weights on the whole batch, then the update): the same parameters after the
optimizer step, the same `batch.old_logp`, the same `prepare` stats, for padded micro-batches and
for packs. Settings where that cannot hold are refused.

The equality needs a training forward that computes what the no-grad pass computes. fp32 learners
run no-grad attention in fp64 and training attention in fp32 (`kernels.attention`), which the
trainer refuses (`grad_pass_refusal`); the comparisons here make attention's dtype independent of
grad mode (`same_attention_dtype`), as it is for the bf16 GPU learner. Measured on this CPU: every
difference 0.0 (parameters, old_logp, weights, stats), so the tolerances are the brief's 1e-6."""
import pytest
import torch
from transformers import AutoConfig

from agentq.algos import make_objective
from agentq.kernels import QuantSpec
from agentq.kernels import attention
from agentq.learner.learner import Learner, grad_pass_refusal

from test_packing import mixed_batch

LR = 1e-3                 # large enough that the optimizer step moves every weight visibly
BATCHING = {"micro": {"micro_batch_size": 3}, "packed": {"pack_tokens": 100}}
OBJECTIVES = {"grpo": {}, "interq": {}, "tis": {}, "qurl": {}, "tbpo": {},
              "interq_tis": {"token_tis_cap": 2.0}}


@pytest.fixture(scope="module")
def vocab(tiny_model_dir) -> int:
    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size


@pytest.fixture
def same_attention_dtype(monkeypatch):
    """Attention in fp64 for fp32 models with and without gradients (the no-grad rule for both)."""
    monkeypatch.setattr(attention, "attention_accum_dtype",
                        lambda dtype, device: torch.float64 if dtype == torch.float32 else dtype)


def objective(key: str):
    name = key.split("_")[0]
    return make_objective(name, clip_eps=0.2, dual_clip=10.0, kl_coef=0.01, loss_agg="token_mean", **OBJECTIVES[key])


def one_update(model_dir, vocab: int, key: str, batching: dict, mode: str, **device):
    """(parameters after one update, the batch with old_logp, prepare's result, update stats);
    `device`: the learner's dtype / device (the CPU's fp32 when empty)."""
    learner = Learner(str(model_dir), QuantSpec.preset("w8a8_kv8"), lr=LR, use_reference=True, **batching, **device)
    obj, batch = objective(key), mixed_batch(vocab)
    gen = torch.Generator().manual_seed(0)
    if mode == "recompute":
        learner.fill_old_and_ref(batch)
        prep = obj.prepare(batch)
        upd = learner.update(batch.weighted(prep), obj, generator=gen)
    else:
        learner.fill_ref(batch)
        assert batch.old_logp is None and batch.ref_logp is not None
        upd = learner.update(batch, obj, generator=gen, old_logp_mode="bypass")
        prep = obj.prepare(batch)            # what the trainer logs: prepare on the filled batch
    params = torch.cat([p.detach().float().flatten().cpu() for p in learner.model.parameters()])
    return params, batch, prep, upd


@pytest.mark.parametrize("batching", list(BATCHING))
@pytest.mark.parametrize("key", list(OBJECTIVES))
def test_bypass_update_equals_recompute(tiny_model_dir, vocab, key, batching, same_attention_dtype):
    p_re, b_re, prep_re, upd_re = one_update(tiny_model_dir, vocab, key, BATCHING[batching], "recompute")
    p_by, b_by, prep_by, upd_by = one_update(tiny_model_dir, vocab, key, BATCHING[batching], "bypass")
    init = torch.cat([p.detach().flatten() for p in Learner(str(tiny_model_dir), QuantSpec.preset("none"),
                                                            use_reference=False).model.parameters()])
    assert (p_re - init).abs().max() > 0.5 * LR                 # the step moved the weights
    real, act = b_re.attention_mask.bool(), b_re.action_mask.bool()
    print(f"\n{key} {batching}: max|Δ| params {(p_by - p_re).abs().max():.1e}, old_logp "
          f"{(b_by.old_logp - b_re.old_logp)[real].abs().max():.1e}, weights "
          f"{(prep_by.token_weight - prep_re.token_weight).abs().max():.1e}")
    assert (p_by - p_re).abs().max() <= 1e-6
    assert b_by.old_logp is not None and b_by.old_logp.device.type == "cpu"
    assert (b_by.old_logp - b_re.old_logp)[real].abs().max() <= 1e-6
    assert b_re.old_logp[act].abs().min() > 0                   # real log-probs, not the zeros it started from
    assert (prep_by.token_weight - prep_re.token_weight).abs().max() <= 1e-6
    assert prep_by.stats.keys() == prep_re.stats.keys()
    for k, v in prep_re.stats.items():
        assert prep_by.stats[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
    assert upd_by.keys() == upd_re.keys()
    for k, v in upd_re.items():
        assert upd_by[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
    # π_θ = π_old exactly at θ_old: each micro-batch's ratio_mean is 1.0, their token-share sum 1 to rounding
    assert upd_by["ratio_mean"] == pytest.approx(1.0, abs=1e-15)


CUDA_BATCHING = {"micro": {"micro_batch_size": 3}, "packed": {"pack_tokens": 100},
                 "packed_graphs": {"pack_tokens": 100, "cuda_graphs": True}}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200)")
@pytest.mark.parametrize("batching", list(CUDA_BATCHING))
@pytest.mark.parametrize("key", ["grpo", "interq"])
def test_bypass_update_equals_recompute_on_cuda_bf16(tiny_model_dir, vocab, key, batching):
    """The GPU learner, with nothing patched: its training forward (fused attention, Triton W8A8,
    fused log-probs; replayed as a CUDA graph for packs with graphs on) must give the no-grad
    π_old pass's log-probs bit for bit, or bypass would not be the update recompute runs."""
    kw = dict(dtype=torch.bfloat16, device="cuda")
    p_re, b_re, prep_re, upd_re = one_update(tiny_model_dir, vocab, key, CUDA_BATCHING[batching], "recompute", **kw)
    p_by, b_by, prep_by, upd_by = one_update(tiny_model_dir, vocab, key, CUDA_BATCHING[batching], "bypass", **kw)
    real = b_re.attention_mask.bool()
    d_old = (b_by.old_logp - b_re.old_logp)[real].abs().max().item()
    d_par = (p_by - p_re).abs().max().item()
    print(f"\n[cuda bf16] {key} {batching}: max|Δ| old_logp {d_old:.1e}, params {d_par:.1e}, "
          f"ratio_mean {upd_re['ratio_mean']!r} / {upd_by['ratio_mean']!r}")
    assert d_old == 0.0 and d_par == 0.0
    assert (prep_by.token_weight - prep_re.token_weight).abs().max() == 0.0
    assert upd_by["ratio_mean"] == 1.0 and upd_re["ratio_mean"] == 1.0


def test_fp32_training_attention_is_not_the_old_logp_pass(tiny_model_dir, vocab):
    """Why the trainer refuses bypass for fp32 learners: without making attention's dtype grad
    independent, bypass's π_old (the training pass) moves off the no-grad π_old by int8 code flips."""
    assert "float32" in grad_pass_refusal(torch.float32, torch.device("cpu"))
    assert grad_pass_refusal(torch.bfloat16, torch.device("cpu")) is None
    _, b_re, _, _ = one_update(tiny_model_dir, vocab, "grpo", BATCHING["micro"], "recompute")
    _, b_by, _, _ = one_update(tiny_model_dir, vocab, "grpo", BATCHING["micro"], "bypass")
    act = b_re.action_mask.bool()
    assert (b_by.old_logp - b_re.old_logp)[act].abs().max() > 1e-4


@pytest.mark.parametrize("change, match", [
    ({"epochs": 2}, "ppo_epochs=2"),
    ({"minibatch_size": 4}, "minibatch_size=4 < 8"),
    ({"objective": "ais"}, "'ais'.*row_local_prepare=False"),
    # its divisor is the minibatch's mean α, known only after every micro-batch's forward
    ({"objective": "interq", "params": {"renorm_retention": True}}, "'interq'.*row_local_prepare=False"),
    ({"traj_id": True}, "traj_id"),
])
def test_bypass_refuses_what_it_cannot_do_exactly(tiny_model_dir, vocab, change, match):
    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False)
    batch = mixed_batch(vocab)
    if change.get("traj_id"):
        batch.traj_id = torch.arange(batch.num_seqs) // 2
    obj = make_objective(change.get("objective", "interq"), **change.get("params", {}))
    before = [p.detach().clone() for p in learner.model.parameters()]
    with pytest.raises(ValueError, match=match):
        learner.update(batch, obj, epochs=change.get("epochs", 1), minibatch_size=change.get("minibatch_size"),
                       old_logp_mode="bypass")
    assert all(torch.equal(a, p) for a, p in zip(before, learner.model.parameters()))   # nothing ran


def test_unknown_old_logp_mode_and_data_parallel_bypass_are_refused(tiny_model_dir, vocab):
    from agentq.learner.distributed import DataParallelLearner

    learner = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False)
    with pytest.raises(ValueError, match="old_logp_mode='fast'"):
        learner.update(mixed_batch(vocab), make_objective("grpo"), old_logp_mode="fast")
    driver = DataParallelLearner.__new__(DataParallelLearner)       # no Ray: the check comes first
    with pytest.raises(ValueError, match="data-parallel learner supports only old_logp_mode in \\[.recompute.\\]"):
        driver.update(mixed_batch(vocab), make_objective("grpo"), old_logp_mode="bypass")
    with pytest.raises(ValueError, match="fill_ref .*supports only old_logp_mode"):
        driver.fill_ref(mixed_batch(vocab))
    assert DataParallelLearner.old_logp_modes == ("recompute",) and "bypass" in Learner.old_logp_modes
