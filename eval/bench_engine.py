"""Rollout-engine throughput: the built-in engine with `quant=none` (bf16 on GPU, fp32 on CPU) vs
`quant=w8a8_kv8`, on the same random-weight model, in one run (ratios measured side by side).

A batch of B episodes: a P-token prompt is prefilled, then N tokens are decoded per episode (no
stop token), then a second turn appends a 64-token observation and decodes N more (delta
prefill). Reports tokens/s over the whole batch, decode step time and KV bytes per token.

    python eval/bench_engine.py --model 8b --batch 64 --prompt 2048 --new 128     # H200
    python eval/bench_engine.py --model tiny --batch 16 --prompt 512 --new 32     # CPU
"""
from __future__ import annotations

import argparse
import json
import time

import torch

SHAPES = {  # Qwen3-style configs (random weights: throughput does not depend on their values)
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=1024),
    "1b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
               num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=151936),
}


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


PROFILE = False


def run(model: str, quant: str, batch: int, prompt: int, new: int, device: str, dtype: torch.dtype) -> dict:
    from transformers import Qwen3Config

    from agentq.kernels import QuantSpec
    from agentq.rollout import SamplingParams, TurnRequest
    from agentq.rollout.torch_engine.engine import TorchEngine

    cfg = Qwen3Config(**SHAPES[model], max_position_embeddings=prompt + 2 * new + 256, tie_word_embeddings=False)
    eng = TorchEngine(cfg, QuantSpec.preset(quant), max_slots=batch, max_len=prompt + 2 * new + 128, dtype=dtype,
                      device=device)
    eng.update_weights(random_weights(eng), version=0)
    sp = SamplingParams(max_new_tokens=new)
    vocab = cfg.vocab_size
    ctx = [[(7 * j + 13 * i) % (vocab - 1) + 1 for j in range(prompt)] for i in range(batch)]
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    # warm-up (kernel compilation / autotune) on a short batch
    eng.generate([TurnRequest(10_000 + i, c[:64], SamplingParams(max_new_tokens=4), seed=i) for i, c in enumerate(ctx)])
    eng.release_all()
    sync()
    t0 = time.perf_counter()
    r1 = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(ctx)])
    sync()
    t1 = time.perf_counter()
    ctx2 = [c + r.token_ids + [5] * 64 for c, r in zip(ctx, r1)]
    r2 = eng.generate([TurnRequest(i, c, sp, seed=i) for i, c in enumerate(ctx2)])
    sync()
    t2 = time.perf_counter()
    # decode-only timing: one more token for every episode, repeated
    steps = 16
    sync()
    t3 = time.perf_counter()
    for _ in range(steps):
        eng._decode(list(range(batch)), [3] * batch)
    sync()
    t4 = time.perf_counter()
    gen = sum(len(r.token_ids) for r in r1 + r2)
    if PROFILE and device == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                eng._decode(list(range(batch)), [3] * batch)
            torch.cuda.synchronize()
        print(f"--- profile of 4 decode steps, quant={quant}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=60))
    return {"model": model, "quant": quant, "batch": batch, "prompt": prompt, "new_tokens": new,
            "turn1_s": t1 - t0, "turn2_s": t2 - t1, "tokens_per_s": gen / (t2 - t0),
            "decode_step_ms": 1e3 * (t4 - t3) / steps, "kv_bytes_per_token": eng.kv_bytes_per_token()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true", help="print torch profiler tables of decode steps")
    a = ap.parse_args()
    global PROFILE
    PROFILE = a.profile
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    rows = [run(a.model, q, a.batch, a.prompt, a.new, a.device, dtype) for q in ("none", "w8a8_kv8")]
    base = rows[0]
    print(f"engine throughput: model={a.model} B={a.batch} prompt={a.prompt} new={a.new}×2 turns, {a.device} {dtype}")
    print(f"{'quant':10s} {'tok/s':>10s} {'turn1 s':>9s} {'turn2 s':>9s} {'decode ms':>10s} {'KV B/tok':>10s}")
    for r in rows:
        print(f"{r['quant']:10s} {r['tokens_per_s']:10.1f} {r['turn1_s']:9.3f} {r['turn2_s']:9.3f} "
              f"{r['decode_step_ms']:10.2f} {r['kv_bytes_per_token']:10d}")
    q = rows[1]
    print(f"w8a8_kv8 / baseline: throughput {q['tokens_per_s'] / base['tokens_per_s']:.2f}×, decode step "
          f"{base['decode_step_ms'] / q['decode_step_ms']:.2f}×, KV bytes {q['kv_bytes_per_token'] / base['kv_bytes_per_token']:.3f}×")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
