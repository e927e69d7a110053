"""Rollout-engine throughput, side by side in one run: the built-in engine with W8A8-KV8 vs the
same engine in bf16 (`quant=none`) vs HF `generate` (bf16, static cache), on one random-weight
model of a real shape (throughput does not depend on the weights' values).

A batch of B episodes plays T turns: turn 1 prefills a P-token prompt, every turn decodes N
tokens (no stop token, so every episode generates exactly N), and each later turn appends a
64-token observation (the engine prefills only that delta; HF `generate` is given the whole
context again, as it keeps no cache between calls). Reported per configuration:

* whole-batch tokens/s (generated tokens over the wall time of all turns, prefill included);
* decode step time (B episodes, one token each, at the final context length) and its HBM
  roofline: bytes of weights + KV read per step over the measured device-copy bandwidth;
* KV bytes per token, and the most episodes a fixed KV-memory budget holds (`--kv-budget-gib`);
  `--at-budget` also runs each engine at the largest batch its budget holds.

Every episode has its own prompt by default. `--group G` gives each G consecutive episodes one
prompt, as a GRPO group has: the engine then prefills each group's prompt once and copies its K/V
(`TorchEngine(share_prefill=True)`; `--no-share` turns that off), HF `generate` prefills every row.

    python -m agentq.eval.bench_engine --model 8b --batch 64 128 --prompt 2048 --new 128 --turns 3
    python -m agentq.eval.bench_engine --model 8b --batch 16 64 128 256 --prompt 2048 --new 128 \
        --no-hf --kv-budget-gib 24 --at-budget      # every batch size of the benchmark spec, + budget
    python -m agentq.eval.bench_engine --model tiny --batch 4 --prompt 128 --new 16 --turns 2     # CPU
    python -m agentq.eval.bench_engine --model 8b --batch 64 --prompt 2048 --new 128 --no-hf \
        --decode-sweep pdl_max_rows=0,64,128      # + the W8A8 decode step per launch-knob value
    python -m agentq.eval.bench_engine --model 8b --batch 64 --prompt 2048 --new 128 --no-hf \
        --quants none w8a8_kv8 w8a8_kv8_head        # + the preset whose LM head is W8A8 too
    python -m agentq.eval.bench_engine --model 1b --batch 64 --prompt 2048 --new 128 --no-hf \
        --group 8                                   # GRPO groups of 8 sharing a prompt
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import torch

from agentq.eval.bench_common import (SHAPES, SWITCHES, fast_path_switches, kernel_timeline, print_timeline,
                                      profiled_kernels, qwen3_config, sync, time_calls, write_json)
from agentq.rollout.torch_engine.engine import DEFAULT_PREFILL_CHUNK
from agentq.rollout.torch_engine.prefill_graphs import DEFAULT_MAX_TOKENS as DEFAULT_PREFILL_GRAPH_TOKENS

OBS = 64


def random_weights(engine, seed: int = 0):
    """N(0, 0.02²) matrices and unit norm weights, generated on the engine's device."""
    dev = engine.device
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, (mod, attr) in engine.model._targets.items():
        if isinstance(attr, tuple):                    # one projection of a fused linear
            a, b = mod.offsets[attr[1]]
            shape = (b - a, mod.in_features) if attr[0] == "load" else (b - a,)
        else:
            shape = tuple(getattr(mod, attr).shape)
        if len(shape) == 1:
            yield name, torch.ones(shape, device=dev)
        else:
            yield name, torch.randn(shape, generator=g, device=dev, dtype=engine.model.dtype) * 0.02


