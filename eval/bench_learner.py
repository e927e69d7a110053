"""Learner throughput: the aligned (QAT, W8A8-KV8) learner vs the same model with
`QuantSpec.preset("none")`, on one random-init Qwen3-shaped model and one batch, in one run.

Times, per spec (median over --iters after --warmup):
  * `update`: one optimizer step of `Learner.update` (forward + backward over the micro-batches,
    gradient clipping, AdamW) on B sequences of L tokens;
  * `forward`: the no-grad forward that computes π_old / π_ref (`Learner.logprobs`).
Reports tokens/s, peak GPU memory of the update, and aligned / none ratios side by side.
`--grad-input int8` runs the aligned learner's backward with int8 dX (`Learner(grad_input=)`; the
none spec has no aligned linears and is unaffected). Either way the aligned model's gradient error
of int8 dX against bf16 dX is measured on the same batch and weights after the timings: the
weight gradients of one minibatch under each option, compared per parameter kind over the layers
(cosine similarity, relative error ‖g_int8 − g_bf16‖ / ‖g_bf16‖), so one run reports speed and error.

With `--pack-tokens N` it compares instead, for one spec (`--spec`, default the aligned one), the
micro-batches of today (`--micro` rows each, length-sorted, padded to their longest) against
sequence packing (`Learner(pack_tokens=N)`: rows end to end, no padding) on a batch of mixed
lengths (`--mixed`: lengths uniform in [seq/8, seq], seeded): positions computed, forwards per
pass, and the same two timings.

With `--cuda-graphs` it runs both specs packed (`--pack-tokens`, default `--micro` × `--seq`),
each eagerly and with the packed passes replayed as CUDA graphs (`Learner(cuda_graphs=True)`),
four learners in one process: aligned / none in each mode, and eager / graphs per spec. The
warmup calls capture the graphs; the timed calls replay them.

    python -m agentq.eval.bench_learner --model 1b --batch 4 --seq 2048 --micro 4 --out runs/bench   # H200
    python -m agentq.eval.bench_learner --model 1b --batch 4 --seq 2048 --micro 4 --grad-input int8   # H200
    python -m agentq.eval.bench_learner --model 8b --batch 4 --seq 2048 --micro 1 --out runs/bench   # H200
    python -m agentq.eval.bench_learner --model 1b --batch 4 --seq 2048 --micro 4 --cuda-graphs --warmup 2 --iters 6  # H200
    python -m agentq.eval.bench_learner --model tiny --batch 4 --seq 128 --iters 3                   # CPU
    python -m agentq.eval.bench_learner --model tiny --batch 32 --seq 512 --mixed --micro 2 --pack-tokens 1024  # CPU
"""
from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import torch

from agentq.eval.bench_common import (base_parser, kernel_table, profile_host, random_model, release_memory, sync,
                                      time_calls)
from agentq.kernels.ste import GRAD_INPUTS

SPECS = ("none", "w8a8_kv8")


def synthetic_batch(batch: int, seq: int, vocab: int, seed: int = 0, lengths: list[int] | None = None):
    """B sequences of random ids, right-padded to `seq` (full length when `lengths` is None); every
    real token after the first is an action token."""
    from agentq.learner.batch import PolicyBatch

    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths if lengths is not None else [seq] * batch)
    attn = (torch.arange(seq)[None] < lens[:, None]).long()
    ids = torch.randint(0, vocab, (batch, seq), generator=g) * attn
    mask = attn.float()
    mask[:, 0] = 0
    return PolicyBatch(input_ids=ids, attention_mask=attn, action_mask=mask,
                       seg_id=mask.long(), rollout_logp=torch.zeros(batch, seq),
                       adv=torch.randn(batch, generator=g))


