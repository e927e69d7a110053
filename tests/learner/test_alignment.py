"""The QAT-aligned learner computes the engine's function: log-probs of the engine's sampled tokens
match to 1e-4 in fp32 over multi-turn episodes; an unaligned learner sees ≥ 10× the K3 mismatch."""
import pytest
import torch

from agentq.agent import ActionParser, AgentLoop, BackendPolicy, ChatFormat, EpisodeSpec, PromptConfig
from agentq.algos import grpo_advantages, make_objective, mismatch_metrics
from agentq.learner.batch import PolicyBatch
from agentq.kernels import QuantSpec, cpu_gemm
from agentq.learner.batch import collate
from agentq.learner.learner import Learner
from agentq.pool import EnvSpec, InlinePool
from agentq.rollout import SamplingParams
from agentq.rollout.torch_engine.engine import TorchEngine

SPEC = QuantSpec.preset("w8a8_kv8")


def play(model_dir, tokenizer, temperature: float = 1.0):
    """6 real TextWorldExpress episodes (3 tasks × 2) played by the W8A8-KV8 engine, 4 turns each."""
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = InlinePool(EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 4,
                                                    "game_params": {"coin": "numLocations=2"}}), 6)
    eng = TorchEngine.from_pretrained(str(model_dir), SPEC, max_slots=6, max_len=1536)
    loop = AgentLoop(pool, chat, PromptConfig(system="Reply with <action>...</action>.", actions=""),
                     ActionParser(), SamplingParams(temperature=temperature, max_new_tokens=12,
                                                    stop_token_ids=chat.stop_token_ids),
                     max_turns=4, max_context_tokens=1536)
    trajs = loop.run([EpisodeSpec(i, f"coin/{i // 2}", "train", group_id=i // 2, seed=i) for i in range(6)],
                     BackendPolicy(eng))
    pool.close()
    return trajs


@pytest.fixture(scope="module")
def episodes(tiny_model_dir, tokenizer):
    return play(tiny_model_dir, tokenizer)


def test_aligned_learner_matches_engine_and_unaligned_does_not(tiny_model_dir, episodes):
    assert all(t.turns == 4 for t in episodes)
    batch = collate(episodes)
    mask = batch.action_mask.bool()
    assert int(mask.sum()) == sum(t.num_action_tokens for t in episodes)
    aligned = Learner(str(tiny_model_dir), SPEC, use_reference=False)
    unaligned = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False)
    d_al = (aligned.logprobs(batch) - batch.rollout_logp)[mask].abs()
    batch.old_logp = aligned.logprobs(batch)
    k3_al = mismatch_metrics(batch)["k3"]
    batch.old_logp = unaligned.logprobs(batch)
    k3_un = mismatch_metrics(batch)["k3"]
    d_un = (batch.old_logp - batch.rollout_logp)[mask].abs()
    print(f"\naligned   max|Δlogp| = {d_al.max():.3e}  K3 = {k3_al:.3e}"
          f"\nunaligned max|Δlogp| = {d_un.max():.3e}  K3 = {k3_un:.3e}  ratio = {k3_un / max(k3_al, 1e-300):.1e}")
    assert d_al.max() <= 1e-4
    assert k3_un >= 10 * k3_al and d_un.max() > 1e-3
    assert aligned.report() == {"quantized_linears": 14, "full_precision_linears": 1}   # lm_head stays fp


@pytest.mark.parametrize("path", cpu_gemm.PATHS)
def test_alignment_holds_on_every_cpu_gemm_path(tiny_model_dir, tokenizer, episodes, path):
    """Engine and aligned learner both on `path`: the episodes are the default path's, token for token
    and log-prob for log-prob (the paths share _int_mm's bits), and max |Δ log-prob| ≤ 1e-5 in fp32."""
    with cpu_gemm.use_path(path):
        trajs = play(tiny_model_dir, tokenizer)
        aligned = Learner(str(tiny_model_dir), SPEC, use_reference=False)
        batch = collate(trajs)
        d = (aligned.logprobs(batch) - batch.rollout_logp)[batch.action_mask.bool()].abs()
    ref = collate(episodes)
    assert torch.equal(batch.input_ids, ref.input_ids) and torch.equal(batch.rollout_logp, ref.rollout_logp)
    print(f"\n{path}: max|Δlogp| = {d.max():.3e}")
    assert d.max() <= 1e-5


def test_learner_scores_the_rollout_temperature(tiny_model_dir, tokenizer):
    """Sampled at T = 0.7, the engine's behaviour log-probs are of softmax(logits / 0.7): the aligned
    learner at T = 0.7 matches them to 1e-5 (fp32, CPU); at T = 1 it would see a systematic δ."""
    trajs = play(tiny_model_dir, tokenizer, temperature=0.7)
    batch = collate(trajs)
    mask = batch.action_mask.bool()
    at_07 = Learner(str(tiny_model_dir), SPEC, use_reference=False, temperature=0.7)
    d = (at_07.logprobs(batch) - batch.rollout_logp)[mask].abs()
    d_t1 = (Learner(str(tiny_model_dir), SPEC, use_reference=False).logprobs(batch) - batch.rollout_logp)[mask].abs()
    print(f"\nT = 0.7: max|Δlogp| = {d.max():.3e} (learner at T = 0.7), {d_t1.max():.3e} (learner at T = 1)")
    assert d.max() <= 1e-5
    assert d_t1.max() > 1e-2
    with pytest.raises(ValueError, match="temperature"):
        Learner(str(tiny_model_dir), SPEC, use_reference=False, temperature=0.0)


def test_interq_default_retention_is_one_at_rounding_level_and_corrects_real_mismatch(tiny_model_dir, episodes):
    """The aligned learner's δ is float rounding: the default (capped, H_floor = B) gives α ≥ 1 − 1e-6,
    where the fixed budget (H_floor = 0) rescales the noise into a full-strength correction. Against
    the unaligned learner (real mismatch) the default gives α_s = exp(−H_s · B / max(Htot, B))."""
    from agentq.algos.interq import interq_retention

    batch = collate(episodes, torch.zeros(len(episodes)))
    batch.old_logp = Learner(str(tiny_model_dir), SPEC, use_reference=False).logprobs(batch)
    assert mismatch_metrics(batch)["k3"] < 1e-9
    stats = make_objective("interq").prepare(batch).stats
    assert stats["alpha_min"] >= 1 - 1e-6
    fixed = make_objective("interq", H_floor=0.0).prepare(batch).stats
    print(f"\naligned: α_min = {stats['alpha_min']:.9f} (default), {fixed['alpha_min']:.3f} (fixed budget)")
    assert fixed["alpha_min"] < 0.9                   # the defect the default avoids

    batch.old_logp = Learner(str(tiny_model_dir), QuantSpec.preset("none"), use_reference=False).logprobs(batch)
    stats = make_objective("interq").prepare(batch).stats
    r = interq_retention(batch, budget_B=1.0, H_floor=0.0)
    scale = 1.0 / torch.clamp(r.Htot, min=1.0)        # κ = B / max(Htot, B)
    expected = torch.exp(-r.H * scale.view(-1, 1))
    seg = r.valid & (r.n > 0)
    print(f"unaligned: K3 = {mismatch_metrics(batch)['k3']:.2e}, Htot max = {float(r.Htot.max()):.3e}, "
          f"α_min = {stats['alpha_min']:.4f}")
    assert torch.allclose(interq_retention(batch, budget_B=1.0, H_floor=1.0).alpha[seg], expected[seg],
                          rtol=0, atol=1e-12)
    assert stats["alpha_min"] == pytest.approx(float(expected[seg].min()), abs=1e-12)
    assert stats["alpha_max"] == pytest.approx(float(expected[seg].max()), abs=1e-12)
    assert stats["alpha_min"] < 1 - 1e-4


def test_observation_tokens_carry_no_loss(tiny_model_dir, episodes):
    """d loss / d logp is exactly 0 on every non-action position (prompt, observations, template)."""
    learner = Learner(str(tiny_model_dir), SPEC, use_reference=True)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    batch = collate(episodes, grpo_advantages(rewards, torch.tensor([t.group_id for t in episodes])))
    learner.fill_old_and_ref(batch)
    obj = make_objective("interq")
    batch = batch.weighted(obj.prepare(batch))
    from agentq.learner.learner import sequence_logprobs

    logp = sequence_logprobs(learner.model, batch.input_ids, batch.attention_mask)
    logp.retain_grad()
    loss, _ = obj.loss(logp, batch)
    loss.backward()
    non_action = ~batch.action_mask.bool()
    assert logp.grad[non_action].abs().max() == 0
    assert logp.grad[batch.action_mask.bool()].abs().max() > 0
    # and the observation tokens are really there: most of each trajectory is context, not action
    assert float(batch.action_mask.sum()) < 0.5 * float(batch.attention_mask.sum())


def test_update_moves_weights_and_sync_reports_changed_codes(tiny_model_dir, episodes):
    learner = Learner(str(tiny_model_dir), SPEC, use_reference=False, lr=5e-3)
    eng = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=2, max_len=64)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    batch = collate(episodes, grpo_advantages(rewards, torch.tensor([t.group_id for t in episodes])))
    learner.fill_old_and_ref(batch)
    obj = make_objective("grpo", kl_coef=0.0)
    batch = batch.weighted(obj.prepare(batch))
    stats = learner.update(batch, obj, epochs=1, minibatch_size=3)
    assert stats["optimizer_steps"] == 2 and stats["grad_norm"] > 0
    sync = eng.update_weights(learner.named_weights(), version=1)
    assert 0.01 < sync.int8_codes_changed < 1.0
    # after the sync, engine and aligned learner still agree on fresh log-probs
    ctx = episodes[0].input_ids[:40]
    tgt = episodes[0].input_ids[40:60]
    eng_lp = torch.tensor(eng.score(ctx, tgt))
    b = PolicyBatch(input_ids=torch.tensor([ctx + tgt]), attention_mask=torch.ones(1, 60, dtype=torch.long),
                    action_mask=(torch.arange(60) >= 40).float().unsqueeze(0), seg_id=torch.zeros(1, 60, dtype=torch.long),
                    rollout_logp=torch.zeros(1, 60), adv=torch.zeros(1))
    assert (learner.logprobs(b)[0, 40:] - eng_lp).abs().max() < 1e-4


