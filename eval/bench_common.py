"""What the benchmark scripts share (a library module: scripts import this, never each other).

Model shapes of real sizes with random weights (throughput does not depend on the weights' values),
device synchronisation for timing, and the arguments every benchmark takes.
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {  # Qwen3-style configs
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=1024),
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "1b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
               num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=151936),
}


def qwen3_config(shape: str, max_len: int):
    """The HF `Qwen3Config` of `SHAPES[shape]` for contexts up to `max_len` tokens (untied head)."""
    from transformers import Qwen3Config

    return Qwen3Config(**SHAPES[shape], max_position_embeddings=max_len + 256, tie_word_embeddings=False)


def random_model(shape: str, seq: int, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """An HF Qwen3 causal LM of `shape` with random init, built on `device` directly (no checkpoint
    on disk). Returns (model, config)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = qwen3_config(shape, seq)
    with device:
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype), cfg


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (timings end here); a no-op on CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, calls: int, device: torch.device | str, warm: int = 20) -> float:
    """Seconds per call of fn() over `calls` calls after `warm` unmeasured ones, synchronized
    with the device before the clock starts and after it stops."""
    for _ in range(warm):
        fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter() - t) / calls


def release_memory(device: torch.device) -> None:
    """Free what the last configuration left, so the next one starts from an empty device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def base_parser(doc: str) -> argparse.ArgumentParser:
    """--model, --device, --out: the arguments every benchmark takes."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=list(SHAPES),
                    help="a Qwen3 shape with random weights (1b: Qwen3-1.7B's; SHAPES)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="folder for the JSON report")
    return ap


#: the fast paths' module switches a benchmark reports (name -> (module, attribute))
SWITCHES = {
    "glu_gemm": ("agentq.kernels.int8_linear", "GLU_GEMM"),
    "attn_tma": ("agentq.kernels.triton_attention", "TMA_TILES"),
    "attn_cuda": ("agentq.kernels.triton_attention", "CUDA_KERNEL"),
    "attn_cuda_warps": ("agentq.kernels.triton_attention", "CUDA_WARPS"),
    "attn_cuda_stages": ("agentq.kernels.triton_attention", "CUDA_STAGES"),
    "prefill_kv_write": ("agentq.rollout.torch_engine.model", "PREFILL_KV_WRITE"),
    "pdl_max_rows": ("agentq.kernels.triton_quant", "PDL_MAX_ROWS"),
    "partial_sums": ("agentq.kernels.int8_linear", "PARTIAL_SUMS"),
    "fast_codes": ("agentq.kernels.triton_quant", "FAST_CODES"),
}


def fast_path_switches() -> dict:
    """The switches in force (module values, and every AGENTQ_* environment variable), so a
    report says which paths it measured."""
    import importlib
    import os

    out: dict = {k: v for k, v in sorted(os.environ.items()) if k.startswith("AGENTQ_")}
    for name, (mod, attr) in SWITCHES.items():
        try:
            value = getattr(importlib.import_module(mod), attr)
            out[name] = getattr(value, "value", value)      # a Triton constexpr holds its value
        except (ImportError, AttributeError):      # e.g. no triton: that path does not exist here
            out[name] = None
    return out


def write_json(path: str | Path | None, report: dict, indent: int = 1) -> None:
    """The benchmark's report as JSON at `path` (its `--json`/`--out` argument); nothing when None."""
    if path:
        Path(path).write_text(json.dumps(report, indent=indent))


def profile_host(name: str, fn, calls: int = 1, rows: int = 22) -> None:
    """cProfile of `calls` calls of fn: the Python functions the host time goes to (own time, then
    cumulative), for phases whose GPU sits idle waiting on the host."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    print(f"\n--- host profile: {name}, {calls} call(s) (own time, then cumulative) ---")
    stats = pstats.Stats(prof).strip_dirs()
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)


def kernel_table(title: str, fn, rows: int = 18) -> list[tuple[str, float, float]]:
    """Print the CUDA kernels of one call of `fn` by GPU time, and its host-side ops by CPU time
    (where a phase's time goes; CUDA only). Returns the call's kernels as `profiled_kernels` does."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(f"--- CUDA kernels, {title}")
    print(table.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60), flush=True)
    print(f"--- host ops, {title}")
    print(table.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60), flush=True)
    return profiled_kernels(prof)