def mixed_lengths(batch: int, seq: int, seed: int = 0) -> list[int]:
    """Episode lengths uniform in [seq/8, seq] (multi-turn episodes: won early or run to the cap)."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(max(seq // 8, 2), seq + 1, (batch,), generator=g).tolist()


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


def timed_launch_ab(fn, device: torch.device, warmup: int, iters: int) -> dict[str, list[float]]:
    """Seconds per call of fn with direct Triton launches and with Triton's own launch path,
    alternating call by call in one process (`_launch.direct_launches`), so the two share the host,
    the allocator state and the GPU clocks: {"direct": [...], "triton": [...]}, `iters` each."""
    from agentq.kernels import _launch

    out: dict[str, list[float]] = {"direct": [], "triton": []}
    for i in range(2 * (warmup + iters)):
        direct = i % 2 == 0
        with _launch.direct_launches(direct):
            _launch.enabled()                 # the switch is read (and Triton's source checked) untimed
            (t,) = timed(fn, device, 0, 1)
        if i >= 2 * warmup:
            out["direct" if direct else "triton"].append(t)
    return out


def run_spec(spec_name: str, args, device: torch.device, dtype: torch.dtype, pack_tokens: int | None = None,
             cuda_graphs: bool = False) -> dict:
    from agentq.algos import make_objective
    from agentq.kernels import QuantSpec
    from agentq.learner.learner import Learner
    from agentq.learner.packing import padded_tokens

    model, cfg = random_model(args.model, args.seq, device, dtype)
    aligned = spec_name != "none"
    learner = Learner(model, QuantSpec.preset(spec_name), dtype=dtype, device=str(device), use_reference=False,
                      micro_batch_size=args.micro, lr=1e-6, activation_checkpointing=args.checkpointing,
                      pack_tokens=pack_tokens, logprob_micro_batch_size=args.logprob_micro,
                      grad_input=args.grad_input if aligned else "bf16", cuda_graphs=cuda_graphs)
    lengths = mixed_lengths(args.batch, args.seq) if args.mixed else None
    batch = synthetic_batch(args.batch, args.seq, cfg.vocab_size, lengths=lengths)
    lengths = batch.attention_mask.sum(1).tolist()
    groups = [g.tolist() for g in learner.micro_batches(batch.attention_mask.sum(1))]
    objective = make_objective("grpo", kl_coef=0.0)
    fwd = timed(lambda: learner.logprobs(batch), device, args.warmup, args.iters)
    batch.old_logp = learner.logprobs(batch)
    batch = batch.weighted(objective.prepare(batch))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    upd = timed(lambda: learner.update(batch, objective), device, args.warmup, args.iters)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    launch_ab = (timed_launch_ab(lambda: learner.update(batch, objective), device, args.warmup, args.iters)
                 if args.launch_ab else None)
    if args.profile and device.type == "cuda":
        kernel_table(f"{spec_name}: no-grad forward", lambda: learner.logprobs(batch), rows=args.profile_rows)
        kernel_table(f"{spec_name}: update", lambda: learner.update(batch, objective), rows=args.profile_rows)
    tokens = sum(lengths)
    res = {"spec": spec_name, "grad_input": learner.grad_input, "pack_tokens": pack_tokens, "cuda_graphs": cuda_graphs,
           "real_tokens": tokens,
           "forwards": len(groups),
           "computed_tokens": padded_tokens(lengths, groups, packed=pack_tokens is not None), "update_s": statistics.median(upd), "update_all_s": upd,
           "forward_s": statistics.median(fwd), "forward_all_s": fwd,
           "update_tokens_per_s": tokens / statistics.median(upd), "forward_tokens_per_s": tokens / statistics.median(fwd),
           "peak_gib": peak, "params": sum(p.numel() for p in learner.model.parameters())}
    if launch_ab is not None:
        res["launch_ab_update_s"] = {k: statistics.median(v) for k, v in launch_ab.items()}
        res["launch_ab_update_all_s"] = launch_ab
    if aligned and args.grad_error and pack_tokens is None:          # the main comparison only
        res["grad_error"] = grad_error(learner, batch, objective)
    del learner, model
    release_memory(device)
    return res


def grad_error(learner, batch, objective) -> dict:
    """The weight gradients of one minibatch (the whole batch, the learner's micro-batches) with int8
    dX against bf16 dX, the same weights: per parameter kind (layer index folded to *), the min /
    median cosine similarity and median / max relative error over the layers, and the same two for
    all parameters as one vector. The learner's own option is restored afterwards."""
    from agentq.learner.qat import set_grad_input

    own = learner.grad_input
    set_grad_input(learner.model, "bf16")
    learner.accumulate_grads(batch, objective, {})
    ref = {n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    set_grad_input(learner.model, "int8")
    learner.accumulate_grads(batch, objective, {})
    set_grad_input(learner.model, own)
    kinds: dict[str, list[tuple[float, float]]] = {}
    dot = sq_a = sq_b = sq_d = 0.0
    for name, p in learner.model.named_parameters():
        if name not in ref:
            continue
        a, b = p.grad.detach().float().flatten(), ref.pop(name).float().flatten()
        ab, aa, bb, dd = (float(v) for v in (a @ b, a @ a, b @ b, (a - b).pow(2).sum()))
        dot, sq_a, sq_b, sq_d = dot + ab, sq_a + aa, sq_b + bb, sq_d + dd
        cos = ab / max((aa * bb) ** 0.5, 1e-300)
        kinds.setdefault(re.sub(r"\.\d+\.", ".*.", name), []).append((cos, (dd / max(bb, 1e-300)) ** 0.5))
    learner.opt.zero_grad(set_to_none=True)
    per_kind = {k: {"layers": len(v), "cos_min": min(c for c, _ in v), "cos_median": statistics.median(c for c, _ in v),
                    "rel_median": statistics.median(r for _, r in v), "rel_max": max(r for _, r in v)}
                for k, v in kinds.items()}
    return {"per_kind": per_kind, "cos_all": dot / max((sq_a * sq_b) ** 0.5, 1e-300),
            "rel_all": (sq_d / max(sq_b, 1e-300)) ** 0.5}


def print_grad_error(err: dict) -> None:
    print("\ngradient error of int8 dX vs bf16 dX (aligned model, the measured batch, same weights)")
    print(f"{'parameter kind':<46} {'layers':>6} {'cos min':>9} {'cos med':>9} {'rel med':>9} {'rel max':>9}")
    for kind, r in err["per_kind"].items():
        print(f"{kind:<46} {r['layers']:>6} {r['cos_min']:>9.6f} {r['cos_median']:>9.6f} {r['rel_median']:>9.2e} "
              f"{r['rel_max']:>9.2e}")
    print(f"{'all parameters, one vector':<46} {'':>6} {err['cos_all']:>9.6f} {'':>9} {err['rel_all']:>9.2e}")


def host_cost(device: torch.device, dtype: torch.dtype, calls: int = 400, profile: bool = False) -> dict:
    """µs of wall time per call at [16, 256] x [256, 256] (the GPU idles; what is measured is the
    host's launch path): F.linear vs the aligned linear, forward and forward + backward, and the
    launches the aligned one is made of; the launch-heavy cases again through Triton's own launch
    path instead of `_launch`'s direct one. On the H200 machine (round 16, Triton's path) a Triton
    launch cost ~5 torch ops."""
    import torch.nn.functional as F

    from agentq.kernels import QuantSpec, _launch, ste
    from agentq.kernels.quant import quantize_rows as quantize_rows_ref

    spec = QuantSpec.preset("w8a8_kv8")
    x = torch.randn(16, 256, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(256, 256, device=device, dtype=dtype, requires_grad=True)
    wc, ac = ste.WeightCache(), ste.ActivationCache()
    xq, sx = quantize_rows_ref(x.detach(), 1e-8, "half_away")
    wq, sw = quantize_rows_ref(w.detach(), 1e-8, "half_away")

    def fwd_bwd(f):
        def run():
            f().sum().backward()
            ac.clear()
        return run

    cases = {"F.linear fwd": lambda: F.linear(x, w),
             "aligned linear fwd (codes cached)": lambda: ste.w8a8_linear_ste(x, w, None, spec, wc, act_cache=ac),
             "int8 GEMM launch alone": lambda: ste._int8_linear(xq, sx, wq, sw, None, dtype, None),
             "activation quantization alone": lambda: ste.quantize_rows(x.detach(), 1e-8, "half_away", None),
             "one torch op (x + 1)": lambda: x.detach() + 1,
             "F.linear fwd+bwd": fwd_bwd(lambda: F.linear(x, w)),
             "aligned linear fwd+bwd": fwd_bwd(lambda: ste.w8a8_linear_ste(x, w, None, spec, wc, act_cache=ac))}
    out = {}
    # each launch-heavy case again through Triton's own launch path (`_launch.direct_launches(False)`)
    runs = [(name, fn, True) for name, fn in cases.items()] + [
        (f"{name} [Triton's launch]", cases[name], False)
        for name in ("int8 GEMM launch alone", "activation quantization alone", "aligned linear fwd+bwd")]
    for name, fn, direct in runs:
        with _launch.direct_launches(direct):
            out[name] = time_calls(fn, calls, device) * 1e6
        print(f"{name:52s} {out[name]:7.1f} µs/call")
    print(f"direct launches on: {_launch.enabled()}; launches since import {dict(_launch.counts)}")
    if profile:
        for name in ("int8 GEMM launch alone", "aligned linear fwd+bwd"):
            profile_host(name, cases[name], calls)
    return out


def main(argv=None) -> dict:
    ap = base_parser(__doc__)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro", type=int, default=4, help="sequences per forward (gradient accumulation)")
    ap.add_argument("--logprob-micro", type=int, default=None,
                    help="sequences per no-grad forward (Learner logprob_micro_batch_size; default --micro)")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    ap.add_argument("--grad-input", default="bf16", choices=GRAD_INPUTS,
                    help="the aligned learner's dX GEMM in backward (Learner grad_input; the none spec is unaffected)")
    ap.add_argument("--no-grad-error", dest="grad_error", action="store_false",
                    help="skip the int8-vs-bf16 dX gradient comparison after the timings")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print the CUDA kernel table of one forward and one update")
    ap.add_argument("--profile-rows", type=int, default=18)
    ap.add_argument("--mixed", action="store_true", help="sequence lengths uniform in [seq/8, seq] instead of all seq")
    ap.add_argument("--pack-tokens", type=int, default=None,
                    help="compare today's padded micro-batches with packs of at most this many tokens")
    ap.add_argument("--spec", default="w8a8_kv8", choices=SPECS, help="the spec of the --pack-tokens comparison")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="both specs packed (--pack-tokens, default micro × seq), each eager and as CUDA graphs "
                         "(Learner(cuda_graphs=True)), side by side in one run")
    ap.add_argument("--launch-ab", action="store_true",
                    help="also time each spec's update with direct Triton launches and with Triton's own launch "
                         "path, alternating call by call in one process")
    ap.add_argument("--host-cost", action="store_true",
                    help="only the host time per call of the aligned linear vs F.linear (and their launches) at "
                         "tiny shapes, where the CPU sets the pace")
    ap.add_argument("--host-profile", action="store_true",
                    help="--host-cost, then cProfile tables of the int8 GEMM launch and the aligned linear fwd+bwd")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.host_cost or args.host_profile:
        return host_cost(device, dtype, profile=args.host_profile)
    if args.cuda_graphs:
        return graphs_report(args, device, dtype)
    if args.pack_tokens is not None:
        return packing_report(args, device, dtype)
    rows = {s: run_spec(s, args, device, dtype) for s in SPECS}
    base, al = rows["none"], rows["w8a8_kv8"]
    report = {"model": args.model, "batch": args.batch, "seq": args.seq, "micro": args.micro,
              "logprob_micro": args.logprob_micro, "grad_input": args.grad_input,
              "checkpointing": args.checkpointing, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu", "dtype": str(dtype), "torch": torch.__version__, "results": rows,
              "ratio_update": al["update_s"] / base["update_s"], "ratio_forward": al["forward_s"] / base["forward_s"]}
    print(f"\nlearner {args.model} B={args.batch} L={args.seq} micro={args.micro} "
          f"logprob micro={args.logprob_micro or args.micro} ckpt={args.checkpointing} "
          f"aligned dX {args.grad_input} {report['device']} {dtype}")
    print_rows(rows, "spec", 10)
    print(f"aligned / none: update {report['ratio_update']:.3f}x  forward {report['ratio_forward']:.3f}x")
    if args.launch_ab:
        d = {s: rows[s]["launch_ab_update_s"] for s in SPECS}
        print("update, direct launches / Triton's launch path (alternating in one process): "
              + ", ".join(f"{s} {d[s]['direct']:.3f} / {d[s]['triton']:.3f} s" for s in SPECS)
              + f"; aligned / none {d['w8a8_kv8']['direct'] / d['none']['direct']:.3f}x / "
              f"{d['w8a8_kv8']['triton'] / d['none']['triton']:.3f}x")
    if "grad_error" in al:
        print_grad_error(al["grad_error"])
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        path = Path(args.out) / (f"bench_learner_{args.model}{'_ckpt' if args.checkpointing else ''}"
                                 f"{'_int8dx' if args.grad_input == 'int8' else ''}.json")
        path.write_text(json.dumps(report, indent=1))
    return report


def print_rows(rows: dict[str, dict], label: str, width: int) -> None:
    """The table of `run_spec` results: update and forward seconds and tokens/s, peak memory."""
    print(f"{label:<{width}} {'update s':>9} {'upd tok/s':>10} {'fwd s':>8} {'fwd tok/s':>10} {'peak GiB':>9}")
    for name, r in rows.items():
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        print(f"{name:<{width}} {r['update_s']:>9.3f} {r['update_tokens_per_s']:>10.0f} {r['forward_s']:>8.3f} "
              f"{r['forward_tokens_per_s']:>10.0f} {peak:>9}")


def graphs_report(args, device: torch.device, dtype: torch.dtype) -> dict:
    """Both specs, packed, eager and with CUDA graphs (the learner's host time out of the step), one
    process: aligned / none in each mode, and what the graphs buy each spec."""
    pack = args.pack_tokens or args.micro * args.seq
    rows = {f"{s}/{mode}": run_spec(s, args, device, dtype, pack_tokens=pack, cuda_graphs=mode == "graphs")
            for mode in ("eager", "graphs") for s in SPECS}
    report = {"model": args.model, "batch": args.batch, "seq": args.seq, "mixed": args.mixed, "pack_tokens": pack,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": str(dtype),
              "torch": torch.__version__, "results": rows}
    print(f"\nlearner {args.model} B={args.batch} L≤{args.seq} mixed={args.mixed} packed ≤ {pack} tokens, "
          f"{report['device']} {dtype}")
    print_rows(rows, "spec / mode", 18)
    for mode in ("eager", "graphs"):
        al, base = rows[f"w8a8_kv8/{mode}"], rows[f"none/{mode}"]
        report[f"ratio_update_{mode}"] = al["update_s"] / base["update_s"]
        report[f"ratio_forward_{mode}"] = al["forward_s"] / base["forward_s"]
        print(f"aligned / none, {mode}: update {report[f'ratio_update_{mode}']:.3f}x  "
              f"forward {report[f'ratio_forward_{mode}']:.3f}x")
    for s in SPECS:
        e, g = rows[f"{s}/eager"], rows[f"{s}/graphs"]
        print(f"{s}: eager / graphs update {e['update_s'] / g['update_s']:.2f}x  forward "
              f"{e['forward_s'] / g['forward_s']:.2f}x")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"bench_learner_graphs_{args.model}.json").write_text(json.dumps(report, indent=1))
    return report


def packing_report(args, device: torch.device, dtype: torch.dtype) -> dict:
    """Today's padded micro-batches vs sequence packing, one spec, the same batch: printed and saved."""
    rows = {"padded": run_spec(args.spec, args, device, dtype),
            "packed": run_spec(args.spec, args, device, dtype, pack_tokens=args.pack_tokens)}
    pad, pk = rows["padded"], rows["packed"]
    report = {"model": args.model, "batch": args.batch, "seq": args.seq, "mixed": args.mixed, "micro": args.micro,
              "pack_tokens": args.pack_tokens, "spec": args.spec, "device": str(device), "dtype": str(dtype),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "results": rows,
              "speedup_update": pad["update_s"] / pk["update_s"], "speedup_forward": pad["forward_s"] / pk["forward_s"]}
    print(f"\nlearner {args.model} {args.spec} B={args.batch} L≤{args.seq} mixed={args.mixed} "
          f"real tokens {pad['real_tokens']} {report['device']} {dtype} threads={report['threads']}")
    print(f"{'arm':<26} {'positions':>9} {'padding':>8} {'forwards':>8} {'update s':>9} {'fwd s':>8}")
    for name, r in rows.items():
        arm = f"{name} (micro {args.micro})" if name == "padded" else f"packed (≤ {args.pack_tokens} tokens)"
        pad_frac = 1 - r["real_tokens"] / r["computed_tokens"]
        print(f"{arm:<26} {r['computed_tokens']:>9} {100 * pad_frac:>7.1f}% {r['forwards']:>8} {r['update_s']:>9.3f} "
              f"{r['forward_s']:>8.3f}")
    print(f"padded / packed time: update {report['speedup_update']:.2f}x  forward {report['speedup_forward']:.2f}x")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"bench_learner_packing_{args.model}.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
