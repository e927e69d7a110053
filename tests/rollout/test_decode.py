"""Fused decode steps and the counter-based sampler (CPU; the CUDA-graph replay is checked in
test_engine_cuda.py on a GPU)."""
import math

import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.rollout import SamplingParams, TurnRequest
from agentq.rollout.backend import load_safetensors_dir
from agentq.rollout.torch_engine.decode import bucket_sizes
from agentq.rollout.torch_engine.engine import TorchEngine
from agentq.rollout.torch_engine.sampler import counter_uniform, hash32, row_keys, sample_counter, vocab_keys
from conftest import NEEDS_INTERPRETED_LOOP_BOUNDS


def _hash32_py(x: int) -> int:
    """Independent pure-Python lowbias32 (Python ints, explicit mod 2³²)."""
    m = 0xFFFFFFFF
    x &= m
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def test_hash32_equals_pure_python_reference():
    xs = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 123456789, 0xDEADBEEF]
    xs += torch.randint(0, 2**32, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    got = hash32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [_hash32_py(x) for x in xs]


def test_counter_uniforms_are_uniform_and_keyed_only_by_row_key():
    vk = vocab_keys(4096, "cpu")
    keys = row_keys(torch.arange(64, dtype=torch.int64) * 7919, torch.arange(64, dtype=torch.int64) + 100)
    u = counter_uniform(keys, vk)                                    # 262,144 draws
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 3 * math.sqrt(1 / 12 / u.numel())
    hist = torch.histc(u, bins=16, min=0, max=1)                     # chi-square, 15 dof: p(χ² > 37.7) = 1e-3
    exp = u.numel() / 16
    assert float(((hist - exp) ** 2 / exp).sum()) < 37.7
    # a row's draws do not depend on which rows share the batch
    assert torch.equal(counter_uniform(keys[5:6], vk), u[5:6])
    assert torch.equal(counter_uniform(keys.flip(0), vk).flip(0), u)


def test_counter_sampler_draws_from_the_processed_distribution():
    torch.manual_seed(0)
    logits = torch.randn(1, 6) * 1.5
    p = SamplingParams(temperature=0.7)
    probs = torch.softmax(logits / 0.7, -1)[0]
    n = 20000
    keys = row_keys(torch.full((n,), 42, dtype=torch.int64), torch.arange(n, dtype=torch.int64))
    tok, lp = sample_counter(logits.expand(n, 6), p, keys, vocab_keys(6, "cpu"))
    freq = torch.bincount(tok, minlength=6).double() / n
    assert (freq - probs.double()).abs().max() < 4 * math.sqrt(0.25 / n)
    assert torch.allclose(lp, torch.log_softmax(logits / 0.7, -1)[0][tok], atol=1e-6)


def test_bucket_sizes():
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert bucket_sizes(300) == [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 300]


def _engine(path, **kw):
    return TorchEngine.from_pretrained(str(path), QuantSpec.preset("w8a8_kv8"), max_slots=8, max_len=512, **kw)


def test_decode_step_equals_padded_forward_bit_for_bit(tiny_model_dir):
    """`EngineModel.decode_step` (the fused decode path) vs the general padded forward."""
    a, b = _engine(tiny_model_dir), _engine(tiny_model_dir)
    ctxs = [[5 + (7 * j + i) % 200 for j in range(20 + 9 * i)] for i in range(3)]
    slots = [[eng._slot(i) for i in range(3)] for eng in (a, b)]
    for eng, s in zip((a, b), slots):
        eng._prefill(s, ctxs)
    new = [11, 12, 13]
    fused = a._decode(slots[0], new)
    general, _ = b._forward(slots[1], [[t] for t in new], False)
    assert torch.equal(fused, general)


def test_counter_sampler_tokens_do_not_depend_on_the_batch(tiny_model_dir):
    sp = SamplingParams(max_new_tokens=10)
    ctxs = [[5 + (3 * j + 11 * i) % 150 for j in range(25 + 4 * i)] for i in range(4)]
    together = _engine(tiny_model_dir, sampler="counter").generate(
        [TurnRequest(i, c, sp, seed=100 + i) for i, c in enumerate(ctxs)])
    for i in (3, 1):
        alone = _engine(tiny_model_dir, sampler="counter").generate([TurnRequest(i, ctxs[i], sp, seed=100 + i)])[0]
        assert alone.token_ids == together[i].token_ids
        assert alone.logprobs == pytest.approx(together[i].logprobs, abs=1e-6)
    # and the behaviour log-probs are those of the tokens under the engine's own numerics
    eng = _engine(tiny_model_dir)
    rescored = eng.score(ctxs[2], together[2].token_ids)
    assert max(abs(x - y) for x, y in zip(rescored, together[2].logprobs)) < 1e-5


def test_unknown_sampler_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="sampler must be one of"):
        _engine(tiny_model_dir, sampler="philox")


