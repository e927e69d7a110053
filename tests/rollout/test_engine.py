"""The built-in torch engine against HF teacher forcing, across turns, and its bookkeeping."""
import numpy as np
import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.rollout import SamplingParams, TurnRequest
from agentq.rollout.torch_engine.engine import TorchEngine


def hf_logprobs(model, ids: list[int], start: int) -> torch.Tensor:
    """Teacher-forced fp32 log-probs of ids[start:] given the prefix, from the HF model."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits.float(), -1)[0]
    tgt = torch.tensor(ids[start:])
    return lp[start - 1:-1].gather(-1, tgt[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def engine(path, quant="none", **kw):
    return TorchEngine.from_pretrained(str(path), QuantSpec.preset(quant), max_slots=kw.pop("max_slots", 8),
                                       max_len=kw.pop("max_len", 512), **kw)


def test_unquantized_engine_matches_hf_teacher_forcing(tiny_model_dir, hf_model):
    eng = engine(tiny_model_dir)
    sp = SamplingParams(max_new_tokens=24)
    ctxs = [[5 + (7 * j) % 200 for j in range(30 + 11 * i)] for i in range(3)]
    res = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(ctxs)])
    for c, r in zip(ctxs, res):
        ref = hf_logprobs(hf_model, c + r.token_ids, len(c))
        assert len(r.token_ids) == 24 and r.finish_reason == "length"
        assert (ref - torch.tensor(r.logprobs)).abs().max() < 1e-4


@pytest.mark.parametrize("quant", ["none", "w8a8_kv8"])
def test_delta_prefill_across_turns_equals_full_reprefill(tiny_model_dir, quant):
    """Turn 2 prefills only the new tokens; a fresh engine prefilling the whole context agrees."""
    eng = engine(tiny_model_dir, quant)
    sp = SamplingParams(max_new_tokens=12)
    ctx1 = [5 + (3 * j) % 150 for j in range(40)]
    t1 = eng.generate([TurnRequest(0, ctx1, sp, seed=1)])[0]
    ctx2 = ctx1 + t1.token_ids + [9, 10, 11, 12, 13]          # observation tokens appended
    before = eng.stats["prefill_tokens"]
    t2 = eng.generate([TurnRequest(0, ctx2, sp, seed=1)])[0]
    # only the delta: the turn's last sampled token (never fed through the model) + 5 observation tokens
    assert eng.stats["prefill_tokens"] - before == 1 + 5
    fresh = engine(tiny_model_dir, quant)
    full = fresh.score(ctx2, t2.token_ids)
    assert max(abs(a - b) for a, b in zip(full, t2.logprobs)) < 1e-5
    # and re-scoring turn 1 in one pass gives its decode-time log-probs
    assert max(abs(a - b) for a, b in zip(fresh.score(ctx1, t1.token_ids), t1.logprobs)) < 1e-5


def test_sampling_is_reproducible_per_episode_seed_whatever_the_batch(tiny_model_dir):
    sp = SamplingParams(max_new_tokens=10)
    ctx = [7 + j % 90 for j in range(25)]
    alone = engine(tiny_model_dir).generate([TurnRequest(3, ctx, sp, seed=42)])[0]
    batch = engine(tiny_model_dir).generate([TurnRequest(1, ctx[:9], sp, seed=5), TurnRequest(3, ctx, sp, seed=42)])
    assert batch[1].token_ids == alone.token_ids
    other = engine(tiny_model_dir).generate([TurnRequest(3, ctx, sp, seed=43)])[0]
    assert other.token_ids != alone.token_ids


def test_stop_tokens_end_the_turn_and_are_included(tiny_model_dir):
    eng = engine(tiny_model_dir)
    ctx = [11 + j % 50 for j in range(20)]
    free = eng.generate([TurnRequest(0, ctx, SamplingParams(max_new_tokens=16), seed=0)])[0]
    stop = free.token_ids[3]
    eng.release(0)
    res = eng.generate([TurnRequest(0, ctx, SamplingParams(max_new_tokens=16, stop_token_ids=(stop,)), seed=0)])[0]
    first = free.token_ids.index(stop)
    assert res.finish_reason == "stop" and res.token_ids == free.token_ids[: first + 1]


def test_stop_strings_end_the_turn_at_the_token_that_completes_them(tiny_model_dir, tokenizer):
    eng = engine(tiny_model_dir, tokenizer=tokenizer)
    ctx = [11 + j % 50 for j in range(20)]
    free = eng.generate([TurnRequest(0, ctx, SamplingParams(max_new_tokens=16), seed=0)])[0]
    eng.release(0)
    stop = tokenizer.decode(free.token_ids[4:6])[-3:]      # text straddling tokens 4-5 (or inside 5)
    # independently: the first prefix whose full decoding contains the stop text
    end = next(j for j in range(1, 17) if stop in tokenizer.decode(free.token_ids[:j]))
    res = eng.generate([TurnRequest(0, ctx, SamplingParams(max_new_tokens=16, stop=(stop,)), seed=0)])[0]
    assert res.finish_reason == "stop_string" and end <= 6
    assert res.token_ids == free.token_ids[:end] and res.logprobs == free.logprobs[:end]
    with pytest.raises(ValueError, match="tokenizer"):
        engine(tiny_model_dir).generate([TurnRequest(0, ctx, SamplingParams(stop=("x",)), seed=0)])


def test_top_k_top_p_logprobs_are_those_of_the_truncated_distribution():
    from agentq.rollout.torch_engine.sampler import processed_logprobs

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lp = processed_logprobs(logits, SamplingParams(top_k=2)).exp()
    torch.testing.assert_close(lp, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    lp = processed_logprobs(logits, SamplingParams(top_p=0.7)).exp()   # keeps 0.5 + 0.3 (mass ≥ 0.7)
    torch.testing.assert_close(lp, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    lp = processed_logprobs(logits, SamplingParams(temperature=2.0)).exp()
    p = torch.tensor([0.5, 0.3, 0.15, 0.05]).sqrt()
    torch.testing.assert_close(lp, (p / p.sum())[None])


def test_weight_sync_requantizes_and_invalidates_cached_kv(tiny_model_dir, hf_model):
    eng = engine(tiny_model_dir, "w8a8_kv8")
    sp = SamplingParams(max_new_tokens=4)
    ctx = [5 + j % 60 for j in range(30)]
    eng.generate([TurnRequest(0, ctx, sp, seed=0)])
    sd = {k: v.clone() for k, v in hf_model.state_dict().items()}
    stats = eng.update_weights(sd.items(), version=1)
    assert stats.int8_codes_changed == 0.0 and stats.version == 1
    q = "model.layers.0.self_attn.q_proj.weight"
    sd[q][0] *= 1.5            # per-channel symmetric int8 is scale invariant: no code changes
    assert eng.update_weights(sd.items(), version=2).int8_codes_changed == 0.0
    sd[q][0, :16] += 0.02      # a perturbation changes codes of that one output channel only
    stats = eng.update_weights(sd.items(), version=2)
    n_codes = sum(v.numel() for k, v in sd.items() if k.endswith("proj.weight"))
    assert 0 < stats.int8_codes_changed <= sd[q].shape[1] / n_codes
    # the cached context was computed with old weights: the next turn re-prefills it
    before = eng.stats["prefill_tokens"]
    r = eng.generate([TurnRequest(0, ctx, sp, seed=0)])[0]
    assert eng.stats["prefill_tokens"] - before == len(ctx) and r.policy_version == 2


def _last_as(name: str, bad):
    """A weight set whose tensor `name`, moved to the end, is replaced by bad(tensor)."""
    def make(new: dict) -> list:
        w = new.pop(name)
        return [*new.items(), (name, bad(w))]
    return make


SHAPE = "the engine takes a floating-point tensor of shape"


@pytest.mark.parametrize("weight_set, error, match", [
    (lambda new: [(k, v) for k, v in new.items() if k != "model.norm.weight"], KeyError, "missing"),
    (lambda new: [*new.items(), ("model.extra.weight", torch.ones(2))], KeyError,
     "no parameter for 'model.extra.weight'"),
    # `copy_` broadcasts: these loaded without a word, into every row / channel
    (_last_as("model.norm.weight", lambda w: w[:1]), ValueError, "model.norm.weight: " + SHAPE),
    (_last_as("model.embed_tokens.weight", lambda w: w[:1]), ValueError, "model.embed_tokens.weight: " + SHAPE),
    (_last_as("model.layers.1.self_attn.q_proj.weight", lambda w: w[:1]), ValueError, "q_proj.weight: " + SHAPE),
    # and these failed part-way (transposed) or loaded converted (integers)
    (_last_as("model.layers.0.mlp.down_proj.weight", lambda w: w.T.contiguous()), ValueError, "down_proj.weight: " + SHAPE),
    (_last_as("model.layers.0.input_layernorm.weight", lambda w: w.round().long()), ValueError, "torch.int64"),
])
def test_a_weight_set_refused_for_its_names_or_shapes_changes_nothing(tiny_model_dir, hf_model, weight_set, error,
                                                                       match):
    """Names, shapes and dtypes are checked before anything is copied: the engine plays on unchanged."""
    eng = engine(tiny_model_dir, "w8a8_kv8")
    sp = SamplingParams(max_new_tokens=4)
    ctx = [5 + j % 60 for j in range(30)]
    first = eng.generate([TurnRequest(0, ctx, sp, seed=0)])[0]
    embed = eng.model.embed_tokens.weight.clone()
    new = {k: v.clone() * 1.7 for k, v in hf_model.state_dict().items()}
    with pytest.raises(error, match=match):
        eng.update_weights(weight_set(new), version=1)
    # the old weights and version stand, the turn replays
    assert torch.equal(eng.model.embed_tokens.weight, embed) and eng.policy_version == 0
    eng.release(0)
    again = eng.generate([TurnRequest(0, ctx, sp, seed=0)])[0]
    assert again.token_ids == first.token_ids and again.logprobs == first.logprobs and again.policy_version == 0


def test_a_weight_load_that_fails_part_way_stops_generation_until_a_full_load(tiny_model_dir, hf_model):
    eng = engine(tiny_model_dir)
    sp = SamplingParams(max_new_tokens=2)
    eng.generate([TurnRequest(0, [5, 6, 7], sp, seed=0)])
    sd = dict(hf_model.state_dict())
    # names and shapes check out, but the last tensor has no data to copy (as a device error would
    # strike mid-load): a part-way load
    bad = {**sd, "model.norm.weight": torch.ones(sd["model.norm.weight"].shape, device="meta")}
    with pytest.raises(RuntimeError):
        eng.update_weights(bad.items(), version=1)
    with pytest.raises(RuntimeError, match="failed part-way"):
        eng.generate([TurnRequest(0, [5, 6, 7], sp, seed=0)])
    with pytest.raises(RuntimeError, match="failed part-way"):
        eng.score([5, 6], [7])
    eng.update_weights(sd.items(), version=2)
    r = eng.generate([TurnRequest(0, [5, 6, 7], sp, seed=0)])[0]
    assert r.policy_version == 2 and len(r.token_ids) == 2


@pytest.mark.parametrize("quant, per_token, int8_hint", [("none", 2 * 2 * 2 * 64 * 2, True),
                                                         ("w8a8_kv8", 2 * 2 * 2 * (64 + 4), False)])
def test_a_kv_cache_that_does_not_fit_says_what_it_needs(tiny_model_dir, monkeypatch, quant, per_token, int8_hint):
    """A device out-of-memory error while allocating the cache (faked: a CPU allocation cannot raise
    CUDA's error) comes back with the bytes it needed and the settings that set them."""
    real_zeros = torch.zeros

    def zeros(*args, **kwargs):         # the cache's [slots, kv heads, max_len, head_dim] codes do not fit
        if isinstance(args[0], tuple) and len(args[0]) == 4 and args[0][2] == 65536:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB.")
        return real_zeros(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch, "zeros", zeros)
        with pytest.raises(torch.OutOfMemoryError) as err:
            engine(tiny_model_dir, quant, dtype=torch.bfloat16, max_slots=4096, max_len=65536)
    text = str(err.value)
    gib = 4097 * 65536 * per_token / 2 ** 30          # one slot more than max_slots: the padding rows' slot
    assert text.startswith("CUDA out of memory") and f"needs {gib:.1f} GiB ({per_token} bytes a token" in text
    assert "rollout.max_slots" in text and "env.max_context_tokens" in text
    assert ("rollout=w8a8_kv8" in text) is int8_hint


def test_kv_cache_int8_is_at_most_0_52x_of_bf16(tiny_model_dir):
    bf16 = engine(tiny_model_dir, "none", dtype=torch.bfloat16).kv_bytes_per_token()
    int8 = engine(tiny_model_dir, "w8a8_kv8").kv_bytes_per_token()
    # 2 layers · 2 KV heads · 64 dims · (K, V): bf16 2 bytes; int8 1 byte + 4 bytes of scale per head
    assert bf16 == 2 * 2 * 2 * 64 * 2 and int8 == 2 * 2 * 2 * (64 + 4)
    assert int8 / bf16 <= 0.54      # 0.531 at head_dim 64; 0.516 at head_dim 128 (8B-class models)
    eng = engine(tiny_model_dir, "w8a8_kv8")
    d128 = 2 * (128 + 4) / (2 * 128 * 2)
    assert d128 <= 0.52 and eng.cache.k[0].dtype == torch.int8 and eng.cache.k_scale[0].dtype == torch.float32


def test_errors_are_clear(tiny_model_dir):
    eng = engine(tiny_model_dir, max_slots=1, max_len=64)
    sp = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="context budget"):
        eng.generate([TurnRequest(0, list(range(5, 70)), sp)])
    eng.generate([TurnRequest(1, [5, 6, 7], sp)])
    with pytest.raises(RuntimeError, match="0 of 1 are free"):
        eng.generate([TurnRequest(2, [5, 6, 7], sp)])
    with pytest.raises(ValueError, match="non-empty context"):
        eng.score([], [5])
    vocab = eng.model.config.vocab_size
    with pytest.raises(ValueError, match=rf"in \[0, {vocab}\)"):
        eng.score([5, 6], [vocab])
    with pytest.raises(ValueError, match="does not fit max_len=64"):
        eng.score(list(range(5, 60)), list(range(5, 15)))
    assert eng.score([5, 6], []) == []
    with pytest.raises(ValueError, match="prefill_chunk must be ≥ 1"):
        engine(tiny_model_dir, prefill_chunk=0)


