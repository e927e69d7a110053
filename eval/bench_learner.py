"""Learner throughput: the aligned (QAT, W8A8-KV8) learner vs the same model with
`QuantSpec.preset("none")`, on one random-init Qwen3-shaped model and one batch, in one run.

Times, per spec (median over --iters after --warmup):
  * `update`: one optimizer step of `Learner.update` (forward + backward over the micro-batches,
    gradient clipping, AdamW) on B sequences of L tokens;
  * `forward`: the no-grad forward that computes π_old / π_ref (`Learner.logprobs`).
Reports tokens/s, peak GPU memory of the update, and aligned / none ratios side by side.

    python -m agentq.eval.bench_learner --model 1b --batch 4 --seq 2048 --micro 4 --out runs/bench   # H200
    python -m agentq.eval.bench_learner --model 8b --batch 4 --seq 2048 --micro 1 --out runs/bench   # H200
    python -m agentq.eval.bench_learner --model tiny --batch 4 --seq 128 --iters 3                   # CPU
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from agentq.eval.bench_common import base_parser, random_model, release_memory, sync

SPECS = ("none", "w8a8_kv8")


def synthetic_batch(batch: int, seq: int, vocab: int, seed: int = 0):
    """B full-length sequences of random ids; every token after the first is an action token."""
    from agentq.learner.batch import PolicyBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq)
    mask[:, 0] = 0
    return PolicyBatch(input_ids=ids, attention_mask=torch.ones(batch, seq, dtype=torch.long), action_mask=mask,
                       seg_id=mask.long(), rollout_logp=torch.zeros(batch, seq),
                       adv=torch.randn(batch, generator=g))


def timed(fn, device: torch.device, warmup: int, iters: int) -> list[float]:
    out = []
    for i in range(warmup + iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def run_spec(spec_name: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    from agentq.algos import make_objective
    from agentq.kernels import QuantSpec
    from agentq.learner.learner import Learner

    model, cfg = random_model(args.model, args.seq, device, dtype)
    learner = Learner(model, QuantSpec.preset(spec_name), dtype=dtype, device=str(device), use_reference=False,
                      micro_batch_size=args.micro, lr=1e-6, activation_checkpointing=args.checkpointing)
    batch = synthetic_batch(args.batch, args.seq, cfg.vocab_size)
    objective = make_objective("grpo", kl_coef=0.0)
    fwd = timed(lambda: learner.logprobs(batch), device, args.warmup, args.iters)
    batch.old_logp = learner.logprobs(batch)
    batch = batch.weighted(objective.prepare(batch))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    upd = timed(lambda: learner.update(batch, objective), device, args.warmup, args.iters)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    if args.profile and device.type == "cuda":
        kernel_table(f"{spec_name}: no-grad forward", lambda: learner.logprobs(batch))
        kernel_table(f"{spec_name}: update", lambda: learner.update(batch, objective))
    tokens = args.batch * args.seq
    res = {"spec": spec_name, "update_s": statistics.median(upd), "update_all_s": upd,
           "forward_s": statistics.median(fwd), "forward_all_s": fwd,
           "update_tokens_per_s": tokens / statistics.median(upd), "forward_tokens_per_s": tokens / statistics.median(fwd),
           "peak_gib": peak, "params": sum(p.numel() for p in learner.model.parameters())}
    del learner, model
    release_memory(device)
    return res


def kernel_table(title: str, fn, rows: int = 18) -> None:
    """The CUDA kernels of one call of `fn` by GPU time, and its host-side ops by CPU time (where
    the aligned learner's time goes)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(f"--- CUDA kernels, {title}")
    print(table.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60), flush=True)
    print(f"--- host ops, {title}")
    print(table.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60), flush=True)


def main(argv=None) -> dict:
    ap = base_parser(__doc__)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro", type=int, default=4, help="sequences per forward (gradient accumulation)")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print the CUDA kernel table of one forward and one update")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = {s: run_spec(s, args, device, dtype) for s in SPECS}
    base, al = rows["none"], rows["w8a8_kv8"]
    report = {"model": args.model, "batch": args.batch, "seq": args.seq, "micro": args.micro,
              "checkpointing": args.checkpointing, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu", "dtype": str(dtype), "torch": torch.__version__, "results": rows,
              "ratio_update": al["update_s"] / base["update_s"], "ratio_forward": al["forward_s"] / base["forward_s"]}
    print(f"\nlearner {args.model} B={args.batch} L={args.seq} micro={args.micro} ckpt={args.checkpointing} "
          f"{report['device']} {dtype}")
    print(f"{'spec':<10} {'update s':>9} {'upd tok/s':>10} {'fwd s':>8} {'fwd tok/s':>10} {'peak GiB':>9}")
    for r in rows.values():
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        print(f"{r['spec']:<10} {r['update_s']:>9.3f} {r['update_tokens_per_s']:>10.0f} {r['forward_s']:>8.3f} "
              f"{r['forward_tokens_per_s']:>10.0f} {peak:>9}")
    print(f"aligned / none: update {report['ratio_update']:.3f}x  forward {report['ratio_forward']:.3f}x")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        path = Path(args.out) / f"bench_learner_{args.model}{'_ckpt' if args.checkpointing else ''}.json"
        path.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