def _prefill_rope_heads(monkeypatch, norm_kernels) -> None:
    """`_qk_norm_rope_kernel` groups heads as on the GPU: there a prefill chunk's B·T rows exceed
    `ROPE_DECODE_MAX_ROWS` (256) and a program takes `ROPE_HEADS_PER_PROGRAM` heads (here all 4 q
    heads, or k's or v's 2 in a group of 4 with 2 masked), a decode step `ROPE_DECODE_HEADS` (2).
    The CPU tests' chunks are a few rows, so the threshold drops to their 2-row decode batches.
    Every grouping stores the same bits (tests/kernels/test_triton_norm.py); this one runs fewer
    interpreted programs than 2 heads everywhere. Prefill chunks also take 2 tokens a program, so
    the engine runs the several-token path (its rows' valid counts, the last program's overrun)."""
    monkeypatch.setattr(norm_kernels, "ROPE_DECODE_MAX_ROWS", 2)
    monkeypatch.setenv(norm_kernels.ROPE_TOKENS_ENV, "2")


def test_fused_norm_rope_silu_kernels_in_the_engine_agree_with_the_torch_layers(tiny_model_dir, monkeypatch):
    """The engine's bf16 CUDA path runs residual-add + RMSNorm (+ the next linear's int8 activation
    codes), q/k-norm + RoPE (+ the decode token's K/V write into the cache) and SiLU·mul (+ codes)
    as Triton kernels; here they run under the interpreter inside a CPU bf16 engine, against the same
    engine on torch ops. bf16 rounding of the norms' means can move an int8 activation code, so
    agreement is to bf16 level, not bitwise (the CPU fp32 engine never uses these kernels)."""
    pytest.importorskip("triton")
    from agentq.kernels import _interp
    from agentq.rollout.torch_engine import model as engine_model
    from agentq.rollout.torch_engine.kv_cache import KVCache
    from agentq.rollout.torch_engine.model import RMSNorm

    mods = ("agentq.kernels.triton_quant", "agentq.kernels.triton_norm")
    _, norm_kernels = _interp.load_interpreted(mods)
    _prefill_rope_heads(monkeypatch, norm_kernels)
    calls = {}
    for name in ("add_rms_norm", "qk_norm_rope", "qk_norm_rope_to_cache", "silu_mul_quant", "rms_norm", "silu_mul"):
        fn = getattr(norm_kernels, name)
        monkeypatch.setattr(norm_kernels, name, lambda *a, _f=fn, _n=name, **k: (calls.update({_n: calls.get(_n, 0) + 1}),
                                                                                 _f(*a, **k))[1])
    # the cache-writing kernel is offered on CUDA only; here the interpreted kernel writes the CPU cache
    monkeypatch.setattr(KVCache, "fused_write_args", lambda self, i: (self.k[i], self.v[i], self.k_scale[i],
                                                                      self.v_scale[i]))
    try:
        plain, fused = (TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=2,
                                                    max_len=256, dtype=torch.bfloat16) for _ in range(2))
        norms = [m for m in fused.model.modules() if isinstance(m, RMSNorm)]
        assert norms and not any(m.fused for m in norms)        # CPU: off by default
        for m in norms:
            m.fused = True
        ctx = [5 + (7 * j) % 200 for j in range(10)]
        tgt = [9 + (5 * j) % 100 for j in range(6)]
        a, b = torch.tensor(plain.score(ctx, tgt)), torch.tensor(fused.score(ctx, tgt))
        # 2 layers x 2 pre-norms + the final norm; no separate norm, SiLU·mul or quant launch
        assert calls == {"add_rms_norm": 5, "qk_norm_rope": 2, "silu_mul_quant": 2}
        assert (a - b).abs().max() < 0.1 and (a - b).abs().mean() < 0.02
        # decode steps: q/k-norm + RoPE write the new token's K/V themselves
        calls.clear()
        sp = SamplingParams(max_new_tokens=3, temperature=1e-3)
        ra, rb = (e.generate([TurnRequest(0, ctx, sp, seed=1)])[0] for e in (plain, fused))
        assert calls["qk_norm_rope_to_cache"] == 2 * 2 and "qk_norm_rope" in calls     # 2 decode steps; prefill
        assert ra.token_ids == rb.token_ids
        assert max(abs(x - y) for x, y in zip(ra.logprobs, rb.logprobs)) < 0.1
    finally:
        _interp.restore_compiled(mods)