def test_a_refused_batch_takes_no_slot_and_draws_nothing(tiny_model_dir, tokenizer):
    eng = engine(tiny_model_dir, max_slots=2)
    sp = SamplingParams(max_new_tokens=4)
    with pytest.raises(RuntimeError, match="3 new episodes need KV slots and 2 of 2 are free"):
        eng.generate([TurnRequest(e, [5, 6, 7], sp, seed=e) for e in range(3)])
    with pytest.raises(ValueError, match="tokenizer"):
        eng.generate([TurnRequest(0, [5, 6, 7], SamplingParams(max_new_tokens=4, stop=("x",)), seed=0)])
    assert eng._slot_of == {} and eng.stats["prefill_tokens"] == 0
    # nothing was taken or drawn: the episodes play as on a fresh engine
    fresh = engine(tiny_model_dir, max_slots=2).generate([TurnRequest(e, [5, 6, 7], sp, seed=e) for e in range(2)])
    again = eng.generate([TurnRequest(e, [5, 6, 7], sp, seed=e) for e in range(2)])
    assert [r.token_ids for r in again] == [r.token_ids for r in fresh]


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=float("nan")), "temperature must be finite"),   # read as temperature 1 before
    (dict(temperature=float("inf")), "temperature must be finite"),   # a uniform draw
    (dict(top_k=-2), "top_k must be an int"),                          # truncation silently off
    (dict(top_k=2.5), "top_k must be an int"),                         # torch.topk's TypeError mid-turn
    (dict(max_new_tokens=2.5), "max_new_tokens must be an int"),       # 3 tokens
    (dict(max_new_tokens=True), "max_new_tokens must be an int"),
])
def test_sampling_params_the_samplers_would_misread_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_top_k_0_is_no_truncation_like_minus_1(tiny_model_dir):
    """vLLM's convention, which its backend maps to: top_k 0 and -1 both keep the whole vocabulary."""
    ctx = [11 + j % 50 for j in range(20)]
    a, b = (engine(tiny_model_dir).generate([TurnRequest(0, ctx, SamplingParams(max_new_tokens=8, top_k=k), seed=3)])[0]
            for k in (0, -1))
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