def test_checkpoint_round_trip(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    learner = Learner(str(tiny_model_dir), SPEC, use_reference=False)
    learner.save(str(tmp_path / "ckpt"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    for (n, a), (_, b) in zip(learner.model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), n
    assert not list(tmp_path.glob(".ckpt.tmp*"))       # the temporary folder was renamed into place


def test_engine_and_learner_follow_the_specs_module_lists(tiny_model_dir):
    """A spec quantizing attention only (MLP projections ignored): the engine runs the MLP in full
    precision as the aligned learner does, so the two still agree; a spec splitting a fused group
    (q but not k/v), which the engine runs as one GEMM, cannot be made."""
    from transformers import AutoModelForCausalLM

    from agentq.kernels.quant_spec import DEFAULT_IGNORED
    from agentq.learner.learner import sequence_logprobs
    from agentq.learner.qat import align_model

    spec = QuantSpec(kv="none", quantized_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
                     ignored_modules=DEFAULT_IGNORED + ("gate_proj", "up_proj", "down_proj"), name="attn_only")
    eng = TorchEngine.from_pretrained(str(tiny_model_dir), spec, max_slots=2, max_len=64)
    layer = eng.model.decoder_layers[0]
    assert layer.qkv_proj.quantized and layer.o_proj.quantized
    assert not layer.gate_up_proj.quantized and not layer.down_proj.quantized
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    align_model(model, spec)
    ctx, tgt = list(range(5, 25)), list(range(30, 42))
    with torch.no_grad():
        ref = sequence_logprobs(model, torch.tensor([ctx + tgt]), None)[0, len(ctx):]
    assert (torch.tensor(eng.score(ctx, tgt)) - ref).abs().max() <= 1e-5
    # refused when the spec is made (QuantSpec), so the learner and vLLM refuse it as the engine does
    with pytest.raises(ValueError, match=r"quantizes \['q_proj'\] but not all of \['q_proj', 'k_proj', 'v_proj'\]"):
        QuantSpec(kv="none", quantized_modules=("q_proj",),
                  ignored_modules=DEFAULT_IGNORED + ("k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