def _fused_cpu_engine(path, spec: str = "w8a8_kv8", prefill_chunk: int = 8) -> TorchEngine:
    """A CPU bf16 engine (2 slots, 64 positions, 8-token prefill chunks unless told) with the fused
    norm launches on, which an engine turns on by itself only on CUDA (the tests load the Triton
    kernels interpreted)."""
    from agentq.rollout.torch_engine.model import RMSNorm
    eng = TorchEngine.from_pretrained(str(path), QuantSpec.preset(spec), max_slots=2, max_len=64,
                                      dtype=torch.bfloat16, prefill_chunk=prefill_chunk)
    for m in eng.model.modules():
        if isinstance(m, RMSNorm):
            m.fused = True
    return eng


def _perturbed_weights(path, only: str = "") -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, those whose name holds `only` moved by 5 % of their mean |w| (a
    weight sync's new version)."""
    g = torch.Generator().manual_seed(0)
    return {n: w + 0.05 * torch.randn(w.shape, generator=g) * w.abs().mean() if only in n else w
            for n, w in load_safetensors_dir(path).items()}


@NEEDS_INTERPRETED_LOOP_BOUNDS
@pytest.mark.parametrize("spec", ["w8a8_kv8", "none"])
def test_prefill_kv_written_by_the_rope_launch_equals_the_separate_write(tiny_model_dir, monkeypatch, spec):
    """Where prefill attention reads the cache in place, the q/k-norm + RoPE launch writes each
    chunk's K/V itself (`qk_norm_rope_to_cache` with T > 1): ragged rows in 4-token chunks, a
    second turn's delta prefill and the decode steps leave the very cache bits, tokens and
    log-probs that qk_norm_rope + `KVCache.write` leave (the kernels interpreted in a CPU bf16 engine)."""
    pytest.importorskip("triton")
    from agentq.kernels import _interp
    from agentq.kernels import attention as attn_ops
    from agentq.rollout.torch_engine import model as engine_model
    from agentq.rollout.torch_engine.kv_cache import KVCache

    mods = ("agentq.kernels.triton_quant", "agentq.kernels.triton_attention", "agentq.kernels.triton_prefill",
            "agentq.kernels.triton_norm")
    norm_kernels = _interp.load_interpreted(mods)[-1]
    _prefill_rope_heads(monkeypatch, norm_kernels)
    chunk_lens = []
    fn = norm_kernels.qk_norm_rope_to_cache
    monkeypatch.setattr(norm_kernels, "qk_norm_rope_to_cache",
                        lambda q, *a: (chunk_lens.append(q.shape[1]), fn(q, *a))[1])
    # CUDA-only switches, turned on for the CPU engine (the interpreted kernels run there)
    monkeypatch.setattr(KVCache, "fused_write_args", lambda self, i: (
        self.k[i], self.v[i], *((self.k_scale[i], self.v_scale[i]) if self.k_scale else (None, None))))
    monkeypatch.setattr(attn_ops, "prefill_kernel_available", lambda *a: True)
    monkeypatch.setattr(engine_model, "PREFILL_KV_WRITE", True)          # whatever the environment says
    try:
        engines = [_fused_cpu_engine(tiny_model_dir, spec, prefill_chunk=4) for _ in range(2)]
        for layer in engines[1].model.decoder_layers:          # the reference: K/V stored by `KVCache.write`
            monkeypatch.setattr(layer, "_fused_write", lambda ctx: None)
        # 3 and 6 tokens: a ragged chunk (3 and 4 tokens), then the longer row's last 2 (no one-token
        # chunk, which the count below would take for a decode step)
        ctxs = [[5 + (7 * j + 3 * i) % 200 for j in range(3 + 3 * i)] for i in range(2)]
        # temperature 1: each log-prob carries its logits' bits (near-greedy ones are all 0.0)
        sp = SamplingParams(max_new_tokens=2)
        out = []
        for eng in engines:
            turn1 = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(ctxs)])
            nxt = [c + r.token_ids + [7, 8, 9][: 1 + 2 * i] for i, (c, r) in enumerate(zip(ctxs, turn1))]
            turn2 = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(nxt)])
            out.append([(r.token_ids, r.logprobs) for r in turn1 + turn2])
        assert out[0] == out[1]
        assert max(chunk_lens) > 1 and chunk_lens.count(1) == 2 * 2 * 1     # 2 layers × 2 turns × 1 decode step
        fused, ref = (e.cache for e in engines)
        for i in range(fused.n_layers):
            assert torch.equal(fused.k[i], ref.k[i]) and torch.equal(fused.v[i], ref.v[i])
            if spec == "w8a8_kv8":
                assert torch.equal(fused.k_scale[i], ref.k_scale[i]) and torch.equal(fused.v_scale[i], ref.v_scale[i])
    finally:
        _interp.restore_compiled(mods)