@pytest.mark.parametrize("seed", [1.5, 2 ** 63, -2 ** 63 - 1, "7"])
def test_a_seed_the_samplers_cannot_take_is_refused_before_a_slot_is_taken(tiny_model_dir, seed):
    """A float or a seed beyond 64 bits failed inside generate(), after the episode took its KV slot."""
    eng = engine(tiny_model_dir, max_slots=1)
    with pytest.raises(ValueError, match="seed must be a 64-bit signed int"):
        eng.generate([TurnRequest(0, [5, 6, 7], SamplingParams(max_new_tokens=2), seed=seed)])
    assert eng._slot_of == {} and len(eng._free) == 1
    for ok in (2 ** 63 - 1, -2 ** 63):        # the ends of the range both samplers take
        r = eng.generate([TurnRequest(1, [5, 6, 7], SamplingParams(max_new_tokens=2), seed=ok)])[0]
        assert len(r.token_ids) == 2
        eng.release(1)


def test_score_leaves_an_episode_of_a_negative_id_alone(tiny_model_dir):
    """score() borrowed a slot under a negative scratch episode id (-1 first): an episode with that id
    lost its slot, its cached K/V and its sampler (the next turn replayed its seed's first draws)."""
    sp = SamplingParams(max_new_tokens=6)
    ctx = [7 + j % 90 for j in range(25)]
    runs = []
    for scoring in (False, True):
        eng = engine(tiny_model_dir)
        t1 = eng.generate([TurnRequest(-1, ctx, sp, seed=9)])[0]
        if scoring:
            assert len(eng.score(ctx[:10], ctx[10:14])) == 4
        before = eng.stats["prefill_tokens"]
        t2 = eng.generate([TurnRequest(-1, ctx + t1.token_ids + [21, 22], sp, seed=9)])[0]
        runs.append((t1.token_ids, t2.token_ids, t2.logprobs, eng.stats["prefill_tokens"] - before))
    assert runs[1] == runs[0] and runs[0][3] == 1 + 2     # turn 2 prefilled only its delta, both times