#: (class, lower-case name fragments), matched in this order (the int8 GEMM's name holds "gemm"
#: too): the kinds of GPU work a ceiling on a quantized step's gain treats alike (`gpu_s_by_class`)
KERNEL_CLASSES = (("int8_gemm", ("_w8a8_gemm",)),
                  ("decode_attention", ("_decode_kernel", "_decode_planes_kernel", "_combine_kernel",
                                        "agentq_decode_attn")),
                  ("attention", ("flash", "fmha", "_prefill_kernel")),
                  ("bf16_gemm", ("nvjet", "gemm", "gemv", "cutlass", "xmma", "splitkreduce")))


def kernel_class(name: str) -> str:
    """The `KERNEL_CLASSES` class of a CUDA kernel's name ("other" for the rest: norms, RoPE,
    quantization codes, sampling, elementwise and copies)."""
    low = name.lower()
    return next((cls for cls, parts in KERNEL_CLASSES if any(p in low for p in parts)), "other")


def gpu_s_by_class(kernels: list[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds of kernel time per `kernel_class`, from (name, start µs, duration µs) records.
    Durations as recorded: a kernel launched early under programmatic dependent launch counts its
    wait too, so only a stream without such overlap sums to its busy time."""
    out = dict.fromkeys([c for c, _ in KERNEL_CLASSES] + ["other"], 0.0)
    for name, _, dur in kernels:
        out[kernel_class(name)] += dur / 1e6
    return out


def kernel_timeline(kernels: list[tuple[str, float, float]], steps: int = 1) -> dict:
    """Where a GPU stream's time goes, from its kernels as (name, start µs, duration µs), per step
    of `steps` equal ones: the span from the first start to the last end, the busy time (the union
    of kernel intervals, so kernels that overlap, e.g. under programmatic dependent launch, count
    once), the idle share of the span, and per kernel name its total time and count (durations as
    recorded: an overlapped kernel's includes its wait) and the idle time just before it."""
    if not kernels:
        return {"kernels_per_step": 0.0, "span_us": 0.0, "busy_us": 0.0, "idle_frac": 0.0, "by_name": {}}
    ev = sorted(kernels, key=lambda e: e[1])
    busy, end = 0.0, ev[0][1]
    by = collections.defaultdict(lambda: {"us": 0.0, "count": 0, "idle_before_us": 0.0})
    for name, start, dur in ev:
        if start > end:
            by[name]["idle_before_us"] += start - end
        busy += max(0.0, start + dur - max(start, end))
        end = max(end, start + dur)
        by[name]["us"] += dur
        by[name]["count"] += 1
    span = end - ev[0][1]
    per = {n: {k: v / steps for k, v in d.items()} for n, d in sorted(by.items(), key=lambda kv: -kv[1]["us"])}
    return {"kernels_per_step": len(ev) / steps, "span_us": span / steps, "busy_us": busy / steps,
            "idle_frac": (span - busy) / span if span else 0.0, "by_name": per}


def profiled_kernels(prof) -> list[tuple[str, float, float]]:
    """The CUDA kernels a `torch.profiler.profile` recorded, as (name, start µs, duration µs), read
    from its Chrome trace (the one export that keeps each launch's own timestamps)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return [(e["name"], float(e["ts"]), float(e["dur"])) for e in events
            if e.get("ph") == "X" and e.get("cat") == "kernel"]


def print_timeline(title: str, timeline: dict, rows: int = 16) -> None:
    """`kernel_timeline`'s result as a few lines: the step's span, busy time and idle share, then
    the kernels by time (µs per step, launches per step, idle before them)."""
    print(f"--- {title}: {timeline['kernels_per_step']:.0f} kernels/step, span {timeline['span_us']:.1f} us/step, "
          f"busy {timeline['busy_us']:.1f} us/step, idle {100 * timeline['idle_frac']:.1f} %")
    print(f"  {'us/step':>10} {'n/step':>7} {'idle before':>11}  kernel")
    for name, d in list(timeline["by_name"].items())[:rows]:
        print(f"  {d['us']:>10.1f} {d['count']:>7.1f} {d['idle_before_us']:>11.1f}  {name[:70]}")