@NEEDS_INTERPRETED_LOOP_BOUNDS
def test_paired_glu_engine_equals_the_stacked_two_launch_engine(tiny_model_dir, monkeypatch):
    """A gate_up linear built for the GLU GEMM (`int8_linear.glu_layout`, CUDA-only, turned on here
    for a CPU bf16 engine whose kernels run interpreted) stores gate and up rows paired and runs
    SiLU·mul in the GEMM's epilogue at prefill and decode rows: the same tokens and log-probs as the
    stacked rows + gate_up GEMM + SiLU·mul-and-codes launches, and its rows unpair to theirs."""
    pytest.importorskip("triton")
    from agentq.kernels import _interp, int8_linear

    mods = ("agentq.kernels.triton_quant", "agentq.kernels.triton_gemm", "agentq.kernels.triton_norm")
    _, tg, norm_kernels = _interp.load_interpreted(mods)
    _prefill_rope_heads(monkeypatch, norm_kernels)
    calls = []
    fn = tg.int8_gemm_glu
    monkeypatch.setattr(tg, "int8_gemm_glu", lambda x_q, *a: (calls.append(x_q.shape[0]), fn(x_q, *a))[1])
    # 128-wide column tiles (8 per 1024 paired rows, the CPU default's 32-wide tiles make 32): the
    # same bits, a quarter of the interpreted programs
    monkeypatch.setattr(tg, "glu_config", lambda m, n2, k, device=None: tg.GemmConfig(16, 128, 256))
    try:
        engines = []
        for paired in (True, False):
            monkeypatch.setattr(int8_linear, "glu_layout", lambda quantized, device, _p=paired: _p and quantized)
            engines.append(_fused_cpu_engine(tiny_model_dir))
        (pa, st) = (e.model.decoder_layers[0].gate_up_proj for e in engines)
        assert pa.paired and not st.paired
        assert torch.equal(tg.glu_unpair_rows(pa.w_q), st.w_q) and torch.equal(tg.glu_unpair_rows(pa.s_w), st.s_w)
        ctxs = [[5 + (7 * j + 3 * i) % 200 for j in range(2 + 2 * i)] for i in range(2)]      # 2 and 4 tokens
        # temperature 1: each log-prob carries its logits' bits (near-greedy ones are all 0.0)
        sp = SamplingParams(max_new_tokens=2)

        def play(e):
            return [(r.token_ids, r.logprobs) for r in e.generate([TurnRequest(i, c, sp, seed=i)
                                                                   for i, c in enumerate(ctxs)])]
        out = [play(e) for e in engines]
        assert out[0] == out[1]
        assert max(calls) > 1 and calls.count(2) >= 2          # prefill rows; the 2-row decode step, both layers
        # a weight sync writes the paired rows in place (every other row per projection)
        new = _perturbed_weights(tiny_model_dir, "mlp.")
        stats = [e.update_weights(new.items(), version=1) for e in engines]
        assert stats[0].int8_codes_changed == stats[1].int8_codes_changed > 0
        assert torch.equal(tg.glu_unpair_rows(pa.w_q), st.w_q) and torch.equal(tg.glu_unpair_rows(pa.s_w), st.s_w)
        out = [play(e) for e in engines]
        assert out[0] == out[1]
    finally:
        _interp.restore_compiled(mods)


