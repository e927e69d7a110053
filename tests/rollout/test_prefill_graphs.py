"""Prefill chunks through padded buckets (`prefill_graphs.PrefillRunner`). On CPU the runner runs
its padded shapes eagerly, with the engine's Triton kernels interpreted; the CUDA-graph replay of
the same shapes is checked in test_engine_cuda.py on a GPU."""
import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.rollout import SamplingParams, TurnRequest
from agentq.rollout.torch_engine.engine import TorchEngine
from agentq.rollout.torch_engine.prefill_graphs import PrefillRunner, key_bucket, token_buckets
from conftest import NEEDS_INTERPRETED_LOOP_BOUNDS


def test_token_buckets_step_by_16_then_32_then_64_with_an_edge_below_the_copy_read():
    assert token_buckets(256) == [16, 32, 48, 63, 64, 80, 96, 112, 128, 160, 192, 224, 256]
    assert token_buckets(400) == [16, 32, 48, 63, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 400]
    assert token_buckets(20) == [16, 20]


def test_key_bucket_is_the_next_power_of_two_within_the_slot():
    assert [key_bucket(n, 3000) for n in (1, 64, 65, 1000, 1024, 1025, 2900)] == [64, 64, 128, 1024, 1024, 2048, 3000]
    assert key_bucket(100, 100) == 100


def _interpreted_engine(path, monkeypatch, spec: str, max_slots: int) -> TorchEngine:
    """A CPU bf16 engine on the path the runner takes on CUDA (fused norms whose launch writes K/V,
    the prefill kernel reading the cache in place; the kernels interpreted), with 8-token chunks."""
    from agentq.kernels import attention as attn_ops
    from agentq.rollout.torch_engine import model as engine_model
    from agentq.rollout.torch_engine.kv_cache import KVCache
    from agentq.rollout.torch_engine.model import RMSNorm

    monkeypatch.setattr(KVCache, "fused_write_args", lambda self, i: (
        self.k[i], self.v[i], *((self.k_scale[i], self.v_scale[i]) if self.k_scale else (None, None))))
    monkeypatch.setattr(attn_ops, "prefill_kernel_available", lambda *a: True)
    monkeypatch.setattr(engine_model, "PREFILL_KV_WRITE", True)
    eng = TorchEngine.from_pretrained(str(path), QuantSpec.preset(spec), max_slots=max_slots, max_len=64,
                                      dtype=torch.bfloat16, prefill_chunk=8)
    for m in eng.model.modules():
        if isinstance(m, RMSNorm):
            m.fused = True
    return eng


@NEEDS_INTERPRETED_LOOP_BOUNDS
@pytest.mark.parametrize("spec", ["w8a8_kv8", "none"])
def test_padded_buckets_give_the_unpadded_tokens_logprobs_and_cache(tiny_model_dir, monkeypatch, spec):
    """3 episodes in 4 slots (a padding row in the scratch slot), ragged contexts over 8-token
    chunks, two turns: the runner's chunks padded to 16 tokens and 4 rows give the very tokens,
    log-probs and cache bits of the engine's unpadded chunks, and no chunk waits for the device
    to learn its length (the key length comes from the host)."""
    pytest.importorskip("triton")
    from agentq.kernels import _interp
    from agentq.rollout.torch_engine import model as engine_model

    mods = ("agentq.kernels.triton_quant", "agentq.kernels.triton_attention", "agentq.kernels.triton_prefill",
            "agentq.kernels.triton_norm")
    _interp.load_interpreted(mods)
    try:
        plain, padded = (_interpreted_engine(tiny_model_dir, monkeypatch, spec, max_slots=4) for _ in range(2))
        assert plain.prefiller.bucket(3, 8, 20) is None              # CPU: the engine builds it off
        padded.prefiller = PrefillRunner(padded.model, padded.cache, pad_slot=4, max_rows=4, max_tokens=16,
                                         use_graphs=False)
        assert padded.prefiller.bucket(3, 8, 20) == (4, 16, 64)
        syncs = []
        ctx_init = engine_model.ForwardContext.__init__
        monkeypatch.setattr(engine_model.ForwardContext, "__init__", lambda self, *a, **k: (
            syncs.append(a[-1] if len(a) == 7 else k.get("key_len")), ctx_init(self, *a, **k))[1])
        ctxs = [[5 + (7 * j + 3 * i) % 200 for j in range(3 + 5 * i)] for i in range(3)]      # 3, 8, 13 tokens
        sp = SamplingParams(max_new_tokens=2)      # temperature 1: each log-prob carries its logits' bits
        out = []
        for eng in (plain, padded):
            turn1 = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(ctxs)])
            nxt = [c + r.token_ids + [7, 8, 9, 10][: 1 + i] for i, (c, r) in enumerate(zip(ctxs, turn1))]
            turn2 = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(nxt)])
            out.append([(r.token_ids, r.logprobs) for r in turn1 + turn2])
        assert out[0] == out[1]
        assert None not in syncs                                     # every forward got its key length
        # turn 1: chunks of 3 rows (8 tokens) and 1 row (5); turn 2: the rows' 2-4 new tokens
        assert padded.prefiller.stats["padded_eager_chunks"] == 3
        for i in range(plain.cache.n_layers):
            for s in range(3):                                       # the episodes' slots (4 is scratch)
                n = len(plain._cached[s])
                assert padded._cached[s] == plain._cached[s]
                assert torch.equal(padded.cache.k[i][s, :, :n], plain.cache.k[i][s, :, :n])
                assert torch.equal(padded.cache.v[i][s, :, :n], plain.cache.v[i][s, :, :n])
                if spec == "w8a8_kv8":
                    assert torch.equal(padded.cache.k_scale[i][s, :, :n], plain.cache.k_scale[i][s, :, :n])
    finally:
        _interp.restore_compiled(mods)