def _contexts(batch: int, prompt: int, vocab: int, group: int = 1) -> list[list[int]]:
    """One prompt per `group` consecutive episodes; prompts of different groups differ from token 0."""
    return [[(7 * j + 13 * (i // group)) % (vocab - 1) + 1 for j in range(prompt)] for i in range(batch)]


def weight_bytes(engine) -> int:
    """Bytes a decode step reads of weights: every linear (codes + scales), norms and the LM head
    (the embedding table only when it is the tied head; a step reads B of its rows otherwise)."""
    m = engine.model
    n = sum(b.numel() * b.element_size() for b in m.buffers())
    tied_fp_head = m.tied and m.head is None
    return n + (m.embed_tokens.weight.numel() * m.embed_tokens.weight.element_size() if tied_fp_head else 0)


def run_engine(model: str, quant: str, batch: int, prompt: int, new: int, turns: int, device: str,
               dtype: torch.dtype, graphs: bool = True, run_ahead: bool = True, group: int = 1,
               share: bool = True, prefill_graph_tokens: int = DEFAULT_PREFILL_GRAPH_TOKENS,
               prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> dict:
    from agentq.kernels import QuantSpec
    from agentq.rollout import SamplingParams, TurnRequest
    from agentq.rollout.torch_engine.engine import TorchEngine

    max_len = prompt + turns * (new + OBS) + 32
    cfg = qwen3_config(model, max_len)
    eng = TorchEngine(cfg, QuantSpec.preset(quant), max_slots=batch, max_len=max_len, dtype=dtype, device=device,
                      cuda_graphs=graphs, run_ahead=run_ahead, share_prefill=share,
                      prefill_graph_tokens=prefill_graph_tokens, prefill_chunk=prefill_chunk)
    eng.update_weights(random_weights(eng), version=0)
    sp = SamplingParams(max_new_tokens=new)
    ctx = _contexts(batch, prompt, cfg.vocab_size, group)
    _warm_up(eng, ctx, new)
    sync(device)
    t0 = time.perf_counter()
    turn_s, gen = [], 0
    for t in range(turns):
        ts = time.perf_counter()
        res = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(ctx)])
        sync(device)
        turn_s.append(time.perf_counter() - ts)
        gen += sum(len(r.token_ids) for r in res)
        ctx = [c + r.token_ids + [5] * OBS for c, r in zip(ctx, res)]
    total = time.perf_counter() - t0
    # decode-only: one more token for every episode per step, through the engine's decode runner
    steps = 16
    slots = [eng._slot_of[i] for i in range(batch)]
    seeds = list(range(batch))
    cached = {s: len(eng._cached[s]) for s in slots}
    ms = _time_decode(eng, slots, seeds, sp, steps, device)
    for s in slots:                      # the pipelined timing re-writes the same positions
        del eng._cached[s][cached[s]:]
    ms_pipe = _time_decode_pipelined(eng, slots, seeds, sp, steps, device)
    sweep = _decode_sweep(eng, slots, seeds, sp, device) if DECODE_SWEEP and quant != "none" else []
    kv_read = sum(len(eng._cached[s]) for s in slots) * eng.kv_bytes_per_token()
    if PROFILE and device == "cuda":
        _profile(eng, slots, seeds, sp, quant)
        _profile_prefill(eng, _contexts(batch, prompt, cfg.vocab_size, group), quant)
    first_prefill_s = _time_first_prefill(eng, _contexts(batch, prompt, cfg.vocab_size, group), device)   # frees the slots
    out = {"engine": "agentq", "quant": quant, "model": model, "batch": batch, "prompt": prompt, "new_tokens": new,
           "turns": turns, "group": group, "share_prefill": share, "turn_s": turn_s, "tokens_per_s": gen / total, "first_prefill_s": first_prefill_s, "decode_step_ms": ms,
           "decode_step_pipelined_ms": ms_pipe, "run_ahead": run_ahead,
           "kv_bytes_per_token": eng.kv_bytes_per_token(), "weight_bytes": weight_bytes(eng),
           "kv_bytes_read_per_step": kv_read, "decode_stats": dict(eng.decoder.stats), "engine_stats": dict(eng.stats),
           "prefill_graph_tokens": prefill_graph_tokens, "prefill_chunk": prefill_chunk, "prefill_graph_stats": dict(eng.prefiller.stats), "graphs": eng.decoder.graphable,
           "eager_run": not graphs, **({"decode_sweep": sweep} if sweep else {})}
    del eng
    _free(device)
    return out


def _warm_up(eng, ctx: list[list[int]], new: int) -> None:
    """Two untimed turns of the timed ones' shapes: kernel compilation, autotune and graph capture
    for every bucket the run will use. Triton specializes integer arguments on divisibility by 16,
    so the warm-up's token counts keep the timed ones' residues (a prompt of the same length, then
    a delta of `WARM_NEW` + OBS tokens where the timed turns have `new` + OBS): no compile lands
    inside a timed turn (round 8 saw one cost the bf16 engine 0.25 s in turn 2)."""
    from agentq.rollout import SamplingParams, TurnRequest

    warm_new = min(new, WARM_NEW + (new - WARM_NEW) % 16)      # ≤ new: both turns fit the slots
    sp = SamplingParams(max_new_tokens=warm_new)
    res = eng.generate([TurnRequest(10_000 + i, c, sp, seed=i) for i, c in enumerate(ctx)])
    ctx2 = [c + r.token_ids + [5] * OBS for c, r in zip(ctx, res)]
    eng.generate([TurnRequest(10_000 + i, c, sp, seed=i) for i, c in enumerate(ctx2)])
    eng.release_all()


#: new tokens per warm-up turn (plus new's residue mod 16)
WARM_NEW = 16
PROFILE = False
#: --decode-sweep: knob -> values, timed on the quantized engine after its turns, SWEEP_PASSES times each
DECODE_SWEEP: dict[str, list[float]] = {}
SWEEP_PASSES = 2


#: --decode-sweep knobs: name -> (module, attribute, type)
# (glu_gemm is not one: the gate_up weights' layout follows it when an engine is built; AGENTQ_GLU_GEMM=0 runs)
SWEEP_KNOBS = {name: (*SWITCHES[name], int) for name in ("pdl_max_rows", "attn_tma", "attn_cuda", "attn_cuda_warps",
                                                          "attn_cuda_stages", "partial_sums")}


def _knob(name: str) -> tuple:
    if name not in SWEEP_KNOBS:
        raise ValueError(f"unknown --decode-sweep knob {name!r}; valid: {sorted(SWEEP_KNOBS)}")
    import importlib
    mod, attr, typ = SWEEP_KNOBS[name]
    return importlib.import_module(mod), attr, typ


def check_attn_launch_sweep(sweep: dict[str, list[float]]) -> None:
    """Every (warps, stages) the sweep's attn_cuda_warps × attn_cuda_stages would launch can run (0: the
    launch table's, checked as 4 warps / 3 stages); refused before any model is built."""
    from agentq.kernels import cuda_attention

    for w in sweep.get("attn_cuda_warps", [0]):
        for s in sweep.get("attn_cuda_stages", [0]):
            problem = cuda_attention.launch_problem(int(w) or 4, int(s) or 3)
            if problem:
                raise SystemExit(f"--decode-sweep attn_cuda_warps={int(w)} attn_cuda_stages={int(s)}: {problem}")


def _decode_sweep(eng, slots, seeds, sp, device: str, steps: int = 32) -> list[dict]:
    """Decode step time per knob value at fixed lengths (every step re-feeds the same position, so
    each value does the same work); graphs are re-captured per value, each value is timed
    `SWEEP_PASSES` times in interleaved order (a drift shows as a gap between passes; the summary
    line gives each value's median), and the knobs are put back."""
    lens = eng._advance(slots, [3] * len(slots))
    out = []
    for name, values in DECODE_SWEEP.items():
        mod, attr, typ = _knob(name)
        saved = getattr(mod, attr)
        for rep in range(SWEEP_PASSES):
            for v in values:
                setattr(mod, attr, typ(v))
                eng.decoder.reset()                      # re-captured by the first warm step
                ms = _time_decode(eng, slots, seeds, sp, steps, device, warm=3, fixed_lens=lens)
                out.append({"knob": name, "value": v, "rep": rep, "decode_step_ms": ms})
                print(f"  decode sweep B={len(slots)} {name}={v:g} (pass {rep + 1}): {ms:.3f} ms/step", flush=True)
        setattr(mod, attr, saved)
        medians = {v: statistics.median(r["decode_step_ms"] for r in out if r["knob"] == name and r["value"] == v)
                   for v in values}
        print(f"  decode sweep B={len(slots)} {name}: median of {SWEEP_PASSES} passes "
              + ", ".join(f"{v:g}: {ms:.3f}" for v, ms in medians.items()) + " ms/step", flush=True)
    eng.decoder.reset()
    return out


def _profile(eng, slots, seeds, sp, quant: str, steps: int = 5) -> None:
    """Where the GPU time of `steps` graph-replayed decode steps goes (`kernel_timeline`): busy vs
    idle, kernels by time. Each step re-feeds the same position (the work of a real step at this
    length) and reads its tokens back, so the idle share includes the host's time between steps
    that `generate`'s run-ahead hides. Under programmatic dependent launch a kernel's recorded
    duration includes its wait on the one before; AGENTQ_PDL=0 gives each kernel's own time."""
    from torch.profiler import ProfilerActivity, profile

    tokens = [3] * len(slots)
    lens = eng._advance(slots, tokens)
    for _ in range(2):                                   # the bucket's graph captured, kernels warm
        eng.decoder.step(tokens, slots, lens, seeds, sp)
    sync("cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.decoder.step(tokens, slots, lens, seeds, sp)
        torch.cuda.synchronize()
    print_timeline(f"decode steps, quant={quant}, B={len(slots)}, graphs {eng.decoder.graphable}",
                   kernel_timeline(profiled_kernels(prof), steps))


def _fresh_prefill(eng, ctx: list[list[int]]) -> None:
    """One first-turn prefill of the whole batch: the slots freed, fresh episodes (every prompt
    token computed, as in turn 1), one token sampled each."""
    from agentq.rollout import SamplingParams, TurnRequest

    eng.release_all()
    eng.generate([TurnRequest(10_000 + i, c, SamplingParams(max_new_tokens=1), seed=i) for i, c in enumerate(ctx)])


def _time_first_prefill(eng, ctx: list[list[int]], device: str) -> float:
    """Seconds of `_fresh_prefill` (it frees the engine's slots)."""
    sync(device)
    t = time.perf_counter()
    _fresh_prefill(eng, ctx)
    sync(device)
    return time.perf_counter() - t


def _profile_prefill(eng, ctx: list[list[int]], quant: str) -> None:
    """Where the GPU time of one first-turn prefill of the whole batch goes (fresh episodes, one
    new token)."""
    from torch.profiler import ProfilerActivity, profile

    sync("cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _fresh_prefill(eng, ctx)
        torch.cuda.synchronize()
    print_timeline(f"one prefill of {len(ctx)} x {len(ctx[0])} tokens, quant={quant}",
                   kernel_timeline(profiled_kernels(prof)), rows=20)


def _time_decode(eng, slots, seeds, sp, steps: int, device: str, warm: int = 2,
                 fixed_lens: list[int] | None = None) -> float:
    """ms per decode step after `warm` untimed ones (the bucket's graph is captured by the first
    step if it is not yet). Each step appends a token to every episode, or with `fixed_lens`
    re-feeds the same positions, so every step does the same work."""
    tokens = [3] * len(slots)

    def step():
        lens = fixed_lens if fixed_lens is not None else eng._advance(slots, tokens)
        eng.decoder.step(tokens, slots, lens, seeds, sp)
    return 1e3 * time_calls(step, steps, device, warm)


def _time_decode_pipelined(eng, slots, seeds, sp, steps: int, device: str, warm: int = 2) -> float:
    """ms per decode step as `generate` runs them with run-ahead: each step is queued from the
    device (`DecodeRunner.launch_next`) before the host reads the previous step's tokens and does
    its bookkeeping, so host time between steps overlaps the GPU."""
    dec = eng.decoder
    rows, tokens = list(range(len(slots))), [3] * len(slots)
    cur = dec.launch(tokens, slots, eng._advance(slots, tokens), seeds, sp, rows)

    def step(cur):
        nxt = dec.launch_next(cur, rows, sp)
        tok, _ = cur.result()
        eng._advance(slots, tok)
        return nxt
    for _ in range(warm):
        cur = step(cur)
    cur.result()
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        cur = step(cur)
    cur.result()
    sync(device)
    return 1e3 * (time.perf_counter() - t) / steps


def run_hf(model: str, batch: int, prompt: int, new: int, turns: int, group: int = 1) -> dict:
    """HF `generate` with a static cache, bf16, multinomial sampling at T = 1, exactly `new` tokens."""
    from transformers import AutoModelForCausalLM

    max_len = prompt + turns * (new + OBS) + 32
    cfg = qwen3_config(model, max_len)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ctx = torch.tensor(_contexts(batch, prompt, cfg.vocab_size, group), device="cuda")
    kw = dict(do_sample=True, temperature=1.0, top_k=None, top_p=None, max_new_tokens=new, min_new_tokens=new,
              cache_implementation="static", eos_token_id=None, pad_token_id=0,
              disable_compile=True)      # HF would torch.compile the static-cache forward per prompt shape
    with torch.no_grad():
        m.generate(ctx[:, :64], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        turn_s, gen = [], 0
        for _ in range(turns):
            ts = time.perf_counter()
            out = m.generate(ctx, **kw)
            torch.cuda.synchronize()
            turn_s.append(time.perf_counter() - ts)
            gen += batch * new
            obs = torch.full((batch, OBS), 5, device="cuda", dtype=out.dtype)
            ctx = torch.cat([out, obs], 1)
        total = time.perf_counter() - t0
    del m
    _free("cuda")
    return {"engine": "hf_generate", "quant": "bf16", "model": model, "batch": batch, "prompt": prompt,
            "new_tokens": new, "turns": turns, "turn_s": turn_s, "tokens_per_s": gen / total}


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def copy_bandwidth(device: str) -> float:
    """Device-to-device copy, bytes read + written per second (the HBM ceiling used for rooflines)."""
    if device != "cuda":
        return float("nan")
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 10 / (time.perf_counter() - t)
    del x, y
    _free(device)
    return bw


def budget_batch(model: str, quant: str, max_len: int, budget_gib: float) -> int:
    """Episodes whose KV slots (max_len tokens each) fit `budget_gib` of KV memory."""
    from agentq.kernels import QuantSpec
    from agentq.rollout.torch_engine.kv_cache import KVCache

    cfg = qwen3_config(model, max_len)
    probe = KVCache(cfg.num_hidden_layers, 1, cfg.num_key_value_heads, 1, cfg.head_dim, QuantSpec.preset(quant),
                    torch.bfloat16, "meta")
    return int(budget_gib * 2**30 // (probe.bytes_per_token() * max_len))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, nargs="+", default=[16])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF generate baseline")
    ap.add_argument("--eager", action="store_true", help="also run the engines without CUDA graphs")
    ap.add_argument("--kv-budget-gib", type=float, default=None,
                    help="report (and with --at-budget run) the most episodes this much KV memory holds")
    ap.add_argument("--at-budget", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print where the GPU time goes (busy / idle, kernels) in graph-replayed decode steps and one prefill")
    ap.add_argument("--decode-sweep", action="append", default=[], metavar="KNOB=V1,V2",
                    help=f"time the W8A8 decode step per value of a launch knob ({', '.join(SWEEP_KNOBS)})")
    ap.add_argument("--sweep-passes", type=int, default=2, help="--decode-sweep: interleaved passes per value")
    ap.add_argument("--run-ahead", choices=["on", "off", "both"], default="on",
                    help="engines that queue each decode step before reading the last one's tokens (both: A/B)")
    ap.add_argument("--quants", nargs="+", default=["none", "w8a8_kv8"],
                    help="QuantSpec presets to run; each quantized one is compared with `none` (which must be listed)")
    ap.add_argument("--group", type=int, default=1, help="consecutive episodes sharing one prompt (a GRPO group)")
    ap.add_argument("--no-share", action="store_true", help="engines prefill every row (share_prefill=False)")
    ap.add_argument("--prefill-graph-tokens", type=int, default=DEFAULT_PREFILL_GRAPH_TOKENS,
                    help="prefill chunks of at most this many tokens a row replay CUDA graphs (0: eager)")
    ap.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                    help="tokens a row per prefill forward (rollout.prefill_chunk)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.group < 1 or any(b % a.group for b in a.batch):
        raise SystemExit(f"--group {a.group}: must be >= 1 and divide every --batch")
    run_kw = {"group": a.group, "share": not a.no_share, "prefill_graph_tokens": a.prefill_graph_tokens,
              "prefill_chunk": a.prefill_chunk}
    global PROFILE, SWEEP_PASSES
    PROFILE, SWEEP_PASSES = a.profile, a.sweep_passes
    for item in a.decode_sweep:
        name, _, values = item.partition("=")
        _knob(name)                                      # an unknown knob fails before any model is built
        DECODE_SWEEP[name] = [float(v) for v in values.split(",")]
    check_attn_launch_sweep(DECODE_SWEEP)
    swept = sorted(set(DECODE_SWEEP) & {"attn_cuda", "attn_cuda_warps", "attn_cuda_stages"})
    if swept and os.environ.get("AGENTQ_DECODE_ATTN"):
        raise SystemExit(f"--decode-sweep {swept[0]}: AGENTQ_DECODE_ATTN picks the kernel and its launch whatever "
                         "the switch says; unset it")
    if "none" not in a.quants:
        raise SystemExit("--quants: list `none` too (every ratio is against the bf16 engine)")
    cuda = a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    bw = copy_bandwidth(a.device)
    rows = []
    for b in a.batch:
        for q in a.quants:
            for ahead in {"on": (True,), "off": (False,), "both": (True, False)}[a.run_ahead]:
                rows.append(run_engine(a.model, q, b, a.prompt, a.new, a.turns, a.device, dtype, run_ahead=ahead,
                                       **run_kw))
            if a.eager and cuda:
                rows.append(run_engine(a.model, q, b, a.prompt, a.new, a.turns, a.device, dtype, graphs=False, **run_kw))
        if cuda and not a.no_hf:
            rows.append(run_hf(a.model, b, a.prompt, a.new, a.turns, a.group))
    budget = {}
    if a.kv_budget_gib:
        max_len = a.prompt + a.turns * (a.new + OBS) + 32
        budget = {q: budget_batch(a.model, q, max_len, a.kv_budget_gib) for q in ("none", "w8a8_kv8")}
        if a.at_budget:
            for q, b in budget.items():
                r = run_engine(a.model, q, b, a.prompt, a.new, a.turns, a.device, dtype, **run_kw)
                r["at_budget"] = True
                rows.append(r)
    for r in rows:
        if "decode_step_ms" in r and cuda:
            r["roofline_ms"] = 1e3 * (r["weight_bytes"] + r["kv_bytes_read_per_step"]) / bw
    print_table(a, rows, bw, budget)
    write_json(a.json, {"copy_bw": bw, "budget_episodes": budget, "rows": rows, "switches": fast_path_switches()},
               indent=2)


def print_table(a, rows, bw, budget) -> None:
    print(f"\nengine throughput: model={a.model} prompt={a.prompt} new={a.new} × {a.turns} turns (+{OBS}-token "
          f"observations), {a.device}; copy bandwidth {bw / 1e12:.2f} TB/s")
    if a.group > 1:
        print(f"prompts: one per group of {a.group} episodes; engine prefill shared: {not a.no_share}")
    print("switches: " + ", ".join(f"{k}={v}" for k, v in fast_path_switches().items())
          + f"; prefill chunks of ≤ {a.prefill_graph_tokens} tokens a row from CUDA graphs; "
            f"prefill forwards of ≤ {a.prefill_chunk} tokens a row")
    print(f"{'engine':12s} {'quant':13s} {'B':>4s} {'graphs':>6s} {'ahead':>5s} {'tok/s':>9s} {'decode ms':>9s} "
          f"{'pipelined':>9s} {'roofline':>8s} {'KV B/tok':>9s}")
    for r in rows:
        print(f"{r['engine']:12s} {r['quant']:13s} {r['batch']:4d} {str(r.get('graphs', '-')):>6s} "
              f"{str(r.get('run_ahead', '-')):>5s} {r['tokens_per_s']:9.0f} {r.get('decode_step_ms', float('nan')):9.2f} "
              f"{r.get('decode_step_pipelined_ms', float('nan')):9.2f} "
              f"{r.get('roofline_ms', float('nan')):8.2f} {r.get('kv_bytes_per_token', 0):9d}"
              f"{'  (at budget)' if r.get('at_budget') else ''}")
    print("\nratios (same batch; decode step: host-synchronized per step / pipelined as generate runs it):")
    for b in a.batch:
        for ahead in (True, False):
            same = [r for r in rows if r["batch"] == b and not r.get("eager_run") and not r.get("at_budget")
                    and r.get("run_ahead", True) in (ahead, None)]
            for quant in a.quants:
                if quant != "none":
                    _print_ratios(b, ahead, same, quant)
    _print_budget(a, rows, budget)


def _print_ratios(b: int, ahead: bool, rows: list[dict], quant: str) -> None:
    by = {(r["engine"], r["quant"]): r for r in rows}
    q, f, hf = by.get(("agentq", quant)), by.get(("agentq", "none")), by.get(("hf_generate", "bf16"))
    if not (q and f):
        return
    name = "W8A8-KV8" if quant == "w8a8_kv8" else quant
    line = (f"  B={b}{'' if ahead else ' (no run-ahead)'}: {name} vs bf16 engine: decode step "
            f"{f['decode_step_ms'] / q['decode_step_ms']:.2f}× / "
            f"{f['decode_step_pipelined_ms'] / q['decode_step_pipelined_ms']:.2f}× faster, "
            f"tokens/s {q['tokens_per_s'] / f['tokens_per_s']:.2f}×")
    if "roofline_ms" in f:
        line += (f"; bf16 step / its roofline {f['decode_step_ms'] / f['roofline_ms']:.2f}× / "
                 f"{f['decode_step_pipelined_ms'] / f['roofline_ms']:.2f}×")
    if hf:
        line += f"; {name} vs HF generate tokens/s {q['tokens_per_s'] / hf['tokens_per_s']:.2f}×"
    print(line)
    if "turn_s" in q and "turn_s" in f:
        _print_split(q, f)


def time_split(row: dict) -> tuple[float, float]:
    """(first-turn prefill, the rest) seconds of a run's turns: the prefill of the whole batch's
    prompts as timed on its own (`first_prefill_s`), and everything else the turns took (decode
    steps, the later turns' delta prefills, host work between turns)."""
    return row["first_prefill_s"], sum(row["turn_s"]) - row["first_prefill_s"]


def _print_split(q: dict, f: dict, target: float = 1.5) -> None:
    """Where the tokens/s ratio comes from: the two parts' ratios, and what the quantized run's
    total would have to be for `target`."""
    (qp, qr), (fp, fr) = time_split(q), time_split(f)
    need = sum(f["turn_s"]) / target
    print(f"    time split: first-turn prefill {fp:.2f} s → {qp:.2f} s ({fp / qp:.2f}×), decode + the rest "
          f"{fr:.2f} s → {qr:.2f} s ({fr / qr:.2f}×); tokens/s {target}× needs {need:.2f} s in all (has {qp + qr:.2f})")


def _print_budget(a, rows, budget) -> None:
    if budget:
        at = {r["quant"]: r for r in rows if r.get("at_budget")}
        line = (f"  KV budget {a.kv_budget_gib} GiB: bf16 holds {budget['none']} episodes, int8 KV "
                f"{budget['w8a8_kv8']} ({budget['w8a8_kv8'] / max(budget['none'], 1):.2f}×)")
        if len(at) == 2:
            line += (f"; tokens/s at those batches {at['w8a8_kv8']['tokens_per_s'] / at['none']['tokens_per_s']:.2f}×")
        print(line)


if __name__ == "__main__":
    main()