@pytest.mark.parametrize("bad, match", [
    (lambda sp: [TurnRequest(0, [5, 6], sp), TurnRequest(0, [5, 6, 7], sp)], "two requests for the same episode"),
    (lambda sp: [TurnRequest(0, [5, 6], sp), TurnRequest(1, [5, 6], SamplingParams(max_new_tokens=3))],
     "must share SamplingParams"),
    (lambda sp: [TurnRequest(0, [5, 6], sp), TurnRequest(1, [], sp)], "must be non-empty"),
    (lambda sp: [TurnRequest(0, [5, 6], sp), TurnRequest(1, [5, 448], sp)], r"in \[0, 448\)"),
    (lambda sp: [TurnRequest(0, [5, 6], sp), TurnRequest(1, [-1, 6], sp)], r"in \[0, 448\)"),
])
def test_a_malformed_batch_is_refused_before_any_state_changes(tiny_model_dir, bad, match):
    eng = engine(tiny_model_dir, max_slots=2)
    sp = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match=match):
        eng.generate(bad(sp))
    assert eng._slot_of == {} and len(eng._free) == 2 and eng.stats["prefill_tokens"] == 0


@pytest.mark.parametrize("ctx, message", [
    # a float, whole or not, was cast to an int by the prefill (5.0 and 5.7 both played token 5)
    ([5, 6, 5.0], "episode 7: context id at position 2 is 5.0; token ids must be ints in [0, 448)"),
    ([5.7, 6, 7], "episode 7: context id at position 0 is 5.7; token ids must be ints in [0, 448)"),
    ([5, True, 7], "episode 7: context id at position 1 is True; token ids must be ints in [0, 448)"),
    ([5, 6, np.float64(7)],
     "episode 7: context id at position 2 is np.float64(7.0); token ids must be ints in [0, 448)"),
    (torch.tensor([5.0, 6.0]), "episode 7: context id at position 0 is tensor(5.); token ids must be ints in [0, 448)"),
    ([5, 6, 448], "episode 7: context id at position 2 is 448; token ids must be ints in [0, 448)"),
    ([5, -1, 6], "episode 7: context id at position 1 is -1; token ids must be ints in [0, 448)"),
])
def test_a_context_id_that_is_not_a_token_id_is_refused_by_position(tiny_model_dir, ctx, message):
    eng = engine(tiny_model_dir, max_slots=2)
    sp = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError) as err:
        eng.generate([TurnRequest(0, [5, 6], sp), TurnRequest(7, ctx, sp)])
    assert str(err.value) == message
    assert eng._slot_of == {} and len(eng._free) == 2 and eng.stats["prefill_tokens"] == 0