@NEEDS_INTERPRETED_LOOP_BOUNDS
def test_partial_sums_engine_equals_the_one_split_engine(tiny_model_dir, monkeypatch):
    """o_proj and down_proj of a decode step handing int32 partial sums over K slices to the fused
    norm after them (`int8_linear.w8a8_linear_partials`; CUDA-only and table-driven, forced here for
    a CPU bf16 engine whose kernels run interpreted): the same tokens and log-probs as the GEMMs
    with their epilogues, over two turns, before and after a weight sync."""
    pytest.importorskip("triton")
    from agentq.kernels import _interp, int8_linear

    mods = ("agentq.kernels.triton_quant", "agentq.kernels.triton_gemm", "agentq.kernels.triton_norm")
    _, tg, norm_kernels = _interp.load_interpreted(mods)
    _prefill_rope_heads(monkeypatch, norm_kernels)
    calls = []
    fn = tg.int8_gemm_partials
    monkeypatch.setattr(tg, "int8_gemm_partials", lambda x_q, *a: (calls.append(tuple(x_q.shape)), fn(x_q, *a))[1])
    try:
        engines = [_fused_cpu_engine(tiny_model_dir) for _ in range(2)]
        ctxs = [[5 + (7 * j + 3 * i) % 200 for j in range(2 + 2 * i)] for i in range(2)]      # 2 and 4 tokens
        # a decode step a turn; temperature 1: each log-prob carries its logits' bits (near-greedy
        # ones are all 0.0)
        sp = SamplingParams(max_new_tokens=2)

        def play(e, partials):
            # 3 splits of K (256 or 512) in 32-wide steps: ragged slices, two tile shapes (128-wide
            # column tiles: 2 per output of 256, so few interpreted programs)
            monkeypatch.setattr(int8_linear, "partials_config", lambda rows, w_q: tg.GemmConfig(16, 128, 32, 3, 1, 4, 2)
                                if partials else None)
            turn1 = e.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(ctxs)])
            nxt = [c + r.token_ids + [7] for c, r in zip(ctxs, turn1)]      # a 2-token delta prefill
            turn2 = e.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(nxt)])
            return [(r.token_ids, r.logprobs) for r in turn1 + turn2]

        out = [play(e, p) for e, p in zip(engines, (True, False))]
        assert out[0] == out[1]
        # decode steps only (prefill rows keep the epilogue): o (K 256) and down (K 512), 2 layers
        assert calls and {k for _, k in calls} == {256, 512} and max(m for m, _ in calls) <= 2
        new = _perturbed_weights(tiny_model_dir)
        for e in engines:
            e.update_weights(new.items(), version=1)
        out = [play(e, p) for e, p in zip(engines, (True, False))]
        assert out[0] == out[1]
    finally:
        _interp.restore_compiled(mods)


def _turns_with_early_stops(eng, n: int = 6, turns: int = 3):
    """Turns in which rows end at different steps: a stop-token set that random sampling hits
    often, plus a slot limit that ends the longest rows by length in the last turn."""
    stop = tuple(range(3, 512, 9))
    ctxs = [[5 + (11 * j + 17 * i) % 300 for j in range(30 + 13 * i)] for i in range(n)]
    out = []
    for t in range(turns):
        sp = SamplingParams(max_new_tokens=24, stop_token_ids=stop)
        res = eng.generate([TurnRequest(i, c, sp, seed=40 + i) for i, c in enumerate(ctxs)])
        out.append([(r.token_ids, r.logprobs, r.finish_reason) for r in res])
        ctxs = [c + r.token_ids + [7, 8, 9] for c, r in zip(ctxs, res)]
    return out