def test_a_chunk_whose_padding_would_switch_the_cache_read_runs_unpadded(tiny_model_dir, monkeypatch):
    """The prefill kernel reads an int8 cache in place below `COPY_MIN_TOKENS` tokens and through a
    dequantized copy from there on (different rounding): a chunk the padding would carry across
    that edge is declined (the engine runs it eagerly, unpadded); single-token chunks (the decode
    kernel's path) and chunks past the largest bucket are declined too."""
    from agentq.kernels import triton_prefill

    eng = TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=4, max_len=512)
    runner = PrefillRunner(eng.model, eng.cache, pad_slot=4, max_rows=4, max_tokens=128, use_graphs=False)
    runner.enabled = True                        # the CPU engine's path is not capturable; the rule is
    assert runner.bucket(3, 50, 300) == (4, 63, 512) and runner.bucket(3, 70, 300) == (4, 80, 512)
    monkeypatch.setattr(triton_prefill, "COPY_MIN_TOKENS", 60)          # now 50 → 63 crosses the edge
    assert runner.bucket(3, 50, 300) is None and runner.stats["declined_chunks"] == 1
    assert runner.bucket(3, 63, 300) == (4, 63, 512)                   # already past it: no switch
    assert runner.bucket(3, 1, 300) is None and runner.bucket(3, 129, 300) is None
    assert runner.bucket(5, 20, 300) is None                           # more rows than slots


def test_a_failed_capture_runs_its_bucket_eagerly_and_is_not_retried(tiny_model_dir, failing_capture, caplog):
    """A bucket whose capture fails (as a GPU's may, e.g. out of memory) runs eagerly over its padded
    shapes from then on, with one warning: the turns play on with the unpadded engine's tokens.
    (A CPU engine: the runner's path and graphs are forced on and the capture is made to fail.)"""
    import logging

    from agentq.rollout.torch_engine import prefill_graphs

    attempts = failing_capture(prefill_graphs)
    plain, padded, runner = _engines_with_forced_graphs(tiny_model_dir)
    with caplog.at_level(logging.WARNING, logger=prefill_graphs.__name__):
        _assert_same_turns(plain, padded, [[0, 1, 2], [0, 1, 2]])
    # turn 1: one (4, 16, 64) chunk; turn 2: (4, 16, 64) again, whose capture is not retried
    assert len(attempts) == 1 and caplog.text.count("capture of prefill bucket") == 1
    assert runner.stats["padded_eager_chunks"] == 2 and runner.stats["graphs_captured"] == 0


def _engines_with_forced_graphs(path, max_graphs: int = 64) -> tuple[TorchEngine, TorchEngine, PrefillRunner]:
    """Two CPU w8a8_kv8 engines of 4 slots: a plain one, and one whose runner (16-token chunks,
    returned too) takes its path with graphs forced on; a test stands in for the capture."""
    spec = QuantSpec.preset("w8a8_kv8")
    plain, padded = (TorchEngine.from_pretrained(str(path), spec, max_slots=4, max_len=64) for _ in range(2))
    runner = PrefillRunner(padded.model, padded.cache, pad_slot=4, max_rows=4, max_tokens=16, use_graphs=False,
                           max_graphs=max_graphs)
    runner.enabled = runner.use_graphs = True
    padded.prefiller = runner
    return plain, padded, runner