def test_numpy_int_context_ids_play_as_python_ints(tiny_model_dir):
    sp = SamplingParams(max_new_tokens=4)
    ctx = [5, 6, 7, 8]
    ref = engine(tiny_model_dir).generate([TurnRequest(0, ctx, sp, seed=3)])[0]
    for as_numpy in ([np.int64(x) for x in ctx], [np.int32(x) for x in ctx], np.array(ctx)):
        got = engine(tiny_model_dir).generate([TurnRequest(0, as_numpy, sp, seed=3)])[0]
        assert got.token_ids == ref.token_ids and got.logprobs == ref.logprobs


def test_score_refuses_an_id_that_is_not_a_token_id_by_position(tiny_model_dir):
    eng = engine(tiny_model_dir)
    with pytest.raises(ValueError) as err:
        eng.score([5, 6], [7, 8.0])
    assert str(err.value) == ("score(): token id at position 3 of context + target is 8.0; "
                              "token ids must be ints in [0, 448)")
    assert len(eng.score([5, np.int64(6)], [7, 8])) == 2


def test_slots_come_back_over_many_episodes_and_scores(tiny_model_dir):
    """Two slots serve twenty episodes played and released in turn, with a score() in between."""
    eng = engine(tiny_model_dir, max_slots=2, max_len=64)
    sp = SamplingParams(max_new_tokens=3)
    for e in range(0, 20, 2):
        res = eng.generate([TurnRequest(e, [5, 6, 7 + e], sp, seed=e), TurnRequest(e + 1, [8, 9], sp, seed=e)])
        assert [len(r.token_ids) for r in res] == [3, 3]
        with pytest.raises(RuntimeError, match="all 2 KV slots are in use"):
            eng.score([5, 6], [7])
        eng.release(e)
        assert len(eng.score([5, 6], [7])) == 1
        eng.release(e + 1)
    assert sorted(eng._free) == [0, 1] and not eng._slot_of and not eng._cached and not eng._generators


@pytest.mark.parametrize("sampler", ["generator", "counter"])
def test_an_episode_plays_the_same_turns_alone_and_in_any_batch(tiny_model_dir, sampler):
    """Three turns of episode 0 (seed fixed): alone, and among five others (one with its very context
    and another seed, the rest of other lengths), in another request order, slot and prefill chunking.
    Truncated sampling and stop tokens included: the other rows stop at other steps."""
    sp = SamplingParams(max_new_tokens=10, temperature=0.8, top_k=40, top_p=0.95, stop_token_ids=(76, 330))
    target = [7 + (5 * j) % 90 for j in range(33)]
    others = {i: [9 + (3 * j + i) % 80 for j in range(10 + 13 * i)] for i in range(1, 5)}
    others[5] = list(target)

    def play(eng, contexts):
        ctx, turns = dict(contexts), []
        for _ in range(3):
            for r in eng.generate([TurnRequest(e, c, sp, seed=1000 + e) for e, c in ctx.items()]):
                ctx[r.episode_id] = ctx[r.episode_id] + r.token_ids + [20, 21]
                if r.episode_id == 0:
                    turns.append((r.token_ids, r.finish_reason))
        return turns

    alone = play(engine(tiny_model_dir, sampler=sampler), {0: target})
    first = play(engine(tiny_model_dir, sampler=sampler), {**others, 0: target})
    last = play(engine(tiny_model_dir, sampler=sampler, share_prefill=False, prefill_chunk=7), {0: target, **others})
    assert alone == first == last and sum(len(t) for t, _ in alone) > 6


def test_a_plain_string_is_one_stop_string():
    assert SamplingParams(stop="</action>").stop == ("</action>",)
    assert SamplingParams(stop=["a", "b"], stop_token_ids=[3]) == SamplingParams(stop=("a", "b"), stop_token_ids=(3,))


def test_stop_strings_of_multibyte_characters_are_found(tiny_model_dir, tokenizer):
    """A byte-level BPE spells '→' (3 UTF-8 bytes) with up to 3 tokens: the decoded window must
    span the stop string's bytes, not its characters."""
    eng = engine(tiny_model_dir, tokenizer=tokenizer)
    ids = tokenizer.encode("xy→zzzz")
    for stop in ("→", "y→", "→z"):
        # independently: the first prefix whose decoding contains the stop text
        end = next(j for j in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:j]))
        found = [j for j in range(1, len(ids) + 1) if eng._ends_with_stop_string(ids[:j], (stop,))]
        assert found and found[0] == end, (stop, ids, found, end)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3_attention_bias"])
