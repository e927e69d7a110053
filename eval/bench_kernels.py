#!/usr/bin/env python3
"""H200 benchmark (and GPU checks) for agentq's Triton kernels vs bf16 cuBLAS / torch SDPA.

One run prints, as ratios against baselines measured in the same run:

* W8A8 linear (fused per-token quant + int8 GEMM with fused rescale) vs bf16 `F.linear` (cuBLAS)
  for the four Llama-3-8B decoder-layer linears (qkv 4096->6144, o 4096->4096, gate_up
  4096->28672, down 14336->4096) at M = 1, 16, 64, 256, and their sum per decoder layer;
* int8-KV decode attention (Triton) vs bf16 `F.scaled_dot_product_attention` (enable_gqa, the
  fastest backend that runs) at Hq 32, Hkv 8, D 128 and B x L in {64x4096, 256x4096, ...};
* KV-cache bytes per token, int8 (+ fp32 scales) vs bf16.

Every timing is a CUDA graph replay timed by `triton.testing.do_bench` (median; L2 flushed before
each replay); linears rotate over enough weight copies (>= 256 MB) that no weight is read from L2.

    python -m agentq.eval.bench_kernels --tune --check --out $OUT      # tuning sweep, GPU tests, benchmark
    python -m agentq.eval.bench_kernels                                # benchmark with the built-in tables
    python -m agentq.eval.bench_kernels --learner-norms                # the learner's RMSNorm only (~20 s)
    python -m agentq.eval.bench_kernels --attn-reads                   # decode attention's reads alone vs the kernel
    python -m agentq.eval.bench_kernels --int-mm decode                # cuBLASLt int8 vs Triton at decode rows
    python -m agentq.eval.bench_kernels --spread --write-table         # decode qkv / gate_up over all SMs

Other single-purpose modes (`--glu`, `--partials`, `--rope`, `--prefill`, ...): `--help`.

Needs the package installed (`pip install -e .`, as for every script in eval/).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from agentq.kernels import quant
from agentq.kernels._interp import HAVE_TRITON as HAVE_TRITON_JIT
from agentq.kernels.quant_spec import QuantSpec

REPO = Path(__file__).resolve().parents[1]      # the checkout (--check runs its tests/kernels/)

SPEC = QuantSpec()
LLAMA8B = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
#: (K, N) of the linears each model runs: the engine's fused decode-layer linears, and the learner's
#: per-projection ones (HF modules: q, k, v, gate, up apart); `--models` picks what `--tune gemm` sweeps
MODEL_LINEARS = {
    "llama3-8b": LLAMA8B,
    "qwen3-8b": {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)},
    "qwen3-4b": {"qkv": (2560, 6144), "o": (4096, 2560), "gate_up": (2560, 19456), "down": (9728, 2560)},
    "qwen3-1.7b": {"qkv": (2048, 4096), "o": (2048, 2048), "gate_up": (2048, 12288), "down": (6144, 2048)},
    "qwen3-0.6b": {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024)},
    # the LM heads of preset w8a8_kv8_head (vocabulary 151,936): `--tune gemm --models qwen3-lm-heads`
    "qwen3-lm-heads": {"head-8b": (4096, 151936), "head-4b": (2560, 151936), "head-1.7b": (2048, 151936),
                       "head-0.6b": (1024, 151936)},
    "learner-qwen3-8b": {"q": (4096, 4096), "kv": (4096, 1024), "gate": (4096, 12288), "down": (12288, 4096)},
    "learner-qwen3-1.7b": {"q": (2048, 2048), "kv": (2048, 1024), "gate": (2048, 6144), "down": (6144, 2048)},
}
MS = (1, 16, 64, 256)
ROTATE_BYTES = 256e6


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------- timing
def graph_us(fns, rep_ms: float = 60.0, warmup_ms: float = 15.0) -> float:
    """Median µs of one CUDA-graph replay of `fns` called in order (captured by the engine's
    `capture_graph`, after its eager warm-up runs)."""
    import triton

    from agentq.rollout.torch_engine.decode import capture_graph
    g, _ = capture_graph(lambda: [f() for f in fns], None)
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(g.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    del g
    return ms * 1e3


def copies_for(nbytes: int) -> int:
    return int(min(16, max(2, math.ceil(ROTATE_BYTES / nbytes))))


# ---------------------------------------------------------------------- linears
class LinearShape:
    def __init__(self, name, k, n, dev):
        self.name, self.k, self.n = name, k, n
        g = torch.Generator(device=dev).manual_seed(hash(name) % 1000)
        self.n_bf16 = copies_for(2 * n * k)
        self.n_int8 = copies_for(n * k)
        self.w_bf16 = [torch.randn(n, k, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
                       for _ in range(self.n_bf16)]
        self.w_q, self.s_w = [], []
        for i in range(self.n_int8):
            wq, sw = quant.quantize_weight(self.w_bf16[i % self.n_bf16], SPEC)
            if i >= self.n_bf16:      # distinct buffers, same values
                wq = wq.clone()
            self.w_q.append(wq)
            self.s_w.append(sw)


def gemm_candidates(m: int):
    from agentq.kernels.triton_gemm import GemmConfig
    if m <= 16:
        tiles = [(16, 32, 256, 4, 4), (16, 64, 128, 4, 5), (16, 64, 256, 4, 4), (16, 64, 512, 4, 3),
                 (16, 128, 256, 4, 4), (16, 64, 256, 4, 6)]
        splits = (1, 2, 4, 8, 16)
    elif m <= 64:
        # narrow N tiles: at decode M a 4096-wide output has only 64 tiles of 64 for 132 SMs
        tiles = [(64, 64, 256, 4, 4), (64, 128, 128, 4, 4), (64, 128, 256, 8, 3), (32, 64, 256, 4, 4),
                 (64, 256, 128, 8, 3), (64, 32, 256, 4, 4), (64, 32, 256, 4, 6), (64, 32, 512, 4, 3),
                 (64, 16, 256, 4, 6), (64, 16, 512, 4, 4), (64, 64, 256, 4, 6), (64, 64, 512, 4, 3),
                 (64, 32, 128, 4, 8)]
        splits = (1, 2, 4, 8)
    elif m <= 128:
        tiles = [(128, 128, 128, 8, 3), (64, 128, 256, 4, 3), (128, 64, 128, 4, 4), (64, 64, 256, 4, 4),
                 (128, 32, 256, 4, 4), (128, 64, 256, 4, 4), (128, 32, 256, 4, 5), (128, 64, 256, 8, 3),
                 (64, 32, 256, 4, 5)]
        splits = (1, 2)
    elif m >= 2048:
        # prefill / learner rows: compute-bound, no split-K (thousands of output tiles); the
        # persistent TMA kernel (p1), its flattened tile loop (p2) and warp-specialized (p3)
        # against the plain one
        for bm, bn, bk, w, st, p in ((128, 128, 128, 8, 3, 0), (256, 128, 128, 8, 3, 0),
                                     (128, 128, 128, 8, 3, 1), (128, 128, 128, 8, 4, 1), (128, 256, 128, 8, 3, 1),
                                     (256, 128, 128, 8, 3, 1), (128, 128, 128, 8, 3, 2), (128, 128, 128, 8, 4, 2),
                                     (128, 256, 128, 8, 3, 2), (256, 128, 128, 8, 3, 2), (128, 256, 64, 8, 4, 2),
                                     (256, 128, 64, 8, 4, 2), (128, 256, 128, 8, 4, 2), (256, 128, 128, 8, 4, 2),
                                     (128, 256, 64, 8, 6, 2), (128, 128, 128, 8, 4, 3), (128, 256, 128, 8, 3, 3),
                                     (256, 128, 128, 8, 3, 3)):
            yield GemmConfig(bm, bn, bk, 1, 8, w, st, p)
        return
    else:
        tiles = [(128, 128, 128, 8, 3), (128, 128, 128, 8, 4), (128, 128, 128, 4, 4), (64, 128, 128, 4, 4),
                 (64, 128, 256, 4, 3), (128, 256, 128, 8, 3), (64, 256, 128, 8, 3), (128, 64, 128, 4, 4),
                 (128, 128, 64, 4, 5)]
        splits = (1, 2, 4)
    for bm, bn, bk, w, st in tiles:
        for sp in splits:
            yield GemmConfig(bm, bn, bk, sp, 8, w, st)


def tune_gemm(shapes, dev, results, deadline: float = float("inf"), ms=MS):
    from agentq.kernels import triton_gemm as tg
    from agentq.kernels import triton_quant as tq
    table = {}
    for sh in shapes:
        rows = [(m, c) for m, c in tg.H200_TABLE.get((sh.n, sh.k), []) if m not in ms]
        for m in ms:
            x = torch.randn(m, sh.k, device=dev, dtype=torch.bfloat16)
            x_q, s_x = tq.quantize_per_token(x, SPEC)
            best = None
            for cfg in gemm_candidates(m):
                if best is not None and time.time() > deadline:
                    break
                programs = -(-m // cfg.block_m) * -(-sh.n // cfg.block_n) * cfg.split_k
                k_tiles = -(-sh.k // cfg.block_k)
                if cfg.split_k > 1 and (programs > 4096 or k_tiles // cfg.split_k < 2):
                    continue
                if cfg.split_k == 1 and programs < 16:
                    continue
                if cfg.split_k > 1 and programs >= 2 * 132:      # enough tiles already: split-K only adds work
                    continue
                try:
                    us = graph_us([partial(tg.int8_gemm, x_q, s_x, sh.w_q[i], sh.s_w[i], None, torch.bfloat16, cfg)
                                   for i in range(sh.n_int8)], rep_ms=25, warmup_ms=5) / sh.n_int8
                except Exception as e:    # e.g. out of shared memory for this tile
                    log(f"  skip {cfg.short()}: {type(e).__name__}: {str(e)[:80]}")
                    continue
                results.setdefault("tune_gemm", []).append({"shape": sh.name, "M": m, "cfg": cfg.short(), "us": us})
                if best is None or us < best[0]:
                    best = (us, cfg)
            log(f"tune {sh.name:8s} M={m:4d}: best {best[1].short()} {best[0]:.1f} us")
            rows.append((m, best[1]))
        table[(sh.n, sh.k)] = sorted(rows, key=lambda r: r[0])
    tg.H200_TABLE.update(table)
    # rows for kernels/h200_gemm.json ("gemm" section): paste or merge them there
    rows_json = {f"{n}x{k}": [[m, c.table_row()] for m, c in rows] for (n, k), rows in table.items()}
    text = json.dumps(rows_json)
    log(f"h200_gemm.json rows: {text}")
    results["gemm_table"] = rows_json


def glu_candidates(m: int):
    """`int8_gemm_glu` launches to sweep (block_n counts paired rows: half of them gate columns)."""
    from agentq.kernels.triton_gemm import GemmConfig
    if m >= 2048:
        for bm, bn, bk, w, st, p in ((256, 128, 128, 8, 3, 2), (128, 256, 128, 8, 3, 2), (128, 128, 128, 8, 3, 2),
                                     (128, 256, 128, 8, 3, 1), (256, 128, 128, 8, 3, 1), (128, 128, 128, 8, 4, 2),
                                     (128, 256, 64, 8, 4, 2), (256, 128, 128, 8, 3, 0)):
            yield GemmConfig(bm, bn, bk, 1, 8, w, st, p)
        return
    for bn, bk, w, st in ((64, 256, 4, 4), (64, 128, 4, 6), (128, 128, 4, 4), (128, 256, 4, 3), (32, 256, 4, 6),
                          (64, 512, 4, 3), (128, 256, 8, 3), (256, 128, 8, 3)):
        yield GemmConfig(128 if m > 64 else 64, bn, bk, 1, 8, w, st)


def bench_glu(dev, results, models=("qwen3-8b", "qwen3-1.7b"), ms=(64, 128, 32768), tune: bool = True):
    """The gate_up GEMM with SiLU·mul in its epilogue + the one-read codes (`int8_gemm_glu` on
    paired rows, `quantize_rows_from_amax`) against what it replaces (the stacked gate_up GEMM,
    then `silu_mul_quant`), and bf16 cuBLAS + `silu_mul` for scale; with `tune`, a sweep of GLU
    launches per M whose best rows would go to h200_gemm.json's "glu" section (by paired rows)."""
    from agentq.kernels import triton_gemm as tg
    from agentq.kernels import triton_norm as tn
    from agentq.kernels import triton_quant as tq
    floor, rounding = SPEC.act_scale_floor, SPEC.act_rounding
    log("\n== gate_up + SiLU·mul + codes: GLU GEMM vs GEMM then silu_mul_quant (µs per call) ==")
    table = {}
    for model in models:
        k, n2 = MODEL_LINEARS[model]["gate_up"]
        n = n2 // 2
        sh = LinearShape(f"{model}:gate_up", k, n2, dev)
        paired = [(tg.glu_pair_rows(w), tg.glu_pair_rows(s)) for w, s in zip(sh.w_q, sh.s_w)]
        rows = []
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            x_q, s_x = tq.quantize_per_token(x, SPEC)
            reps = max(1, min(sh.n_int8, 4 if m >= 2048 else sh.n_int8))

            def two_launch(i, cfg=None):
                gu = tg.int8_gemm(x_q, s_x, sh.w_q[i], sh.s_w[i], None, torch.bfloat16, cfg)
                tn.silu_mul_quant(gu[:, :n], gu[:, n:], floor, rounding)

            def glu(i, cfg=None):
                h, amax = tg.int8_gemm_glu(x_q, s_x, *paired[i], None, torch.bfloat16, cfg)
                tq.quantize_rows_from_amax(h, amax, floor, rounding)

            def bf16(i):
                gu = F.linear(x, sh.w_bf16[i % sh.n_bf16])
                tn.silu_mul(gu[:, :n], gu[:, n:])

            t_two = graph_us([partial(two_launch, i) for i in range(reps)]) / reps
            t_glu = graph_us([partial(glu, i) for i in range(reps)]) / reps
            t_bf16 = graph_us([partial(bf16, i) for i in range(min(reps, sh.n_bf16))]) / min(reps, sh.n_bf16)
            best = (t_glu, tg.glu_config(m, n2, k, dev))
            if tune:
                for cfg in glu_candidates(m):
                    try:
                        us = graph_us([partial(glu, i, cfg) for i in range(reps)], rep_ms=25, warmup_ms=5) / reps
                    except Exception as e:    # e.g. out of shared memory for this tile
                        log(f"  skip {cfg.short()}: {type(e).__name__}: {str(e)[:80]}")
                        continue
                    results.setdefault("tune_glu", []).append({"shape": sh.name, "M": m, "cfg": cfg.short(), "us": us})
                    if us < best[0]:
                        best = (us, cfg)
                rows.append([m, best[1].table_row()])
            row = {"shape": sh.name, "M": m, "two_launch_us": t_two, "glu_us": t_glu, "bf16_us": t_bf16,
                   "best_cfg": best[1].short(), "best_us": best[0]}
            results.setdefault("glu", []).append(row)
            log(f"{sh.name:18s} M={m:6d}: GEMM + silu_mul_quant {t_two:9.1f}  GLU {t_glu:9.1f} "
                f"({t_two / t_glu:.2f}x)  best {best[1].short()} {best[0]:9.1f}  | bf16 + silu_mul {t_bf16:9.1f}")
        if rows:
            table[f"{n2}x{k}"] = rows
        del sh, paired
        torch.cuda.empty_cache()
    if table:
        log(f"h200_gemm.json glu rows: {json.dumps(table)}")
        results["glu_table"] = table