def _assert_same_turns(plain: TorchEngine, padded: TorchEngine, turns: list[list[int]]) -> None:
    """Play the same turns on both engines (turns[k]: the episodes of `generate` call k, each
    starting with a 4, 7 or 10-token context, then adding its sampled tokens and 3 more a turn):
    the same tokens, log-probs within 1e-5 (a padded chunk's CPU GEMMs may round otherwise)."""
    sp = SamplingParams(max_new_tokens=3)
    out = []
    for eng in (plain, padded):
        ctxs = {i: [5 + (7 * j + 3 * i) % 200 for j in range(4 + 3 * i)] for i in range(3)}
        results = []
        for k, episodes in enumerate(turns):
            for i, r in zip(episodes, eng.generate([TurnRequest(i, ctxs[i], sp, seed=i) for i in episodes])):
                ctxs[i] = ctxs[i] + r.token_ids + [7, 8, 9]
                results.append((r.token_ids, r.logprobs))
        out.append(results)
    assert [t for t, _ in out[0]] == [t for t, _ in out[1]]
    assert max(abs(a - b) for (_, la), (_, lb) in zip(*out) for a, b in zip(la, lb)) < 1e-5


def test_past_the_cap_a_new_bucket_runs_eagerly_unpadded_and_captured_ones_replay(tiny_model_dir, monkeypatch,
                                                                                    caplog):
    """With `max_graphs=2`, chunks of 3, 2, 1, 3 and 1 rows (buckets of 4, 2, 1, 4 and 1 rows): the
    first two buckets are captured and the 4-row one replays again; the 1-row chunks find the cap
    reached and run eagerly, unpadded, with one warning naming the config key. The turns play on
    with the plain engine's tokens. (The stand-in capture's graph reruns the forward eagerly.)"""
    import logging
    from types import SimpleNamespace

    from agentq.rollout.torch_engine import prefill_graphs

    captures = []

    def replayed_eagerly(fn, pool):
        captures.append(pool)
        return SimpleNamespace(replay=fn), fn()
    monkeypatch.setattr(prefill_graphs, "capture_graph", replayed_eagerly)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    plain, padded, runner = _engines_with_forced_graphs(tiny_model_dir, max_graphs=2)
    with caplog.at_level(logging.WARNING, logger=prefill_graphs.__name__):
        _assert_same_turns(plain, padded, [[0, 1, 2], [0, 1], [2], [0, 1, 2], [0]])
    assert len(captures) == 2 and set(runner._graphs) == {(4, 16, 64), (2, 16, 64)}
    assert runner.stats == {"graph_replays": 3, "padded_eager_chunks": 0, "graphs_captured": 2,
                            "declined_chunks": 0, "uncaptured_chunks": 2}
    assert padded.prefill_counts()["prefill_graph_uncaptured"] == 2
    assert caplog.text.count("rollout.prefill_graph_max") == 1
    assert runner.bucket(1, 4, 20) is None and runner.bucket(3, 4, 20) == (4, 16, 64)


def test_max_graphs_0_captures_nothing_and_applies_only_to_graphs(tiny_model_dir, failing_capture, caplog):
    """`max_graphs=0`: every chunk runs eagerly, unpadded, and no capture is tried; without graphs
    (padded eager buckets) the cap does not apply."""
    import logging

    from agentq.rollout.torch_engine import prefill_graphs

    attempts = failing_capture(prefill_graphs)
    plain, padded, runner = _engines_with_forced_graphs(tiny_model_dir, max_graphs=0)
    with caplog.at_level(logging.WARNING, logger=prefill_graphs.__name__):
        _assert_same_turns(plain, padded, [[0, 1, 2], [0, 1, 2]])
    assert not attempts and not runner._graphs and caplog.text.count("rollout.prefill_graph_max") == 1
    assert runner.stats["uncaptured_chunks"] == 2 and runner.stats["graph_replays"] == 0
    runner.use_graphs = False
    assert runner.bucket(3, 4, 20) == (4, 16, 64)


def test_rollout_prefill_graph_max_reaches_the_runner(tiny_model_dir):
    pytest.importorskip("omegaconf", reason="the config layer (Hydra) is not installed (the GPU machine)")
    from transformers import AutoConfig

    from agentq.build import torch_engine_kwargs
    from agentq.config import load_config

    kw = torch_engine_kwargs(load_config(["rollout.prefill_graph_max=5"]), "cpu", torch.float32)
    eng = TorchEngine(AutoConfig.from_pretrained(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=4, **kw)
    assert kw["prefill_graph_max"] == 5 and eng.prefiller.max_graphs == 5