def test_other_families_match_hf(family, tmp_path):
    """Llama (no q/k-norm), Qwen2 (q/k/v biases) and Qwen3 with `attention_bias` (q/k/v and o
    biases): random-init HF models, engine vs HF, fp32."""
    import transformers

    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3_attention_bias": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[family]
    extra = {"attention_bias": True} if family == "qwen3_attention_bias" else {}
    cfg = cls[0](vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    model = cls[1](cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)                    # HF zero-inits biases: make the test see them
    model.save_pretrained(tmp_path)
    eng = TorchEngine.from_pretrained(str(tmp_path), QuantSpec.preset("none"), max_slots=2, max_len=128)
    ctx = [3 + (5 * j) % 300 for j in range(20)]
    r = eng.generate([TurnRequest(0, ctx, SamplingParams(max_new_tokens=10), seed=0)])[0]
    ref = hf_logprobs(model, ctx + r.token_ids, len(ctx))
    assert (ref - torch.tensor(r.logprobs)).abs().max() < 1e-4
    w8 = TorchEngine.from_pretrained(str(tmp_path), QuantSpec.preset("w8a8_kv8"), max_slots=2, max_len=128)
    assert w8.model.audit["quantized"][:3] == ["layers.0.q_proj", "layers.0.k_proj", "layers.0.v_proj"]


@pytest.mark.parametrize("quant", ["none", "w8a8_kv8"])
def test_prefill_writes_the_same_cache_with_and_without_padding(quant):
    """A chunk whose tokens are all valid is written from the projection rows as they lie (no
    gather); a padded chunk gathers its valid tokens. Both address every token the same way: the
    cache holds the same K/V whichever way a row's tokens arrive."""
    from agentq.rollout.torch_engine.kv_cache import KVCache
    from agentq.rollout.torch_engine.model import ForwardContext

    g = torch.Generator().manual_seed(0)
    b, t, hkv, d = 3, 5, 2, 8
    k = torch.randn(b, t, hkv, d, generator=g).permute(0, 2, 1, 3)          # [B, Hkv, T, D], strided like the engine's
    slots, starts = torch.tensor([4, 0, 2]), torch.tensor([0, 7, 3])
    positions = starts[:, None] + torch.arange(t)[None, :]

    def write(valid):
        cache = KVCache(1, 5, hkv, 16, d, QuantSpec.preset(quant), torch.float32)
        ctx = ForwardContext(cache, slots, positions, valid, starts + valid.sum(1), allow_decode_kernel=False)
        cache.write(0, *ctx.write_addresses, ctx.new_tokens(k), ctx.new_tokens(k))
        return ctx, cache

    full_ctx, full = write(torch.ones(b, t, dtype=torch.bool))
    assert full_ctx.all_valid and full_ctx.new_tokens(k).data_ptr() == k.data_ptr()    # a view, no gather
    padded = torch.ones(b, t, dtype=torch.bool)
    padded[1, 3:] = False
    part_ctx, part = write(padded)
    assert not part_ctx.all_valid and part_ctx.new_tokens(k).shape[0] == b * t - 2
    for row in range(b):                                          # every written token equal in both caches
        for j in range(t if row != 1 else 3):
            s, p = int(slots[row]), int(positions[row, j])
            assert torch.equal(full.k[0][s, :, p], part.k[0][s, :, p])
    assert torch.equal(part.k[0][0, :, 10:12], torch.zeros_like(part.k[0][0, :, 10:12]))   # the padding: not written
    if quant == "none":                                           # row 0's token 2 at slot 4, position 2
        assert torch.equal(full.k[0][4, :, 2], k[0, :, 2])


@pytest.mark.parametrize("quant", ["none", "w8a8_kv8"])
def test_cache_reads_are_views_for_consecutive_slots_and_gathers_otherwise(quant):
    """`KVCache.read` on a CPU: consecutive slots come back as views of the cache (values) or
    dequantized from views (codes), any other order through `index_select`; every way equals the
    advanced-indexing reference, and the codes are left as they were."""
    from agentq.rollout.torch_engine.kv_cache import KVCache

    g = torch.Generator().manual_seed(1)
    cache = KVCache(2, 6, 2, 16, 8, QuantSpec.preset(quant), torch.float32)
    slots_all = torch.arange(6).repeat_interleave(16)
    pos_all = torch.arange(16).repeat(6)
    for layer in range(2):
        kv = torch.randn(2, 96, 2, 8, generator=g)
        cache.write(layer, slots_all, pos_all, kv[0], kv[1])
    codes_before = [t.clone() for t in cache.k]

    def reference(layer, slots, length):
        k = cache.k[layer][slots, :, :length]
        if quant == "none":
            return k
        return (k.float() * cache.k_scale[layer][slots, :, :length].unsqueeze(-1)).to(torch.float32)

    for slots in ([1, 2, 3], [0, 1, 2, 3, 4, 5], [3], [4, 2, 0], [3, 2, 1], [0, 2, 3]):
        st = torch.tensor(slots)
        run = cache._run(st)
        assert (run is not None) == (slots == list(range(slots[0], slots[0] + len(slots))))
        for layer in range(2):
            k, _ = cache.read(layer, st, 11)
            assert torch.equal(k, reference(layer, st, 11)), (slots, layer)
            if quant == "none":     # values: a view exactly when consecutive
                assert (k.untyped_storage().data_ptr() == cache.k[layer].untyped_storage().data_ptr()) == (run is not None)
    assert all(torch.equal(a, b) for a, b in zip(cache.k, codes_before))


def test_episodes_take_the_lowest_free_slots(tiny_model_dir):
    """A batch of episodes started together holds consecutive slots (read as views on a CPU), also
    after earlier episodes released theirs in another order."""
    eng = TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=6, max_len=64)
    assert [eng._slot(e) for e in range(4)] == [0, 1, 2, 3]
    for e in (2, 0, 3):
        eng.release(e)
    assert [eng._slot(e) for e in (10, 11, 12, 13)] == [0, 2, 3, 4]


def _turns(eng, contexts: dict[int, list[int]], turns: int = 2):
    """Play `turns` turns of every episode (context + sampled tokens + 3 observation tokens each)."""
    sp = SamplingParams(max_new_tokens=6)
    ctx, out = dict(contexts), []
    for _ in range(turns):
        res = eng.generate([TurnRequest(e, c, sp, seed=100 + e) for e, c in ctx.items()])
        out.append(res)
        ctx = {r.episode_id: ctx[r.episode_id] + r.token_ids + [21, 22, 23] for r in res}
    return out