def test_run_ahead_gives_the_tokens_of_step_by_step_decoding(tiny_model_dir):
    """Queuing each decode step before the previous one's tokens are read (rows that finished in
    the meantime dropped on the device, their extra token discarded) changes nothing: the same
    tokens and finish reasons and the same log-probs to fp32 re-association, turn after turn (so the extra K/V written past a
    finished row's length is harmless), down to rows ended by the slot limit."""
    runs = {}
    for ahead in (True, False):
        eng = TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=8,
                                          max_len=160, sampler="counter", run_ahead=ahead)
        runs[ahead] = (_turns_with_early_stops(eng), dict(eng.decoder.stats))
    for turn_a, turn_b in zip(runs[True][0], runs[False][0]):
        for (ids_a, lp_a, fin_a), (ids_b, lp_b, fin_b) in zip(turn_a, turn_b):
            assert ids_a == ids_b and fin_a == fin_b
            # a row's step may run in a larger batch than step by step would: fp32 GEMMs of another
            # M re-associate (as between any two batch compositions, test above)
            assert lp_a == pytest.approx(lp_b, abs=1e-6)
    reasons = {f for turn in runs[True][0] for _, _, f in turn}
    lengths = {len(ids) for turn in runs[True][0] for ids, _, _ in turn}
    assert {"stop", "length"} <= reasons and len(lengths) > 4        # rows really ended apart
    assert runs[False][1]["queued_ahead"] == 0
    # one step per turn is filled from the host (the first); every other one is queued ahead
    assert runs[True][1]["eager_steps"] - runs[True][1]["queued_ahead"] == 3


def test_run_ahead_queues_every_step_but_the_first_from_the_device(tiny_model_dir):
    """With no row ending early, one host-filled step per turn; every later step is queued from
    the device before the host reads its predecessor, and none is wasted at the turn's end."""
    eng = _engine(tiny_model_dir, sampler="counter")
    sp = SamplingParams(max_new_tokens=9)
    eng.generate([TurnRequest(i, [5 + i + j for j in range(20)], sp, seed=i) for i in range(3)])
    # 9 tokens: the first from the prefill's logits, 8 decode steps, 7 of them queued ahead
    assert eng.decoder.stats["eager_steps"] == 8
    assert eng.decoder.stats["queued_ahead"] == 7


@pytest.fixture(scope="module")
def ahead_pair(tiny_model_dir):
    """Two counter-sampler CPU engines, one queuing steps ahead, one stepping (reused across examples)."""
    return {ahead: TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=6,
                                               max_len=96, sampler="counter", run_ahead=ahead)
            for ahead in (True, False)}


def test_run_ahead_matches_stepping_for_any_batch_limits_and_stops(ahead_pair):
    """Property: for any batch, turn length, stop-token density and prompt lengths up to the slot
    limit, queuing ahead gives the step-by-step tokens and finish reasons, and never writes past a
    slot (the CPU cache would raise)."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=12, deadline=None, derandomize=True)
    @hypothesis.given(n=st.integers(1, 6), new=st.integers(1, 12), every=st.integers(2, 40),
                      lens=st.lists(st.integers(3, 90), min_size=6, max_size=6), seed=st.integers(0, 1000))
    def check(n, new, every, lens, seed):
        sp = SamplingParams(max_new_tokens=new, stop_token_ids=tuple(range(1, 512, every)))
        out = {}
        for ahead, eng in ahead_pair.items():
            eng.release_all()
            reqs = [TurnRequest(i, [5 + (7 * j + 3 * i) % 400 for j in range(lens[i])], sp, seed=seed + i)
                    for i in range(n)]
            out[ahead] = eng.generate(reqs)
        for a, b in zip(out[True], out[False]):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)

    check()