def table_json(raw: dict) -> str:
    """h200_gemm.json's text: sections by shape, one [max_M, config] row per line."""
    out = []
    for key, val in raw.items():
        if not isinstance(val, dict):
            out.append(f" {json.dumps(key)}: {json.dumps(val, ensure_ascii=False)}")
            continue
        shapes = [f"  {json.dumps(shape)}: [" + ",".join(f"\n   {json.dumps(r)}" for r in rows) + ("\n  ]" if rows else "]")
                  for shape, rows in val.items()]
        out.append(f" {json.dumps(key)}: " + ("{\n" + ",\n".join(shapes) + "\n }" if shapes else "{}"))
    return "{\n" + ",\n".join(out) + "\n}\n"


def partials_candidates(m: int, n: int, k: int, wide: bool = False):
    """`int8_gemm_partials` launches to sweep at decode rows: wider weight tiles than the one-split
    GEMM's, K split so that ~100-270 programs run (132 SMs), each split at least two K steps.
    wide: instead, splits whose programs fit two or more to an SM (200-600 programs, ≥ 85 % of
    the last wave filled) and 512-byte K steps: more weight bytes in flight per SM."""
    from agentq.kernels.triton_gemm import GemmConfig
    bm = 64
    if wide:
        for bn in (16, 32, 64, 128):
            for bk in (128, 256, 512):
                for stages in (3, 4, 5, 6, 8):
                    smem = (bm + bn) * bk * stages
                    per_sm = max(1, (227 << 10) // (smem + 1024))
                    for split in (2, 3, 4, 6, 8):
                        programs = -(-m // bm) * -(-n // bn) * split
                        slots = 132 * per_sm
                        filled = programs / (-(-programs // slots) * slots)
                        if not (40 << 10) <= smem <= (200 << 10) or k // bk < 2 * split or filled < 0.85:
                            continue
                        if (per_sm >= 2 and 200 <= programs <= 600) or (bk == 512 and stages in (3, 4)
                                                                        and 96 <= programs <= 600):
                            yield GemmConfig(bm, bn, bk, split, 8, 4, stages)
        return
    for bn, bk, warps, stages in ((32, 256, 4, 6), (64, 256, 4, 4), (64, 256, 4, 5), (64, 128, 4, 8),
                                  (128, 256, 4, 3), (128, 256, 4, 4), (128, 128, 4, 6), (256, 128, 8, 4)):
        for split in (2, 3, 4, 6, 8):
            programs = -(-m // bm) * -(-n // bn) * split
            if 96 <= programs <= 270 and k // bk >= 2 * split:
                yield GemmConfig(bm, bn, bk, split, 8, warps, stages)


def merged_rows(current, new: dict[int, list]) -> list[list]:
    """A table shape's rows as h200_gemm.json lists them ([max_M, config row], by M): the
    `current` (max_M, GemmConfig) rows with the measured `new` ones ({max_M: config row}) in
    place of those of the same M."""
    rows = {mm: c.table_row() for mm, c in current}
    rows.update(new)
    return [[mm, row] for mm, row in sorted(rows.items())]


def bench_partials(dev, results, models=("qwen3-8b", "qwen3-1.7b"), ms=(64, 128), tune: bool = True,
                   write_table: bool = False, deadline: float = float("inf"), wide: bool = False):
    """The o / down GEMM handing int32 partial sums over K slices to the residual add + RMSNorm (+
    codes) after it (`int8_gemm_partials` + `add_rms_norm` of `PartialSums`) against the GEMM with
    its epilogue + the same norm, the pair a decode step runs, in µs per pair. With `tune`, a
    sweep of split launches per M; a config that beats the one-split pair by 3 % or more becomes
    a row of h200_gemm.json's "partials" section (`write_table`: written to the installed
    table, which later processes load), a row with split 1 where none does (no split). wide:
    `partials_candidates(wide=True)` at M 64 for Qwen3-8B o / down and Qwen3-1.7B down, the
    table's current row counted as a candidate (rows for other M are kept)."""
    from agentq.kernels import triton_gemm as tg
    from agentq.kernels import triton_norm as tn
    from agentq.kernels import triton_quant as tq
    quant_args = (SPEC.act_scale_floor, SPEC.act_rounding)
    log("\n== o / down GEMM + residual add + RMSNorm + codes: partial sums vs the GEMM's epilogue (µs per pair) ==")
    table = {}
    cases = [("qwen3-8b", "o"), ("qwen3-8b", "down"), ("qwen3-1.7b", "down")] if wide else \
        [(model, lin) for model in models for lin in ("o", "down")]
    ms = (64,) if wide else ms
    for i_case, (model, lin) in enumerate(cases):
        k, n = MODEL_LINEARS[model][lin]
        sh = LinearShape(f"{model}:{lin}", k, n, dev)
        case_deadline = time.time() + (deadline - time.time()) / (len(cases) - i_case)   # the budget left, shared
        weight = torch.ones(n, device=dev, dtype=torch.bfloat16)
        rows = []
        for m in ms:
            x_q, s_x = tq.quantize_per_token(torch.randn(m, k, device=dev, dtype=torch.bfloat16), SPEC)
            resid = torch.randn(m, n, device=dev, dtype=torch.bfloat16)

            def base(i):
                y = tg.int8_gemm(x_q, s_x, sh.w_q[i], sh.s_w[i], None, torch.bfloat16)
                tn.add_rms_norm(resid, y, weight, 1e-6, quant_args)

            def split(i, cfg):
                ps = tg.int8_gemm_partials(x_q, s_x, sh.w_q[i], sh.s_w[i], None, torch.bfloat16, cfg)
                tn.add_rms_norm(resid, ps, weight, 1e-6, quant_args)

            reps = sh.n_int8
            t_base = graph_us([partial(base, i) for i in range(reps)]) / reps
            current = tg.partials_config(m, n, k)
            t_cur = (graph_us([partial(split, i, current) for i in range(reps)]) / reps
                     if current is not None and current.split_k > 1 else None)
            best = (t_cur, current) if wide and t_cur is not None else None
            if tune:
                for cfg in partials_candidates(m, n, k, wide):
                    if best is not None and time.time() > case_deadline:
                        break
                    try:
                        us = graph_us([partial(split, i, cfg) for i in range(reps)], rep_ms=25,
                                      warmup_ms=5) / reps
                    except Exception as e:    # e.g. out of shared memory for this tile
                        log(f"  skip {cfg.short()}: {type(e).__name__}: {str(e)[:80]}")
                        continue
                    results.setdefault("tune_partials", []).append(
                        {"shape": sh.name, "M": m, "cfg": cfg.short(), "us": us})
                    if best is None or us < best[0]:
                        best = (us, cfg)
                keep = best is not None and best[0] <= 0.97 * t_base
                plain = dataclasses.replace(tg.pick_config(m, n, k, dev), split_k=1, persistent=0)
                rows.append([m, (best[1] if keep else plain).table_row()])
            row = {"shape": sh.name, "M": m, "one_split_us": t_base, "table_us": t_cur,
                   "best_cfg": best[1].short() if best else None, "best_us": best[0] if best else None}
            results.setdefault("partials", []).append(row)
            log(f"{sh.name:16s} M={m:4d}: GEMM + norm {t_base:7.1f}"
                + (f"  table partials {t_cur:7.1f} ({t_base / t_cur:.2f}x)" if t_cur else "")
                + (f"  best {best[1].short()} {best[0]:7.1f} ({t_base / best[0]:.2f}x)" if best else ""))
        if rows and wide:        # this M's row replaced, the others kept
            table[f"{n}x{k}"] = merged_rows(tg.H200_PARTIALS_TABLE.get((n, k), []), dict(rows))
        elif rows:
            # decode batches below the measured M keep the one-split GEMM (split 1: no partials)
            first = dataclasses.replace(tg.pick_config(min(ms) // 2, n, k, dev), split_k=1, persistent=0)
            table[f"{n}x{k}"] = [[min(ms) // 2, first.table_row()]] + rows
        del sh
        torch.cuda.empty_cache()
    if table:
        log(f"h200_gemm.json partials rows: {json.dumps(table)}")
        results["partials_table"] = table
        if write_table:
            raw = json.loads(tg.TABLE_FILE.read_text())
            raw.setdefault("partials", {}).update(table)
            tg.TABLE_FILE.write_text(table_json(raw))
            log(f"wrote the partials rows to {tg.TABLE_FILE}")


def spread_candidates(m: int, n: int):
    """Spread-column launches (`GemmConfig.spread`, `triton_gemm.column_split`) to sweep for an
    [n, K] weight at decode rows: one or two column programs per SM, each a power-of-two tile
    1-4x as wide as its columns (wider tiles waste loads nothing and MMA work little)."""
    from agentq.kernels.triton_gemm import GemmConfig, column_split
    bms = (64, 128) if m > 64 else (64,)
    for spread in (1, 2):
        for bn, bk, warps, stages in ((32, 256, 4, 6), (64, 256, 4, 4), (64, 256, 4, 6), (64, 128, 4, 8),
                                      (128, 128, 4, 4), (128, 256, 4, 3), (128, 128, 8, 5), (256, 128, 8, 3),
                                      (256, 128, 8, 4), (256, 64, 8, 6)):
            cols, _ = column_split(n, GemmConfig(64, bn, bk, spread=spread), 132)
            if cols == bn or not cols <= bn < 4 * cols:   # == bn: the plain launch, measured as the table's
                continue
            for bm in bms:
                if (bm * bk + bn * bk) * stages <= 200 << 10:
                    yield GemmConfig(bm, bn, bk, 1, 8, warps, stages, 0, spread)


def bench_spread(dev, results, models=("qwen3-8b", "qwen3-1.7b"), ms=(64, 128), write_table: bool = False,
                 deadline: float = float("inf")):
    """The qkv GEMM and the gate_up GEMM with SiLU·mul (+ the codes from its row absmaxes) at decode
    rows: the table's launch against launches whose columns spread evenly over the SMs
    (`spread_candidates`), in µs per call. A launch 3 % or more faster becomes the row for that M
    of h200_gemm.json's "gemm" (qkv) / "glu" (gate_up, keyed by paired rows) section
    (`write_table`: written to the installed table, which later processes load). The sweep stops
    at `deadline`, each case given an even share of the time left."""
    from agentq.kernels import triton_gemm as tg
    from agentq.kernels import triton_quant as tq
    floor, rounding = SPEC.act_scale_floor, SPEC.act_rounding
    cases_left = len(models) * 2 * len(ms)
    log("\n== qkv / gate_up (GLU) GEMMs at decode rows: the table's launch vs spread columns (µs per call) ==")
    gemm_rows: dict[str, dict[int, list]] = {}
    glu_rows: dict[str, dict[int, list]] = {}
    for model in models:
        for lin in ("qkv", "gate_up"):
            k, n = MODEL_LINEARS[model][lin]
            sh = LinearShape(f"{model}:{lin}", k, n, dev)
            glu = lin == "gate_up"
            weights = [(tg.glu_pair_rows(w), tg.glu_pair_rows(s)) if glu else (w, s) for w, s in zip(sh.w_q, sh.s_w)]
            for m in ms:
                x_q, s_x = tq.quantize_per_token(torch.randn(m, k, device=dev, dtype=torch.bfloat16), SPEC)

                def call(i, cfg):
                    if glu:
                        h, amax = tg.int8_gemm_glu(x_q, s_x, *weights[i], None, torch.bfloat16, cfg)
                        tq.quantize_rows_from_amax(h, amax, floor, rounding)
                    else:
                        tg.int8_gemm(x_q, s_x, *weights[i], None, torch.bfloat16, cfg)

                table_cfg = tg.glu_config(m, n, k, dev) if glu else tg.pick_config(m, n, k, dev)
                reps = sh.n_int8
                t_table = graph_us([partial(call, i, table_cfg) for i in range(reps)]) / reps
                best = (t_table, table_cfg)
                case_deadline = time.time() + (deadline - time.time()) / cases_left
                cases_left -= 1
                for cfg in spread_candidates(m, n):
                    if time.time() > case_deadline:
                        log(f"  {sh.name} M={m}: out of time, the other candidates not measured")
                        break
                    try:
                        us = graph_us([partial(call, i, cfg) for i in range(reps)], rep_ms=25, warmup_ms=5) / reps
                    except Exception as e:    # e.g. out of shared memory for this tile
                        log(f"  skip {cfg.short()}: {type(e).__name__}: {str(e)[:80]}")
                        continue
                    results.setdefault("tune_spread", []).append({"shape": sh.name, "M": m, "cfg": cfg.short(),
                                                                   "us": us})
                    if us < best[0]:
                        best = (us, cfg)
                keep = best[0] <= 0.97 * t_table
                if keep:
                    (glu_rows if glu else gemm_rows).setdefault(f"{n}x{k}", {})[m] = best[1].table_row()
                gbs = n * k / (best[0] * 1e3)
                results.setdefault("spread", []).append({"shape": sh.name, "M": m, "table_cfg": table_cfg.short(),
                                                         "table_us": t_table, "best_cfg": best[1].short(),
                                                         "best_us": best[0], "kept": keep})
                log(f"{sh.name:18s} M={m:4d}: table {table_cfg.short():26s} {t_table:7.1f}   best "
                    f"{best[1].short():30s} {best[0]:7.1f} ({t_table / best[0]:.2f}x, {gbs:.0f} GB/s of weights)"
                    + ("" if keep else "  (not kept)"))
            del sh, weights
            torch.cuda.empty_cache()
    _write_spread_rows(gemm_rows, glu_rows, results, write_table)


def _write_spread_rows(gemm_rows, glu_rows, results, write_table: bool):
    """Merge `bench_spread`'s kept rows per M into the "gemm" / "glu" sections (other M kept; glu
    rows below the smallest kept M keep the plain GEMM's launch) and print / write them."""
    from agentq.kernels import triton_gemm as tg
    raw = json.loads(tg.TABLE_FILE.read_text())
    # glu first: its rows below the kept ones are the plain launch as it was before this sweep
    for section, rows, table in (("glu", glu_rows, tg.H200_GLU_TABLE), ("gemm", gemm_rows, tg.H200_TABLE)):
        for key, by_m in rows.items():
            n, k = (int(v) for v in key.split("x"))
            current = table.get((n, k), [])
            if section == "glu" and not current:
                low = min(by_m) // 2
                current = [(low, dataclasses.replace(tg.pick_config(low, n, k), split_k=1))]
            rows_json = merged_rows(current, by_m)
            raw.setdefault(section, {})[key] = rows_json
            table[(n, k)] = [(mm, tg.GemmConfig(*row)) for mm, row in rows_json]
    results["spread_table"] = {"gemm": {key: raw["gemm"][key] for key in gemm_rows},
                               "glu": {key: raw["glu"][key] for key in glu_rows}}
    log(f"h200_gemm.json rows changed: {json.dumps(results['spread_table'])}")
    if write_table:
        tg.TABLE_FILE.write_text(table_json(raw))
        log(f"wrote the rows to {tg.TABLE_FILE}")


def bench_int_mm(dev, results, m: int = 32768):
    """cuBLASLt's int8 GEMM (`torch._int_mm`, int32 out, no epilogue) against the Triton W8A8 GEMM
    (fused epilogue, bf16 out) and cuBLAS bf16 at prefill rows, Qwen3-8B shapes: whether a vendor
    int8 GEMM with the epilogue moved into its consumer could beat Triton's ~60 % of the int8 peak."""
    from agentq.kernels import triton_gemm as tg
    from agentq.kernels import triton_quant as tq
    log(f"\n== int8 GEMM at M = {m}: torch._int_mm (int32 out) vs Triton W8A8 (bf16 out) vs bf16 cuBLAS ==")
    for name, (k, n) in MODEL_LINEARS["qwen3-8b"].items():
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        x_q, s_x = tq.quantize_per_token(x, SPEC)
        w_q, s_w = quant.quantize_weight(w, SPEC)
        w_qt = w_q.t()
        t_mm = graph_us([lambda: torch._int_mm(x_q, w_qt)])
        t_tr = graph_us([lambda: tg.int8_gemm(x_q, s_x, w_q, s_w, None, torch.bfloat16)])
        t_bf = graph_us([lambda: F.linear(x, w)])
        tera = 2 * m * n * k / 1e12
        row = {"shape": name, "M": m, "int_mm_us": t_mm, "triton_us": t_tr, "bf16_us": t_bf}
        results.setdefault("int_mm", []).append(row)
        log(f"{name:8s} N={n:6d} K={k:6d}: _int_mm {t_mm:8.1f} us ({tera / t_mm * 1e6:5.0f} TOP/s)  "
            f"Triton {t_tr:8.1f} us ({tera / t_tr * 1e6:5.0f})  bf16 {t_bf:8.1f} us ({tera / t_bf * 1e6:5.0f} TFLOP/s)")
        del x, w, x_q, w_q, w_qt


def bench_int_mm_decode(dev, results, ms=(64, 128)):
    """`bench_int_mm` at a decode step's rows (Qwen3-8B and 1.7B shapes), weights rotated past the
    L2 (`copies_for`): whether cuBLASLt's int8 GEMM, its int32 sums handed to the norm after it as
    partial sums of one slice, could replace the Triton GEMM at M 64 / 128."""
    from agentq.kernels import triton_gemm as tg
    log("\n== int8 GEMM at decode rows: torch._int_mm (int32 out) vs Triton W8A8 (bf16 out) vs bf16 cuBLAS, "
        "µs per call, weights rotated past L2 ==")
    for model in ("qwen3-8b", "qwen3-1.7b"):
        for name, (k, n) in MODEL_LINEARS[model].items():
            n_i8, n_bf = copies_for(n * k), copies_for(2 * n * k)
            w_q = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev) for _ in range(n_i8)]
            w_bf = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) for _ in range(n_bf)]
            s_w = torch.rand(n, device=dev)
            for m in ms:
                x_q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=dev)
                s_x = torch.rand(m, device=dev)
                x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
                t_mm = graph_us([partial(torch._int_mm, x_q, w.t()) for w in w_q]) / n_i8
                t_tr = graph_us([partial(tg.int8_gemm, x_q, s_x, w, s_w, None, torch.bfloat16) for w in w_q]) / n_i8
                t_bf = graph_us([partial(F.linear, x, w) for w in w_bf]) / n_bf
                exact = torch.equal(torch._int_mm(x_q, w_q[0].t()), (x_q.double() @ w_q[0].double().t()).int())
                results.setdefault("int_mm_decode", []).append(
                    {"model": model, "shape": name, "M": m, "int_mm_us": t_mm, "triton_us": t_tr, "bf16_us": t_bf,
                     "int_mm_exact": exact})
                log(f"{model:10s} {name:8s} M {m:4d}: _int_mm {t_mm:6.1f} us ({n * k / t_mm / 1e6:4.2f} TB/s)  "
                    f"Triton {t_tr:6.1f} us ({n * k / t_tr / 1e6:4.2f})  bf16 {t_bf:6.1f} us "
                    f"({2 * n * k / t_bf / 1e6:4.2f})  _int_mm exact: {exact}")
            del w_q, w_bf
            torch.cuda.empty_cache()


def bench_linears(shapes, dev, results):
    from agentq.kernels import triton_gemm as tg
    from agentq.kernels import triton_quant as tq
    log("\n== W8A8 linear (fused quant + int8 GEMM) vs bf16 cuBLAS, Llama-3-8B layer, µs per call ==")
    log(f"{'layer':8s} {'M':>4s} {'bf16':>8s} {'w8a8':>8s} {'ratio':>6s} {'gemm':>7s} {'quant':>6s}  config")
    per_m = {m: {"bf16": 0.0, "w8a8": 0.0} for m in MS}
    for sh in shapes:
        for m in MS:
            x = torch.randn(m, sh.k, device=dev, dtype=torch.bfloat16)
            t_bf = graph_us([partial(F.linear, x, sh.w_bf16[i]) for i in range(sh.n_bf16)]) / sh.n_bf16
            t_w8 = graph_us([partial(tg.w8a8_linear, x, sh.w_q[i], sh.s_w[i], None, SPEC)
                             for i in range(sh.n_int8)]) / sh.n_int8
            x_q, s_x = tq.quantize_per_token(x, SPEC)
            t_gemm = graph_us([partial(tg.int8_gemm, x_q, s_x, sh.w_q[i], sh.s_w[i], None, torch.bfloat16)
                               for i in range(sh.n_int8)]) / sh.n_int8
            t_q = graph_us([partial(tq.quantize_per_token, x, SPEC)] * 8) / 8
            cfg = tg.pick_config(m, sh.n, sh.k, x.device)
            per_m[m]["bf16"] += t_bf
            per_m[m]["w8a8"] += t_w8
            log(f"{sh.name:8s} {m:4d} {t_bf:8.1f} {t_w8:8.1f} {t_bf / t_w8:6.2f} {t_gemm:7.1f} {t_q:6.1f}  "
                f"{cfg.short()}")
            results.setdefault("linears", []).append(
                {"layer": sh.name, "M": m, "bf16_us": t_bf, "w8a8_us": t_w8, "ratio": t_bf / t_w8,
                 "gemm_only_us": t_gemm, "quant_only_us": t_q, "cfg": cfg.short(),
                 "w8a8_TBps": sh.n * sh.k / t_w8 / 1e6, "bf16_TBps": 2 * sh.n * sh.k / t_bf / 1e6})
    log("-- per decoder layer (sum of the four linears) --")
    for m in MS:
        b, w = per_m[m]["bf16"], per_m[m]["w8a8"]
        log(f"layer    {m:4d} {b:8.1f} {w:8.1f} {b / w:6.2f}")
        results.setdefault("layer", []).append({"M": m, "bf16_us": b, "w8a8_us": w, "ratio": b / w})


def bench_layer_graph(shapes, dev, results, layers: int = 4):
    """Cross-check: one graph running `layers` distinct decoder layers' four linears in sequence."""
    from agentq.kernels import triton_gemm as tg
    log("-- whole-layer graphs (4 distinct layers of qkv, o, gate_up, down in one graph), µs per layer --")
    for m in MS:
        xs = {sh.name: torch.randn(m, sh.k, device=dev, dtype=torch.bfloat16) for sh in shapes}
        fb, fw = [], []
        for layer in range(layers):
            for sh in shapes:
                fb.append(partial(F.linear, xs[sh.name], sh.w_bf16[layer % sh.n_bf16]))
                fw.append(partial(tg.w8a8_linear, xs[sh.name], sh.w_q[layer % sh.n_int8], sh.s_w[layer % sh.n_int8],
                                  None, SPEC))
        b = graph_us(fb) / layers
        w = graph_us(fw) / layers
        os.environ["AGENTQ_PDL"] = "0"
        try:
            w_nopdl = graph_us(fw) / layers
        finally:
            os.environ.pop("AGENTQ_PDL")
        log(f"layer-graph M={m:4d}: bf16 {b:7.1f}  w8a8 {w:7.1f}  ratio {b / w:.2f}   (w8a8 without PDL {w_nopdl:.1f})")
        results.setdefault("layer_graph", []).append({"M": m, "bf16_us": b, "w8a8_us": w, "ratio": b / w,
                                                      "w8a8_no_pdl_us": w_nopdl})


# ---------------------------------------------------------------------- attention
def make_kv(B, L, Hkv, D, dev, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    k = torch.randn(B, Hkv, L, D, device=dev, generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, L, D, device=dev, generator=g, dtype=torch.bfloat16)
    return k, v


def sdpa_best(q4, k, v, results_row):
    """Fastest SDPA backend that runs (bf16, enable_gqa): the baseline."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    best = None
    for name, backends in (("default", None), ("flash", [SDPBackend.FLASH_ATTENTION]),
                           ("efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("cudnn", [SDPBackend.CUDNN_ATTENTION])):
        def fn(backends=backends):
            if backends is None:
                return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
            with sdpa_kernel(backends):
                return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
        try:
            us = graph_us([fn])
        except Exception as e:
            results_row[f"sdpa_{name}"] = f"fails: {type(e).__name__}"
            continue
        results_row[f"sdpa_{name}_us"] = us
        if best is None or us < best[0]:
            best = (us, name, fn)
    return best


def tune_quant(dev, results):
    """Sweep the per-token quant kernel's launch shape (no effect on its bits) per (M, K)."""
    from agentq.kernels import triton_quant as tq
    table = []
    for m in MS:
        for k in (4096, 14336):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            single = 1 << (k - 1).bit_length()
            cands = [(single, True, w) for w in (4, 8, 16, 32)] + \
                    [(b, False, w) for b, w in ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16))]
            best = None
            for launch in cands:
                try:
                    us = graph_us([partial(tq.quantize_rows, x, 1e-8, "half_even", launch)] * 8, rep_ms=20,
                                  warmup_ms=5) / 8
                except Exception as e:
                    log(f"  skip quant {launch}: {type(e).__name__}")
                    continue
                results.setdefault("tune_quant", []).append({"M": m, "K": k, "launch": launch, "us": us})
                if best is None or us < best[0]:
                    best = (us, launch)
            log(f"tune quant M={m:4d} K={k:6d}: best {best[1]} {best[0]:.2f} us")
            table.append((m, k, best[1]))
    tq.H200_QUANT[:] = table
    text = "H200_QUANT = [" + ", ".join(f"({m}, {k}, {p})" for m, k, p in table) + "]"
    log(text)
    results["quant_table"] = text


def attn_candidates(kind: str):
    from agentq.kernels.triton_attention import H200_ATTN, AttnConfig
    if kind == "float":
        for bn, w, st in ((64, 4, 2), (128, 8, 3), (64, 4, 3), (32, 4, 3), (64, 8, 2)):
            yield AttnConfig(bn, w, st, 1)
        return
    # the Triton kernels only (`cuda_attention`'s has its own rows, `--attn-cuda`): today's Triton default
    yield dataclasses.replace(H200_ATTN["int8"], num_splits=1, cuda=False)     # then its neighbours
    for bn, w, st, sp in ((64, 2, 3, 1), (64, 2, 4, 1), (64, 4, 3, 1), (128, 4, 3, 1), (32, 2, 4, 1), (128, 2, 3, 1),
                          (64, 2, 3, 2), (64, 1, 4, 1), (32, 1, 6, 1), (128, 4, 4, 1)):
        yield AttnConfig(bn, w, st, sp, planes=True, tma=True)   # their word tiles through TMA (round 10)
    for bn, w, st in ((64, 2, 4), (64, 2, 3), (64, 1, 4), (128, 4, 4)):
        yield AttnConfig(bn, w, st, 1, planes=True, tma=True, pairs=True)   # + fp16 pairs formed in the asm
    # two splits (1,024 programs at B 64 x Hkv 8) in one wave: few enough warps / shared memory per
    # program that ~7.8 fit an SM (round 10's split-2 candidates took 40 KB each, 5 per SM: two waves)
    for bn, w, st in ((32, 1, 3), (32, 1, 2), (64, 1, 2), (32, 1, 4), (64, 2, 2)):
        yield AttnConfig(bn, w, st, 2, planes=True, tma=True)
    for bn, w, st, sp in ((64, 2, 3, 1), (64, 2, 5, 1), (32, 2, 4, 1), (32, 1, 4, 1), (64, 1, 4, 1), (128, 2, 3, 1),
                          (128, 4, 3, 1), (64, 4, 3, 1), (64, 2, 4, 2)):
        yield AttnConfig(bn, w, st, sp, planes=True)       # byte planes as 4 dots (round 4)
    yield AttnConfig(128, 4, 3, 1)                               # the word kernel's sweep-3 default
    for bn, w, st, sp in ((128, 4, 4, 1), (64, 4, 3, 1), (64, 4, 4, 1), (64, 4, 5, 1),
                          (32, 4, 4, 1), (32, 4, 6, 1), (128, 4, 3, 2), (64, 4, 4, 2), (64, 2, 4, 1), (128, 8, 3, 1),
                          (128, 4, 2, 2), (128, 4, 3, 4), (64, 4, 4, 4), (256, 8, 2, 1), (256, 8, 3, 1),
                          (128, 8, 4, 1), (128, 4, 5, 1), (64, 2, 6, 1), (64, 4, 6, 2)):
        yield AttnConfig(bn, w, st, sp)
    for bn, w, st, sp in ((128, 4, 3, 1), (64, 4, 4, 1), (128, 4, 3, 2)):
        yield AttnConfig(bn, w, st, sp, k_as_a=True)
    yield AttnConfig(128, 4, 2, 1, words=False, asm=False)       # sweep-1 kernel (byte-wise V)


def decode_case(B: int, L: int, dev, heads: tuple[int, int] = (32, 8)):
    """Qwen3-8B heads (Hq 32, Hkv 8, D 128; `heads` = (Hq, Hkv) for others), every row L long in
    slot b: (q, {"int8": (k codes, k scales, v codes, v scales), "float": (k, None, v, None)}, slots,
    lens, D)."""
    (Hq, Hkv), D = heads, 128
    k, v = make_kv(B, L, Hkv, D, dev)
    caches = {"int8": (*quant.quantize_kv(k, SPEC), *quant.quantize_kv(v, SPEC)), "float": (k, None, v, None)}
    q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
    slots = torch.arange(B, device=dev, dtype=torch.int32)
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    return q, caches, slots, lens, D


def tune_attention(dev, results, deadline: float = float("inf"), B: int = 64, L: int = 4096,
                   heads: tuple[int, int] = (32, 8)):
    from agentq.kernels import triton_attention as ta
    q, caches, slots, lens, D = decode_case(B, L, dev, heads)
    best = {}
    for kind, args in caches.items():
        for cfg in attn_candidates(kind):
            if kind in best and time.time() > deadline:
                break
            try:
                us = graph_us([partial(ta.decode_attention, q, args[0], args[1], args[2], args[3], slots, lens,
                                       D ** -0.5, cfg)], rep_ms=30, warmup_ms=5)
            except Exception as e:
                log(f"  skip {kind} {cfg.short()}: {type(e).__name__}: {str(e)[:80]}")
                continue
            log(f"  attn {kind} {heads[0]}:{heads[1]} B={B} L={L} {cfg.short():40s} {us:8.1f} us")
            results.setdefault("tune_attn", []).append({"kind": kind, "B": B, "L": L, "heads": heads,
                                                        "cfg": cfg.short(), "us": us})
            if kind not in best or us < best[kind][0]:
                best[kind] = (us, cfg)
        us, cfg = best[kind]
        log(f"tune attn {kind} B={B} L={L}: best {cfg.short()} {us:.1f} us")
        results.setdefault("attn_best", []).append({"kind": kind, "B": B, "L": L, "cfg": cfg.short(), "us": us})
        # the table keeps its `cuda` choice: the sweep picks the Triton kernel behind it
        ta.H200_ATTN[kind] = dataclasses.replace(cfg, num_splits=None, cuda=ta.H200_ATTN[kind].cuda)
        results[f"attn_best_{kind}"] = {"cfg": cfg.short(), "us": us}
    text = "H200_ATTN = {" + ", ".join(f'"{kd}": {c!r}' for kd, c in ta.H200_ATTN.items()) + "}"
    log(text)
    results["attn_table"] = text


if HAVE_TRITON_JIT:
    import triton
    import triton.language as tl

    @triton.jit
    def _read_tiles_kernel(k_ptr, v_ptr, k_desc, v_desc, out_ptr, length, max_len, BLOCK_N: tl.constexpr,
                           WORDS: tl.constexpr, TMA: tl.constexpr, ONE_STREAM: tl.constexpr = False):
        """Decode attention's reads and nothing else: program (b, h, s) XORs the int32 words of its
        K and V rows (cache [B, H, max_len, WORDS]; split s of positions 0..length-1) tile by tile,
        by TMA or pointer. ONE_STREAM: K and V are one cache whose rows hold a position's K words
        then its V words (WORDS = both), read through k_ptr / k_desc alone."""
        b, h, heads = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
        sp, splits = tl.program_id(2), tl.num_programs(2)
        chunk = ((length + splits - 1) // splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N     # whole tiles
        row0 = (b * heads + h) * max_len
        offs = tl.arange(0, BLOCK_N)[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
        acc = tl.full([BLOCK_N, WORDS], 0, tl.int32)
        for n0 in range(sp * chunk, tl.minimum(sp * chunk + chunk, length), BLOCK_N):
            if TMA:
                tile = k_desc.load([row0 + n0, 0])
                if not ONE_STREAM:
                    tile ^= v_desc.load([row0 + n0, 0])
            else:
                base = (row0 + n0).to(tl.int64) * WORDS
                tile = tl.load(k_ptr + base + offs)
                if not ONE_STREAM:
                    tile ^= tl.load(v_ptr + base + offs)
            acc ^= tile
        tl.store(out_ptr + (b * heads + h) * splits + sp, tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor))

    @triton.jit
    def _xor(a, b):
        return a ^ b


def bench_attention_reads(dev, results, B: int = 64, L: int = 2304, Hkv: int = 8, D: int = 128):
    """The read time of decode attention's access pattern (one program per batch row and KV head,
    K and V tiles in turn) with no arithmetic, by TMA and by pointer, per tile size and warps:
    the floor under the int8 kernel's time that no change to its arithmetic can go below. Then the
    same bytes laid out other ways: K and V of a position side by side in one row (one stream, one
    tile), that cache read through two strided descriptors, the positions split over more programs;
    bf16 SDPA over a bf16 cache of the shape; the int8 kernel itself."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from agentq.kernels import triton_attention as ta
    words = D // 4
    kc = torch.randint(-127, 128, (B, Hkv, L, D), dtype=torch.int8, device=dev)
    vc = torch.randint(-127, 128, (B, Hkv, L, D), dtype=torch.int8, device=dev)
    kw, vw = kc.view(torch.int32), vc.view(torch.int32)
    out = torch.empty(B * Hkv * 8, dtype=torch.int32, device=dev)
    nbytes = 2 * kc.numel()
    log(f"\n== decode attention's reads alone: B {B} x Hkv {Hkv} x L {L}, int8 D {D} ({nbytes / 1e6:.0f} MB), "
        "µs per call ==")
    for bn in (16, 32, 64, 128):
        for warps in (1, 2, 4, 8):
            descs = [TensorDescriptor(c, [c.numel() // words, words], [words, 1], [bn, words]) for c in (kw, vw)]
            row = {"block_n": bn, "warps": warps}
            for tma in (True, False):
                us = graph_us([partial(_read_tiles_kernel[(B, Hkv)], kw, vw, *descs, out, L, L, BLOCK_N=bn,
                                       WORDS=words, TMA=tma, num_warps=warps)])
                row["tma_us" if tma else "pointer_us"] = us
            results.setdefault("attn_reads", []).append(row)
            log(f"  n{bn:<3d} w{warps}: TMA {row['tma_us']:7.1f} us ({nbytes / row['tma_us'] / 1e6:4.2f} TB/s)  "
                f"pointer {row['pointer_us']:7.1f} us ({nbytes / row['pointer_us'] / 1e6:4.2f} TB/s)")
    # the same bytes with each position's K and V words side by side in one row (one stream per program)
    kvw = torch.cat([kw, vw], dim=-1).contiguous()
    log("  interleaved K|V rows [B, Hkv, L, 2 x D/4 words]:")
    for bn in (32, 64, 128):
        for warps in (1, 2, 4, 8):
            desc = TensorDescriptor(kvw, [kvw.numel() // (2 * words), 2 * words], [2 * words, 1], [bn, 2 * words])
            row = {"block_n": bn, "warps": warps, "layout": "interleaved"}
            for tma in (True, False):
                us = graph_us([partial(_read_tiles_kernel[(B, Hkv)], kvw, kvw, desc, desc, out, L, L, BLOCK_N=bn,
                                       WORDS=2 * words, TMA=tma, ONE_STREAM=True, num_warps=warps)])
                row["tma_us" if tma else "pointer_us"] = us
            results.setdefault("attn_reads", []).append(row)
            log(f"  n{bn:<3d} w{warps}: TMA {row['tma_us']:7.1f} us ({nbytes / row['tma_us'] / 1e6:4.2f} TB/s)  "
                f"pointer {row['pointer_us']:7.1f} us ({nbytes / row['pointer_us'] / 1e6:4.2f} TB/s)")
    log("  position splits (grid B x Hkv x S), separate K / V at n128 and interleaved at n64, TMA and pointer:")
    for splits in (2, 3, 4, 8):
        for warps in (2, 4):
            descs = [TensorDescriptor(c, [c.numel() // words, words], [words, 1], [128, words]) for c in (kw, vw)]
            d2 = TensorDescriptor(kvw, [kvw.numel() // (2 * words), 2 * words], [2 * words, 1], [64, 2 * words])
            row = {"splits": splits, "warps": warps}
            row["sep_tma_us"] = graph_us([partial(_read_tiles_kernel[(B, Hkv, splits)], kw, vw, *descs, out, L, L,
                                                  BLOCK_N=128, WORDS=words, TMA=True, num_warps=warps)])
            row["sep_ptr_us"] = graph_us([partial(_read_tiles_kernel[(B, Hkv, splits)], kw, vw, *descs, out, L, L,
                                                  BLOCK_N=64, WORDS=words, TMA=False, num_warps=2 * warps)])
            row["kv_tma_us"] = graph_us([partial(_read_tiles_kernel[(B, Hkv, splits)], kvw, kvw, d2, d2, out, L, L,
                                                 BLOCK_N=64, WORDS=2 * words, TMA=True, ONE_STREAM=True,
                                                 num_warps=warps)])
            results.setdefault("attn_reads_splits", []).append(row)
            log(f"  S{splits} w{warps}: " + "  ".join(f"{k} {v:6.1f} us ({nbytes / v / 1e6:4.2f} TB/s)"
                                                    for k, v in row.items() if k.endswith("_us")))
    # K and V of one position side by side, each read through its own descriptor (row stride 2 x D/4
    # words): the layout a cache interleaving K and V per position hands the unchanged kernel
    kv_k, kv_v = kvw[..., :words], kvw[..., words:]
    for bn in (64, 128):
        for warps in (2, 4):
            descs = [TensorDescriptor(c, [B * Hkv * L, words], [2 * words, 1], [bn, words]) for c in (kv_k, kv_v)]
            us = graph_us([partial(_read_tiles_kernel[(B, Hkv)], kw, vw, *descs, out, L, L, BLOCK_N=bn,
                                   WORDS=words, TMA=True, num_warps=warps)])
            results.setdefault("attn_reads_strided", []).append({"block_n": bn, "warps": warps, "tma_us": us})
            log(f"  interleaved cache, K and V descriptors (row stride 2 x D/4): n{bn} w{warps}: TMA {us:7.1f} us "
                f"({nbytes / us / 1e6:4.2f} TB/s)")
    del kvw
    kf, vf = (torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    qf = torch.randn(B, 4 * Hkv, 1, D, device=dev, dtype=torch.bfloat16)
    us = graph_us([partial(torch.nn.functional.scaled_dot_product_attention, qf, kf, vf, enable_gqa=True)])
    log(f"  bf16 SDPA over a bf16 cache of the same shape: {us:.1f} us ({4 * kc.numel() / us / 1e6:.2f} TB/s)")
    del kf, vf
    ks, vs = (torch.rand(B, Hkv, L, device=dev) * 0.05 for _ in range(2))
    q = torch.randn(B, 4 * Hkv, D, device=dev, dtype=torch.bfloat16)
    slots = torch.arange(B, device=dev, dtype=torch.int32)
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    us = graph_us([partial(ta.decode_attention, q, kc, ks, vc, vs, slots, lens, D ** -0.5)])
    cfg = ta.effective_config(ta.pick_config(B, Hkv, L, torch.int8, dev), q, kc, ks, vc, vs).short()
    results["attn_reads_kernel_us"] = us
    log(f"  the int8 kernel ({cfg}): {us:.1f} us ({(nbytes + 2 * ks.numel() * 4) / us / 1e6:.2f} TB/s with its scales)")


def attention_calls(dev, kind: str, case: str, planes: bool, tma: bool = False) -> None:
    """Three decode-attention calls (Qwen3-8B heads) of the Triton kernel and nothing else, for a
    kernel profiler: `ncu --clock-control none -k regex:_decode --launch-skip 2 --launch-count 1
    --set full python -m agentq.eval.bench_kernels --attn-calls int8 --attn-cases 64x2560`."""
    from agentq.kernels import triton_attention as ta
    B, L = (int(v) for v in case.split("x"))
    q, caches, slots, lens, D = decode_case(B, L, dev)
    args = caches["int8" if kind == "int8" else "float"]
    cfg = dataclasses.replace(ta.pick_config(B, args[0].shape[1], L, args[0].dtype, dev), cuda=False)   # Triton's
    cfg = dataclasses.replace(cfg, planes=True) if planes or tma else cfg
    cfg = dataclasses.replace(cfg, tma=True) if tma else cfg
    for _ in range(3):
        ta.decode_attention(q, args[0], args[1], args[2], args[3], slots, lens, D ** -0.5, cfg)
    torch.cuda.synchronize()
    log(f"decode_attention x3: {kind} B={B} L={L} {cfg.short()}")


def bench_attention(dev, results, cases):
    from agentq.kernels import triton_attention as ta
    Hq, Hkv, D = 32, 8, 128
    log("\n== decode attention, Hq 32 / Hkv 8 / D 128, µs per call (graph) ==")
    log(f"{'B x L':>11s} {'SDPA bf16':>10s} {'tri bf16':>9s} {'int8':>9s} {'int8/SDPA':>9s} "
        f"{'SDPA TB/s':>9s} {'int8 TB/s':>9s}  max|err| int8 vs ref, bf16 vs SDPA")
    for B, L in cases:
        row = {"B": B, "L": L}
        k, v = make_kv(B, L, Hkv, D, dev, seed=B + L)
        q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
        q4 = q.unsqueeze(2)
        best = sdpa_best(q4, k, v, row)
        t_sdpa, sdpa_name, sdpa_fn = best
        slots = torch.randperm(B, device=dev).to(torch.int32)   # rows read shuffled slots
        lens = torch.full((B,), L, device=dev, dtype=torch.int32)
        kc, vc = torch.empty_like(k), torch.empty_like(v)
        kc[slots.long()], vc[slots.long()] = k, v                 # slot slots[b] holds row b
        (kq, ks), (vq, vs) = quant.quantize_kv(kc, SPEC), quant.quantize_kv(vc, SPEC)
        t_f = graph_us([partial(ta.decode_attention, q, kc, None, vc, None, slots, lens, D ** -0.5)])
        t_i = graph_us([partial(ta.decode_attention, q, kq, ks, vq, vs, slots, lens, D ** -0.5)])
        out_i = ta.decode_attention(q, kq, ks, vq, vs, slots, lens, D ** -0.5)
        out_f = ta.decode_attention(q, kc, None, vc, None, slots, lens, D ** -0.5)
        ref_i = ta.decode_attention_ref(q, kq, ks, vq, vs, slots, lens, D ** -0.5) if B * L <= 64 * 4096 else None
        sd = sdpa_fn().squeeze(2)
        err_i = (out_i.float() - ref_i.float()).abs().max().item() if ref_i is not None else float("nan")
        err_f = (out_f.float() - sd.float()).abs().max().item()
        bytes_bf16 = 2 * B * Hkv * L * D * 2
        bytes_i8 = 2 * B * Hkv * L * (D + 4)
        cfg = ta.effective_config(ta.pick_config(B, Hkv, L, torch.int8, q.device), q, kq, ks, vq, vs)
        # "triton_int8_us": the int8 default's time, the CUDA kernel's on sm_90 (int8_cfg says which)
        row.update({"sdpa_us": t_sdpa, "sdpa_backend": sdpa_name, "triton_bf16_us": t_f, "triton_int8_us": t_i,
                    "ratio_int8_vs_sdpa": t_sdpa / t_i, "ratio_bf16_triton_vs_sdpa": t_sdpa / t_f,
                    "sdpa_TBps": bytes_bf16 / t_sdpa / 1e6, "int8_TBps": bytes_i8 / t_i / 1e6,
                    "err_int8_vs_ref": err_i, "err_bf16_vs_sdpa": err_f, "int8_cfg": cfg.short()})
        results.setdefault("attention", []).append(row)
        log(f"{B:4d}x{L:<6d} {t_sdpa:10.1f} {t_f:9.1f} {t_i:9.1f} {t_sdpa / t_i:9.2f} {row['sdpa_TBps']:9.2f} "
            f"{row['int8_TBps']:9.2f}  {err_i:.1e}, {err_f:.1e}  [{sdpa_name}; {cfg.short()}]")
        del k, v, kc, vc, kq, vq
        torch.cuda.empty_cache()


def steady_us(fn, reps: int = 10, iters: int = 20) -> float:
    """Median µs of one call of `fn` in a CUDA graph of `reps` back-to-back calls, nothing between
    them (`graph_us` runs do_bench, whose L2 flush before each replay leaves dirty lines the timed
    call must write back: ~10 µs on a 100 µs decode attention). For kernels that run back to back in
    the engine and read far more than L2 holds."""
    from agentq.rollout.torch_engine.decode import capture_graph
    g, _ = capture_graph(lambda: [fn() for _ in range(reps)], None)
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    del g
    return statistics.median(times)


#: `--attn-cuda`'s launches of `cuda_attention` beside the default: (warps, splits, stages); None: the default's
ATTN_CUDA_LAUNCHES = tuple((w, None, st) for w in (1, 2, 4) for st in (2, 3, 4)) + ((4, 2, None), (2, 2, None))


def bench_attention_cuda(dev, results, cases=((64, 2304), (128, 2304), (64, 4096), (64, 1024), (32, 2304),
                                              (16, 2304), (256, 2304)),
                         heads=((16, 8), (32, 8))):
    """The int8 decode attention as hand-laid MMAs (`cuda_attention`) beside the Triton kernel and
    bf16 SDPA, timed back to back in a graph (`steady_us`), each launch checked against the fp32
    reference first: the default launch (`triton_attention.cuda_launch_for`, this GPU's row of
    `CUDA_LAUNCH`) and `ATTN_CUDA_LAUNCHES`, the best of them named per case."""
    import dataclasses

    from agentq.kernels import cuda_attention as ca
    from agentq.kernels import triton_attention as ta
    if os.environ.get("AGENTQ_DECODE_ATTN"):
        raise SystemExit("--attn-cuda picks each row's kernel itself: unset AGENTQ_DECODE_ATTN")
    log("\n== int8 decode attention: Triton vs hand-laid MMAs (cuda_attention), µs per call (graph, back to back) ==")
    variants = [("triton", None), ("cuda default", (None, None, None))] + [
        (f"cuda w{w} sp{sp or 'auto'} st{st or 'def'}", (w, sp, st)) for w, sp, st in ATTN_CUDA_LAUNCHES]
    for hq, hkv in heads:
        for B, L in cases:
            q, caches, slots, lens, D = decode_case(B, L, dev, heads=(hq, hkv))
            args = caches["int8"]
            ragged = (torch.arange(B, device=dev, dtype=torch.int32) * 37) % L + 1      # checked on ragged rows
            ref = ta.decode_attention_ref(q, *args, slots, ragged, D ** -0.5)
            row = {"B": B, "L": L, "Hq": hq, "Hkv": hkv}
            kv_bytes = 2 * B * hkv * L * (D + 4)
            kv = torch.zeros(args[0].shape, dtype=torch.bfloat16, device=dev)     # SDPA's time: data-blind
            sdpa = sdpa_best(q.unsqueeze(2), kv, kv, row)[0]
            del kv
            warps, stages = ta.cuda_launch_for(B, hkv, dev)
            line = f"Hq {hq:2d}/{hkv} {B:4d}x{L:<5d} sdpa bf16 {sdpa:7.1f} (default: w{warps} st{stages})"
            for name, v in variants:
                cfg = dataclasses.replace(ta.pick_config(B, hkv, L, torch.int8, dev), cuda=False)
                if v is not None:
                    w, sp, st = v
                    cfg = dataclasses.replace(cfg, cuda=True, cuda_warps=w, cuda_stages=st,
                                              num_splits=sp or cfg.num_splits)
                out = ta.decode_attention(q, *args, slots, ragged, D ** -0.5, config=cfg)
                err = (out.float() - ref.float()).abs().max().item()
                assert err <= 2e-2, f"{name} at Hq {hq} B {B} L {L}: max|err| {err:.2e} against the fp32 reference"
                us = steady_us(partial(ta.decode_attention, q, *args, slots, lens, D ** -0.5, config=cfg))
                row[name] = {"us": us, "TBps": kv_bytes / us / 1e6, "err": err}
                line += f" | {name} {us:7.1f} ({kv_bytes / us / 1e6:.2f} TB/s, err {err:.1e})"
            best = min((r["us"], n) for n, r in row.items() if isinstance(r, dict) and n.startswith("cuda"))
            row["best"] = best[1]
            log(line + f"\n    best: {best[1]} {best[0]:.1f} µs (default {row['cuda default']['us']:.1f})")
            results.setdefault("attention_cuda", []).append(row)
            if not ca.applies(q, args[0], args[2], args[1], args[3]):
                log("  (cuda_attention does not apply here: the cuda rows ran the Triton kernel)")


# ---------------------------------------------------------------------- the learner's RMSNorms
#: (rows, N) of a 1B learner micro-batch of 10,240 tokens: hidden-size norms, and Qwen3's q/k
#: norms over 32 heads (rows = tokens × heads)
LEARNER_NORMS = ((10240, 2048), (10240 * 32, 128))
#: backward launches swept after the default: (elements per block, programs per SM, warps, stages)
NORM_BWD_LAUNCHES = ((4096, 2, 8, 1), (2048, 4, 4, 2), (2048, 4, 4, 3), (8192, 1, 16, 2), (8192, 1, 16, 3))


def bench_learner_norms(dev, results):
    """The learner's RMSNorm at 1B shapes, bf16: forward one row per program vs several (short
    rows), backward Triton (default launch and a few others) vs the torch formula it replaces."""
    import triton

    from agentq.kernels import learner_ops, triton_norm
    log("\n== learner RMSNorm (bf16; µs per call, effective GB/s of the bytes each must move) ==")
    for m, n in LEARNER_NORMS:
        g = torch.Generator(device=dev).manual_seed(n)
        x = (torch.randn(m, n, generator=g, device=dev) * 3).bfloat16()
        w = (1 + 0.1 * torch.randn(n, generator=g, device=dev)).bfloat16()
        gy = torch.randn(m, n, generator=g, device=dev).bfloat16()
        fwd_bytes, bwd_bytes = 2 * m * n * 2, 3 * m * n * 2       # x in, y out; x, gy in, dx out
        cases = [("fwd one row/program", fwd_bytes, lambda: triton_norm.rms_norm(x, w, 1e-6, multi_row=False))]
        if triton.next_power_of_2(n) <= triton_norm.FWD_MAX_MULTI_ROW:
            cases.append(("fwd multi-row", fwd_bytes, lambda: triton_norm.rms_norm(x, w, 1e-6)))
        cases += [("bwd torch formula", bwd_bytes, lambda: learner_ops.rms_norm_backward(x, w, 1e-6, gy)),
                  ("bwd triton", bwd_bytes, lambda: triton_norm.rms_norm_backward(x, w, 1e-6, gy))]
        for launch in NORM_BWD_LAUNCHES:
            if triton.next_power_of_2(n) <= launch[0]:
                cases.append((f"bwd triton {launch}", bwd_bytes,
                              partial(triton_norm.rms_norm_backward, x, w, 1e-6, gy, launch)))
        for name, nbytes, fn in cases:
            us = graph_us([fn], rep_ms=40.0, warmup_ms=10.0)
            log(f"{m:7d} x {n:5d}  {name:34s} {us:8.1f} µs  {nbytes / us / 1e3:7.0f} GB/s")
            results.setdefault("learner_norms", []).append({"rows": m, "n": n, "case": name, "us": us,
                                                            "gbps": nbytes / us / 1e3})
        del x, gy
        torch.cuda.empty_cache()


def bench_learner_elementwise(dev, results, m: int = 10240):
    """SiLU·mul + codes (whole rows per program vs row chunks of each `SILU_CHUNKS` width,
    `triton_norm.SILU_QUANT_*`; with and without the product kept) against `silu_mul` alone, at
    [m, n] for the 1B and 8B widths, and RoPE (one head per program vs `triton_norm.rope`'s head
    tiles) at m tokens of 16 + 8 and 32 + 8 heads, bf16, µs per call and effective GB/s (g and u
    read once, the outputs written)."""
    from agentq.kernels import triton_norm as tn
    log("\n== learner SiLU·mul + codes and RoPE (bf16; µs per call) ==")
    saved = tn.SILU_QUANT_CHUNKED_ROWS, tn.SILU_QUANT_CHUNK
    for n in (6144, 12288):
        gate, up = (torch.randn(m, n, device=dev) * 3).bfloat16(), torch.randn(m, n, device=dev).bfloat16()
        want = tn.silu_mul_and_codes(gate, up, 1e-8, "half_away")
        cases = [("silu_mul alone", 6, saved[1], 1 << 30, lambda: tn.silu_mul(gate, up)),
                 ("whole rows", 5, saved[1], 1 << 30, None)]
        cases += [(f"chunks of {c}", 5, c, 1, None) for c in SILU_CHUNKS]
        for name, bytes_per, chunk, rows_min, fn in cases:
            tn.SILU_QUANT_CHUNKED_ROWS, tn.SILU_QUANT_CHUNK = rows_min, chunk
            for keep in ((True, False) if fn is None else (None,)):
                call = fn or (partial(tn.silu_mul_and_codes, gate, up, 1e-8, "half_away") if keep
                              else partial(tn.silu_mul_quant, gate, up, 1e-8, "half_away"))
                if fn is None:
                    got = call()
                    codes = got[1] if keep else got
                    assert torch.equal(codes[0], want[1][0]) and torch.equal(codes[1], want[1][1]), name
                us = graph_us([call], rep_ms=30.0, warmup_ms=8.0)
                nbytes = m * n * (bytes_per + (2 if keep else 0))
                label = f"{name}{' + product' if keep else ''}"
                log(f"silu·mul codes {m} x {n:5d} {label:28s} {us:8.1f} µs {nbytes / us / 1e3:6.0f} GB/s")
                results.setdefault("learner_elementwise", []).append({"op": f"silu {label}", "m": m, "n": n,
                                                                      "us": us})
        del gate, up, want
    tn.SILU_QUANT_CHUNKED_ROWS, tn.SILU_QUANT_CHUNK = saved
    for hq, hkv in ((16, 8), (32, 8)):
        qkv = torch.randn(1, m, (hq + hkv) * 128, device=dev).bfloat16()
        q, k = qkv[..., :hq * 128].view(1, m, hq, 128), qkv[..., hq * 128:].view(1, m, hkv, 128)
        ang = torch.randn(1, m, 64, device=dev) * 3
        cos, sin = torch.cat([ang.cos()] * 2, -1).bfloat16(), torch.cat([ang.sin()] * 2, -1).bfloat16()
        for name, fn in (("one head/program", lambda: tn.qk_norm_rope(q, k, None, None, cos, sin, 0.0)),
                         ("head tiles", lambda: tn.rope(q, k, cos, sin))):
            us = graph_us([fn], rep_ms=40.0, warmup_ms=10.0)
            log(f"rope {m} tokens x {hq}+{hkv} heads {name:17s} {us:8.1f}")
            results.setdefault("learner_elementwise", []).append({"op": f"rope {hq}+{hkv} {name}", "us": us})


#: (name, N = the forward's output width, K = its input width) of the dX GEMMs `--grad-input` times
GRAD_INPUT_SHAPES = (("1b qkv", 4096, 2048), ("1b o", 2048, 2048), ("1b gate_up", 12288, 2048),
                     ("1b down", 2048, 6144), ("8b qkv", 6144, 4096), ("8b o", 4096, 4096),
                     ("8b gate_up", 24576, 4096), ("8b down", 4096, 12288))
#: `_quant_row_chunks_kernel` launches (BLOCK_M, BLOCK_K, num_warps) `--grad-input` sweeps
QUANT_CHUNKS = ((1, 2048, 4), (2, 1024, 4), (4, 1024, 4), (4, 512, 4), (8, 512, 4), (8, 1024, 8), (16, 256, 4),
                (4, 2048, 8))


def bench_grad_input(dev, results, ms=(2048, 8192), act_rows=((8192, 2048), (8192, 4096), (32768, 2048), (32768, 4096))):
    """The learner's dX GEMM at 1B / 8B shapes, M gradient rows: bf16 `dY @ W_fq` against the int8
    path (dY · s_w quantized per row, int8 GEMM over W_qᵀ), and that quantization alone with the
    per-row kernel (the path before round 22) and each `QUANT_CHUNKS` launch; µs per call
    (graph-timed) and the quantization's effective bandwidth (dY read once, codes written)."""
    from agentq.kernels import quant, ste, triton_gemm, triton_quant
    from agentq.kernels.quant_spec import QuantSpec
    spec = QuantSpec.preset("w8a8_kv8")
    log("\n== learner dX: bf16 GEMM vs int8 (quantization + GEMM); the quantization's launches (µs, GB/s) ==")
    for m in ms:
        for name, n, k in GRAD_INPUT_SHAPES:
            g = torch.Generator(device=dev).manual_seed(n + k)
            w = (torch.randn(n, k, generator=g, device=dev) * 0.02).bfloat16()
            gy = (torch.randn(m, n, generator=g, device=dev) * 1e-6).bfloat16()
            cache = ste.WeightCache()
            w_q, s_w = cache.get(w, spec)
            w_fq = cache.dequantized(torch.bfloat16)
            w_t, unit = cache.transposed()
            row_launch = triton_quant._row_launch_params(m, n, False)
            quant_fns = {"row kernel": partial(triton_quant.quantize_rows, gy, quant.GRAD_SCALE_FLOOR, "half_even",
                                               row_launch, col_scale=s_w)}
            for c in (tuple(triton_quant.CHUNK_LAUNCH), *QUANT_CHUNKS):
                quant_fns.setdefault(f"chunks {c}", partial(triton_quant.quantize_rows, gy, quant.GRAD_SCALE_FLOOR,
                                                            "half_even", col_scale=s_w, chunks=c))
            want = quant_fns["row kernel"]()
            for fn in quant_fns.values():       # every launch: the same bits
                got = fn()
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name
            g_q, s_g = want
            row = {"m": m, "shape": name, "n": n, "k": k,
                   "bf16_us": graph_us([lambda: gy @ w_fq], rep_ms=30.0, warmup_ms=8.0),
                   "int8_us": graph_us([lambda: ste._int8_grad_input(gy, w_q, s_w, cache, spec, torch.bfloat16, None)],
                                       rep_ms=30.0, warmup_ms=8.0),
                   "gemm_us": graph_us([lambda: triton_gemm.int8_gemm(g_q, s_g, w_t, unit, None, torch.bfloat16)],
                                       rep_ms=30.0, warmup_ms=8.0),
                   "quant_us": {q: graph_us([fn], rep_ms=20.0, warmup_ms=5.0) for q, fn in quant_fns.items()}}
            nbytes = m * n * 3 + m * 4 + n * 4
            qus = row["quant_us"]
            best = min(qus, key=qus.get)
            default = f"chunks {tuple(triton_quant.CHUNK_LAUNCH)}"
            log(f"M {m:5d} {name:11s} bf16 {row['bf16_us']:8.1f}  int8 {row['int8_us']:8.1f} "
                f"({row['bf16_us'] / row['int8_us']:.2f}x; GEMM {row['gemm_us']:7.1f})  quant: row kernel "
                f"{qus['row kernel']:7.1f} ({nbytes / qus['row kernel'] / 1e3:5.0f} GB/s), CHUNK_LAUNCH {default} "
                f"{qus[default]:7.1f}, best {best} {qus[best]:7.1f} ({nbytes / qus[best] / 1e3:5.0f} GB/s)")
            results.setdefault("grad_input", []).append(row)
            del w, gy, cache, w_fq, w_t, g_q
            torch.cuda.empty_cache()
    log("\n== activation rows without column scales (the o-projection's input at prefill / learner rows) ==")
    for m, k in act_rows:
        x = torch.randn(m, k, device=dev).bfloat16()
        fns = {"default": partial(triton_quant.quantize_rows, x, 1e-8, "half_even")}
        for c in QUANT_CHUNKS:
            fns[f"chunks {c}"] = partial(triton_quant.quantize_rows, x, 1e-8, "half_even", chunks=c)
        want = fns["default"]()
        for fn in fns.values():
            got = fn()
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        us = {q: graph_us([fn], rep_ms=20.0, warmup_ms=5.0) for q, fn in fns.items()}
        best = min(us, key=us.get)
        nbytes = m * k * 3 + m * 4
        log(f"M {m:5d} K {k:5d}  default {us['default']:7.1f} µs ({nbytes / us['default'] / 1e3:5.0f} GB/s), "
            f"best {best} {us[best]:7.1f} µs ({nbytes / us[best] / 1e3:5.0f} GB/s)")
        results.setdefault("act_rows", []).append({"m": m, "k": k, "us": us})
        del x


#: row-chunk widths of the SiLU·mul + codes kernel `--learner-elementwise` times
SILU_CHUNKS = (1024, 2048, 4096)

#: (B, T) rows `--rope` times: a decode step's and a prefill chunk's (32768 tokens)
ROPE_ROWS = ((64, 1), (16, 2048))
#: (heads, tokens) per `_qk_norm_rope_kernel` program `--rope` sweeps (`AGENTQ_ROPE_HEADS`,
#: `AGENTQ_ROPE_TOKENS`)
ROPE_LAUNCHES = ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (2, 2), (2, 4), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8))
#: (name, q heads, k/v heads) of the head layouts `--rope` times
ROPE_MODELS = (("qwen3-8b", 32, 8), ("qwen3-1.7b", 16, 8))


def bench_rope(dev, results, d: int = 128, cache_len: int = 2048):
    """q/k-norm + RoPE at each of `ROPE_MODELS`' heads, bf16: `triton_norm.qk_norm_rope_to_cache`
    (K/V into an int8 cache, as the engine's decode step and prefill chunks run it) and
    `qk_norm_rope`, at each of `ROPE_ROWS` for each of `ROPE_LAUNCHES`; µs per call and effective
    GB/s of the bytes each must move (inputs read once, outputs written once, cos/sin once per
    token). Every launch's outputs are checked equal to the first's (the same bits)."""
    from agentq.kernels import triton_norm as tn
    saved = {k: os.environ.get(k) for k in (tn.ROPE_HEADS_ENV, tn.ROPE_TOKENS_ENV)}
    try:
        for model, hq, hkv in ROPE_MODELS:
            _bench_rope_heads(tn, dev, results, model, hq, hkv, d, cache_len)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bench_rope_heads(tn, dev, results, model: str, hq: int, hkv: int, d: int, cache_len: int) -> None:
    """`bench_rope` at one head layout."""
    log(f"\n== q/k-norm + RoPE, {model}: {hq} + {hkv} heads x {d} (bf16; int8 KV cache; µs per call, GB/s "
        "moved) ==")
    kvq = (SPEC.kv_scale_floor, SPEC.kv_rounding)
    for b, t in ROPE_ROWS:
        n = b * t
        g = torch.Generator(device=dev).manual_seed(n)
        qkv = torch.randn(b, t, (hq + 2 * hkv) * d, generator=g, device=dev).bfloat16()
        q = qkv[..., :hq * d].view(b, t, hq, d)
        k, v = qkv[..., hq * d:(hq + hkv) * d].view(b, t, hkv, d), qkv[..., (hq + hkv) * d:].view(b, t, hkv, d)
        nw = (1 + 0.1 * torch.randn(d, generator=g, device=dev)).bfloat16()
        ang = torch.randn(b, t, d // 2, generator=g, device=dev) * 3
        cos, sin = torch.cat([ang.cos()] * 2, -1).bfloat16(), torch.cat([ang.sin()] * 2, -1).bfloat16()
        kc, vc = (torch.zeros(b, hkv, cache_len, d, dtype=torch.int8, device=dev) for _ in range(2))
        ks, vs = (torch.zeros(b, hkv, cache_len, device=dev) for _ in range(2))
        slots = torch.arange(b, device=dev)
        if t == 1:      # decode: one token per row at a random position, every token written
            pos, n_new = torch.randint(0, cache_len, (b,), generator=g, device=dev), None
        else:           # a prefill chunk (the engine passes its rows' valid counts: the ragged path)
            pos, n_new = torch.arange(t, device=dev).repeat(b, 1), torch.full((b,), t, dtype=torch.int32,
                                                                              device=dev)
        cs_bytes = n * d * 2 * 2
        cases = (("qk_norm_rope_to_cache", n * ((hq + 2 * hkv) * d * 2 + hq * d * 2 + 2 * hkv * (d + 4)) + cs_bytes,
                  lambda: tn.qk_norm_rope_to_cache(q, k, v, nw, nw, cos, sin, 1e-6, kc, vc, ks, vs, slots, pos,
                                                   kvq, n_new)),
                 ("qk_norm_rope", n * (hq + hkv) * d * 2 * 2 + cs_bytes,
                  lambda: tn.qk_norm_rope(q, k, nw, nw, cos, sin, 1e-6)))
        for name, nbytes, fn in cases:
            first = None
            for heads, tokens in ROPE_LAUNCHES:
                if tokens > 1 and n <= tn.ROPE_DECODE_MAX_ROWS:
                    continue                       # decode rows take one token a program whatever is asked
                os.environ[tn.ROPE_HEADS_ENV], os.environ[tn.ROPE_TOKENS_ENV] = str(heads), str(tokens)
                for c, mark in ((kc, 7), (vc, 7), (ks, 0.5), (vs, 0.5)):     # sentinels: a write left out shows
                    c.fill_(mark)
                out = [x.clone() for x in _as_list(fn())] + [x.clone() for x in (kc, vc, ks, vs)]
                first = first or out
                same = all(torch.equal(x, y) for x, y in zip(first, out))
                us = graph_us([fn], rep_ms=40.0, warmup_ms=10.0)
                log(f"{b:3d} x {t:5d} tokens  {name:22s} {heads:2d} heads x {tokens} tokens/program "
                    f"{us:8.1f} µs  {nbytes / us / 1e3:6.0f} GB/s{'' if same else '  NOT THE SAME BITS'}")
                results.setdefault("rope", []).append({"model": model, "b": b, "t": t, "op": name, "heads": heads,
                                                       "tokens": tokens, "us": us, "gbps": nbytes / us / 1e3,
                                                       "same_bits": same})
        del qkv, kc, vc, ks, vs
        torch.cuda.empty_cache()


def _as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


# ---------------------------------------------------------------------- prefill attention
#: (block_t, block_n, warps, stages) of the prefill kernel swept by --prefill (int8 caches: each
#: with codes read as words and, for the default launch, as bytes too)
PREFILL_LAUNCHES = ((32, 32, 4, 3), (32, 64, 4, 3), (64, 32, 8, 3), (32, 32, 8, 3), (32, 32, 8, 2),
                    (32, 64, 8, 3), (32, 64, 8, 2), (64, 64, 8, 3), (16, 64, 8, 3), (64, 32, 8, 2), (32, 32, 4, 4))
#: (name, query heads, KV heads) of the head layouts --prefill times
PREFILL_HEADS = (("Qwen3-8B", 32, 8), ("Qwen3-1.7B", 16, 8))


def bench_prefill(dev, results, B: int = 64, L: int = 2048, T: int = 512):
    """Prefill attention: the last T-token chunk of an L-token prompt for B rows, per head layout of
    `PREFILL_HEADS`, the engine's read-back path (slot gather, dequantization, masked SDPA with
    repeated heads) against the in-place kernel at each launch of `PREFILL_LAUNCHES`, int8 caches
    with codes read as words (and as bytes at the default launch) and bf16 caches."""
    for name, hq, hkv in PREFILL_HEADS:
        _bench_prefill_heads(dev, results, name, hq, hkv, B, L, T)


def _bench_prefill_heads(dev, results, name: str, Hq: int, Hkv: int, B: int, L: int, T: int, D: int = 128):
    from agentq.kernels import triton_prefill as tp
    from agentq.kernels.attention import masked_attention
    kf, vf = make_kv(B, L, Hkv, D, dev)
    q = torch.randn(B, T, Hq, D, device=dev).bfloat16().transpose(1, 2)
    slots = torch.arange(B, device=dev, dtype=torch.int32)
    n_new, lens = torch.full_like(slots, T), torch.full_like(slots, L)
    pos = (L - T) + torch.arange(T, device=dev)
    allowed = (torch.arange(L, device=dev)[None, None, :] <= pos[None, :, None]).expand(B, T, L)
    caches = {"int8": (*quant.quantize_kv(kf, SPEC), *quant.quantize_kv(vf, SPEC)), "bf16": (kf, None, vf, None)}
    log(f"\n== prefill attention, {name} heads, B {B}, chunk {T} after {L - T} cached (µs per call) ==")
    for kind, (kc, ks, vc, vs) in caches.items():
        def read_back(kc=kc, ks=ks, vc=vc, vs=vs):      # what KVCache.read + masked_attention do
            sl = slots.long()
            k = kc[sl] if ks is None else quant.dequantize_rows(kc[sl], ks[sl], torch.bfloat16)
            v = vc[sl] if vs is None else quant.dequantize_rows(vc[sl], vs[sl], torch.bfloat16)
            return masked_attention(q, k, v, allowed, D ** -0.5)
        ref = read_back()
        row = {"heads": name, "kind": kind, "read_back_us": graph_us([read_back], rep_ms=100.0, warmup_ms=20.0)}
        log(f"{kind}: read-back + masked SDPA {row['read_back_us']:.0f}")
        reads = ("words", "copy") if kind == "int8" else ("words",)
        launches = [tp.PrefillConfig(*launch, codes=r) for launch in PREFILL_LAUNCHES for r in reads]
        if kind == "int8":
            launches.insert(0, tp.PrefillConfig(*PREFILL_LAUNCHES[0], codes="bytes"))
        for cfg in launches:
            fn = partial(tp.prefill_attention, q, kc, ks, vc, vs, slots, n_new, lens, D ** -0.5, cfg, key_len=L)
            us = graph_us([fn], rep_ms=100.0, warmup_ms=20.0)
            err = (fn().float() - ref.float()).abs().max().item()
            tag = f"{cfg.block_t}/{cfg.block_n}/w{cfg.num_warps}/st{cfg.num_stages}" + (
                f"/{cfg.codes}" if kind == "int8" else "")
            row[tag] = us
            log(f"  {tag:22s} {us:8.0f} (err {err:.1e})")
        results.setdefault("prefill", []).append(row)


def kv_bytes(results):
    from agentq.kernels.triton_attention import kv_bytes_per_token
    log("\n== KV cache bytes per token (K+V, all layers; int8 includes fp32 per-token-head scales) ==")
    for name, layers, hkv, d in (("Llama-3-8B", 32, 8, 128), ("Qwen3-8B", 36, 8, 128)):
        i8 = kv_bytes_per_token(layers, hkv, d, torch.int8)
        bf = kv_bytes_per_token(layers, hkv, d, torch.bfloat16)
        log(f"{name:11s} int8 {i8} B  bf16 {bf} B  ratio {i8 / bf:.4f}")
        results.setdefault("kv_bytes", []).append({"model": name, "int8": i8, "bf16": bf, "ratio": i8 / bf})


def run_checks(results) -> int:
    import pytest
    t = time.time()
    rc = pytest.main(["-q", "-s", "-p", "no:cacheprovider", str(REPO / "tests/kernels/test_triton_cuda.py")])
    results["check_rc"] = int(rc)
    log(f"== GPU checks: pytest rc={int(rc)} in {time.time() - t:.0f}s ==")
    return int(rc)


def decode_models(models_arg: str) -> tuple[str, ...]:
    """The models a decode-row sweep (`--spread`, `--partials`) covers: `--models` when given, else
    Qwen3-8B and Qwen3-1.7B (`--models`'s default, Llama-3-8B, is `--tune gemm`'s)."""
    return tuple(models_arg.split(",")) if models_arg != "llama3-8b" else ("qwen3-8b", "qwen3-1.7b")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="run tests/kernels/test_triton_cuda.py first")
    ap.add_argument("--tune", nargs="?", const="all", help="comma list of quant,gemm,attn (default: all)")
    ap.add_argument("--tune-ms", default=",".join(map(str, MS)), help="GEMM sweep: which M")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer attention cases")
    ap.add_argument("--tune-budget-s", type=float, default=240.0, help="stop tuning sweeps after this long")
    ap.add_argument("--models", default="llama3-8b", help=f"comma list of {sorted(MODEL_LINEARS)} (--tune gemm)")
    ap.add_argument("--attn-cases", default="64x4096", help="--tune attn: comma list of BxL")
    ap.add_argument("--attn-heads", default=None, help="--tune attn (default 32:8), --attn-cuda (default "
                    "16:8,32:8): comma list of Hq:Hkv (32:8 Qwen3-8B, 16:8 Qwen3-1.7B)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for bench.json")
    ap.add_argument("--attn-calls", metavar="KIND", choices=["int8", "bf16"],
                    help="only call decode_attention 3 times at the first --attn-cases shape with a KIND cache "
                         "(default config, or --attn-planes) and exit: the program to put under ncu")
    ap.add_argument("--attn-planes", action="store_true", help="--attn-calls: the byte-plane kernel")
    ap.add_argument("--attn-tma", action="store_true", help="--attn-calls: the byte-plane kernel with TMA word tiles")
    ap.add_argument("--learner-norms", action="store_true",
                    help="only time the learner's RMSNorm forward / backward at 1B shapes (~20 s) and exit")
    ap.add_argument("--learner-elementwise", action="store_true",
                    help="only time the learner's SiLU·mul + codes and RoPE launches (whole vs chunked rows, "
                         "one head vs head tiles per program) and exit")
    ap.add_argument("--glu", nargs="?", const="tune", choices=["tune", "bench"],
                    help="only time the gate_up GEMM with SiLU·mul in its epilogue against GEMM + silu_mul_quant "
                         "(Qwen3-8B / 1.7B, M 64 / 128 / 32768; 'tune': also sweep its launches) and exit")
    ap.add_argument("--partials", nargs="?", const="tune", choices=["tune", "bench", "wide"],
                    help="only time the o / down GEMMs handing partial sums to the norm against the GEMM with its "
                         "epilogue + the norm (Qwen3-8B / 1.7B, or --models; M 64 / 128; 'tune': also sweep split "
                         "launches) and exit")
    ap.add_argument("--spread", action="store_true",
                    help="only time the qkv GEMM and the gate_up GLU GEMM at decode rows (Qwen3-8B / 1.7B, or "
                         "--models; M 64 / 128), the table's launch against columns spread evenly over the SMs, "
                         "and exit")
    ap.add_argument("--write-table", action="store_true",
                    help="--partials tune / --spread: write the measured rows into the installed h200_gemm.json")
    ap.add_argument("--int-mm", nargs="?", const="prefill", choices=["prefill", "decode"],
                    help="only time torch._int_mm against the Triton W8A8 GEMM and bf16 at prefill rows (or at "
                         "decode rows, M 64 / 128) and exit")
    ap.add_argument("--attn-reads", action="store_true",
                    help="only time decode attention's reads with no arithmetic (TMA / pointer tiles, B 64 x "
                         "L 2304; K and V interleaved per position; position splits) beside bf16 SDPA and the "
                         "int8 kernel, and exit")
    ap.add_argument("--grad-input", action="store_true",
                    help="only time the learner's dX GEMM, bf16 vs int8 (and the dY · s_w quantization's launches) "
                         "at 1B / 8B shapes, and exit")
    ap.add_argument("--rope", action="store_true",
                    help="only time qk_norm_rope_to_cache (int8 cache) and qk_norm_rope at Qwen3-8B and 1.7B heads, decode "
                         "(64 x 1) and prefill (16 x 2048) rows, 1 to 16 heads and 1 to 8 tokens per program, "
                         "checking the outputs are the same bits, and exit")
    ap.add_argument("--attn-cuda", action="store_true",
                    help="only time the int8 decode attention as hand-laid MMAs (cuda_attention, several launches) "
                         "beside the Triton kernel and bf16 SDPA, Qwen3-1.7B / 8B heads, and exit")
    ap.add_argument("--prefill", action="store_true",
                    help="only time prefill attention, the read-back path vs the in-place kernel's launches, and exit")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if args.attn_calls:
        return attention_calls(dev, args.attn_calls, args.attn_cases.split(",")[0], args.attn_planes, args.attn_tma)
    import triton
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    log(f"{results['device']}  torch {torch.__version__}  triton {triton.__version__}")
    t0 = time.time()

    def save():
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "bench.json").write_text(json.dumps(results, indent=1, default=str))

    if args.learner_norms:
        bench_learner_norms(dev, results)
        return save()
    if args.prefill:
        bench_prefill(dev, results)
        return save()
    if args.attn_cuda:
        heads = tuple(tuple(int(v) for v in h.split(":")) for h in (args.attn_heads or "16:8,32:8").split(","))
        bench_attention_cuda(dev, results, heads=heads)
        return save()
    if args.int_mm:
        (bench_int_mm_decode if args.int_mm == "decode" else bench_int_mm)(dev, results)
        return save()
    if args.attn_reads:
        bench_attention_reads(dev, results)
        return save()
    if args.rope:
        bench_rope(dev, results)
        return save()
    if args.grad_input:
        bench_grad_input(dev, results)
        return save()
    if args.glu:
        bench_glu(dev, results, tune=args.glu == "tune")
        return save()
    if args.spread:
        bench_spread(dev, results, decode_models(args.models), write_table=args.write_table, deadline=t0 + args.tune_budget_s)
        return save()
    if args.partials:
        bench_partials(dev, results, decode_models(args.models), tune=args.partials != "bench", write_table=args.write_table,
                       deadline=t0 + args.tune_budget_s, wide=args.partials == "wide")
        return save()
    if args.learner_elementwise:
        bench_learner_elementwise(dev, results)
        return save()

    shapes = [LinearShape(name, k, n, dev) for name, (k, n) in LLAMA8B.items()]
    if args.tune and "gemm" in args.tune and args.models != "llama3-8b":
        wanted = {}
        for model in args.models.split(","):
            for name, (k, n) in MODEL_LINEARS[model].items():
                wanted.setdefault((k, n), f"{model}:{name}")
        tune_shapes = [LinearShape(name, k, n, dev) for (k, n), name in wanted.items()]
    else:
        tune_shapes = shapes
    if args.tune:     # first, so that the checks and the benchmark use the tuned tables
        t = time.time()
        what = {"quant", "gemm", "attn"} if args.tune == "all" else set(args.tune.split(","))
        if "quant" in what:
            tune_quant(dev, results)
        if "gemm" in what:
            tune_gemm(tune_shapes, dev, results, deadline=t + 0.7 * args.tune_budget_s,
                      ms=tuple(int(v) for v in args.tune_ms.split(",")))
            del tune_shapes
            torch.cuda.empty_cache()
        if "attn" in what:
            cases = [(tuple(int(v) for v in h.split(":")), c) for h in (args.attn_heads or "32:8").split(",")
                     for c in args.attn_cases.split(",")]
            for i, (heads, case) in enumerate(cases):     # the budget left, shared by the cases left
                b, l_ = (int(v) for v in case.split("x"))
                left = t + args.tune_budget_s - time.time()
                tune_attention(dev, results, deadline=time.time() + left / (len(cases) - i), B=b, L=l_,
                               heads=heads)
        log(f"(tuning took {time.time() - t:.0f}s)")
        save()
    if args.check:
        run_checks(results)
        save()
    if not args.no_bench:
        bench_linears(shapes, dev, results)
        bench_layer_graph(shapes, dev, results)
        save()
        del shapes
        torch.cuda.empty_cache()
        cases = [(64, 4096), (256, 4096)] if args.quick else [(64, 4096), (256, 4096), (64, 16384), (16, 4096),
                                                              (1, 16384)]
        bench_attention(dev, results, cases)
        kv_bytes(results)
    results["wall_s"] = time.time() - t0
    save()
    log(f"\n(total {time.time() - t0:.0f}s)")


if __name__ == "__main__":
    main()