def _same_results(a, b, tol):
    for ta, tb in zip(a, b):
        for x, y in zip(ta, tb):
            assert x.token_ids == y.token_ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) <= tol


@pytest.mark.parametrize("quant,sampler", [("none", "generator"), ("w8a8_kv8", "generator"), ("w8a8_kv8", "counter")])
def test_identical_new_contexts_prefill_once_and_play_as_if_each_had(tiny_model_dir, quant, sampler):
    """A GRPO group's first turn: episodes 0-2 share a context, 3 has its own. With share_prefill the
    group's context is prefilled once and copied into the other two slots (codes and scales bit for
    bit); every episode then samples with its own seed, in this turn and the next (delta prefill), as
    it does when each prefills its own context."""
    group = [5 + (7 * j) % 150 for j in range(50)]
    contexts = {0: group, 1: group, 2: group, 3: [9 + (5 * j) % 120 for j in range(37)]}
    shared = engine(tiny_model_dir, quant, sampler=sampler)
    plain = engine(tiny_model_dir, quant, sampler=sampler, share_prefill=False)
    a, b = _turns(shared, contexts), _turns(plain, contexts)
    # W8A8's int8 linears and the KV codes are exact in any batch, but the LM head stays an fp32
    # GEMM, and some CPU BLAS kernels sum it in an order that depends on the rows in the call (one
    # prefill of the group's context vs three): 1 ulp of the log-prob on an AMD EPYC, 0 on Xeons
    _same_results(a, b, tol=1e-5 if quant == "none" else 2e-6)
    first_turn = 50 + 37
    later_turn = 4 * (1 + 3)                  # each row's last sampled token + 3 observation tokens
    assert plain.stats["prefill_tokens"] == 3 * 50 + 37 + later_turn
    assert shared.stats["prefill_tokens"] == first_turn + later_turn
    assert shared.stats["shared_tokens"] == 2 * 50 and plain.stats["shared_tokens"] == 0
    # the trainer's per-step counts: every context token of both turns either computed or cached
    fed = sum(len(c) for c in contexts.values()) + sum(len(c) + 6 + 3 for c in contexts.values())
    counts = {e: e.prefill_counts() for e in (shared, plain)}
    for c in counts.values():
        assert c["prefill_computed_tokens"] + c["prefill_cached_tokens"] == fed
    assert counts[shared]["prefill_cached_tokens"] - counts[plain]["prefill_cached_tokens"] == 2 * 50
    toks = [tuple(r.token_ids) for r in a[0][:3]]
    assert len(set(toks)) == 3                 # own seeds: the copies do not replay the first row's draw
    c, s = shared.cache, shared._slot_of
    for layer in range(c.n_layers):            # the copied K/V of the turn-1 context: the same bits
        for t in (c.k, c.v) + ((c.k_scale, c.v_scale) if c.k_scale is not None else ()):
            for e in (1, 2):
                assert torch.equal(t[layer][s[e], :, :50], t[layer][s[0], :, :50])


@pytest.mark.parametrize("quant", ["none", "w8a8_kv8"])
def test_a_prefix_common_to_new_contexts_is_prefilled_once(tiny_model_dir, quant):
    """New contexts sharing a system prompt of >= SHARE_MIN_TOKENS tokens: it is prefilled once and
    copied; each row prefills only its own tail. Shorter common prefixes are not worth the extra
    forward and are prefilled row by row."""
    from agentq.rollout.torch_engine.engine import SHARE_MIN_TOKENS

    system = [4 + (11 * j) % 140 for j in range(SHARE_MIN_TOKENS + 16)]
    tails = {e: [30 + e + (3 * j) % 50 for j in range(10 + 5 * e)] for e in range(3)}
    contexts = {e: system + t for e, t in tails.items()}
    shared = engine(tiny_model_dir, quant)
    plain = engine(tiny_model_dir, quant, share_prefill=False)
    _same_results(_turns(shared, contexts, 1), _turns(plain, contexts, 1), tol=1e-5 if quant == "none" else 0.0)
    n = len(system)
    assert shared.stats["prefill_tokens"] == n + sum(map(len, tails.values()))
    assert shared.stats["shared_tokens"] == 2 * n and shared.stats["reused_tokens"] == 0
    assert plain.stats["prefill_tokens"] == sum(map(len, contexts.values()))

    short = {e: system[: SHARE_MIN_TOKENS - 1] + t for e, t in tails.items()}
    eng = engine(tiny_model_dir, quant)
    _turns(eng, short, 1)
    assert eng.stats["shared_tokens"] == 0 and eng.stats["prefill_tokens"] == sum(map(len, short.values()))


@pytest.mark.parametrize("kw", [dict(max_slots=0), dict(max_len=0), dict(max_slots=2.0), dict(max_len=True)])
def test_an_engine_without_a_slot_or_a_position_is_refused_when_built(tiny_model_dir, kw):
    """max_slots=0 or max_len=0 built an engine that failed only at its first turn."""
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"rollout engine {name} must be an int ≥ 1, got {kw[name]!r}"):
        engine(tiny_model_dir, **kw)


def test_a_folder_of_pytorch_model_bin_only_is_a_checkpoint_error(tmp_path, tiny_model_dir):
    """The engine reads safetensors only (no pickles): such a folder was a bare FileNotFoundError."""
    from agentq.utils.checkpoint import CheckpointError

    for f in tiny_model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match=rf"^no \*.safetensors weights in {tmp_path}: the rollout backends load "
                                              r"the model from its safetensors weights; save it with save_pretrained"):
        TorchEngine.from_pretrained(str(tmp_path), QuantSpec.preset("none"), max_slots=1, max_len=64)


@pytest.mark.parametrize("quant", ["none", "w8a8_kv8", "w8a8_fp8kv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_reads_in_a_reuse_scope_equal_fresh_reads_and_reuse_their_buffers(quant, dtype):
    """A CPU read, inside `KVCache.reuse_reads` or not, gives `quant.dequantize_rows`'s values of the
    cached codes (in the cache's dtype, and converted to the attention's or fp64, the no-grad
    attention's dtype of an fp32 model; a bf16 cache rounds to bf16 first), for consecutive and
    gathered slots; inside the scope in buffers kept for it: reads one token longer than the last
    (a decode step) allocate nothing. The buffers go when the scope ends."""
    from agentq.kernels import quant as q
    from agentq.kernels.attention import attention_accum_dtype
    from agentq.rollout.torch_engine.kv_cache import KVCache

    g = torch.Generator().manual_seed(2)
    cache = KVCache(2, 6, 2, 40, 8, QuantSpec.preset(quant), dtype)
    cache.fp8_k_scale = [0.37, 1.0]          # a per-tensor scale other than 1 multiplies the fp8 codes
    slots_all, pos_all = torch.arange(6).repeat_interleave(40), torch.arange(40).repeat(6)
    for layer in range(2):
        kv = torch.randn(2, 240, 2, 8, generator=g).to(dtype)
        cache.write(layer, slots_all, pos_all, kv[0], kv[1])

    def expected(layer, st, n, dt):          # from the stored codes, by the quantization module
        out = []
        for codes, scales, s8 in ((cache.k, cache.k_scale, cache.fp8_k_scale), (cache.v, cache.v_scale, cache.fp8_v_scale)):
            c = codes[layer][st, :, :n]
            if scales is not None:
                x = q.dequantize_rows(c, scales[layer][st, :, :n], dtype)
            elif quant == "w8a8_fp8kv":
                x = (c.float() * s8[layer]).to(dtype)
            else:
                x = c
            out.append(x.to(dt))
        return out

    acc = attention_accum_dtype(dtype, torch.device("cpu"))
    for slots in ([1, 2, 3], [4, 2, 0]):
        st = torch.tensor(slots)
        cases = [(layer, n, dt) for layer in range(2) for n in (20, 21, 22) for dt in {dtype, acc, torch.float64}]
        for layer, n, dt in cases:
            k, v = cache.read(layer, st, n, dt)
            k_ref, v_ref = expected(layer, st, n, dt)
            assert k.dtype == v.dtype == dt and torch.equal(k, k_ref) and torch.equal(v, v_ref), (slots, layer, n, dt)
        with cache.reuse_reads():
            for layer, n, dt in cases:
                k, v = cache.read(layer, st, n, dt)
                k_ref, v_ref = expected(layer, st, n, dt)
                assert k.dtype == v.dtype == dt and torch.equal(k, k_ref) and torch.equal(v, v_ref), (slots, layer, n, dt)
            if quant != "none":                                  # dequantized: into the scope's buffers
                ptrs = {cache.read(layer, st, n, acc)[0].data_ptr() for layer in range(2) for n in (20, 21, 22)}
                assert len(ptrs) == 1
        assert cache._workspace == {}


def test_a_turns_decode_steps_reuse_the_cache_read_buffers(tiny_model_dir, monkeypatch):
    """`generate` reads the CPU cache into buffers kept for the call: its decode steps, each one
    token longer, do not allocate a new K/V copy of the context (they did: every step mapped and
    page-faulted a few context-sized tensors, which cost more system time than the step's compute
    on long ALFWorld episodes). Same tokens and log-probs as fresh reads."""
    import contextlib

    from agentq.rollout.torch_engine.kv_cache import KVCache

    read, kept = KVCache.read, []

    def spy(self, *a, **kw):                # keeps every result alive: fresh tensors never share an address
        k, v = read(self, *a, **kw)
        kept.append(k)
        return k, v

    def play():
        eng = engine(tiny_model_dir, "w8a8_kv8", max_slots=4)
        ctx = {e: [3 + (7 * j + e) % 300 for j in range(90 + e)] for e in range(3)}
        out = []
        for _ in range(2):
            res = eng.generate([TurnRequest(e, c, SamplingParams(max_new_tokens=16), seed=e) for e, c in ctx.items()])
            out += [(r.token_ids, r.logprobs) for r in res]
            ctx = {r.episode_id: ctx[r.episode_id] + r.token_ids + [5, 6] for r in res}
        return out

    monkeypatch.setattr(KVCache, "read", spy)
    reused = play()
    reads, ptrs = len(kept), {k.data_ptr() for k in kept}
    assert reads >= 2 * 2 * 16 and len(ptrs) <= 2 * 2       # 2 turns x 2 layers x (prefill + 15 steps); ≤ 2 buffers a turn
    kept.clear()
    monkeypatch.setattr(KVCache, "reuse_reads", lambda self: contextlib.nullcontext())
    assert play() == reused
