"""One whole RL step on one device, `algo=interq` (W8A8-KV8 rollouts + aligned learner) vs
`algo=bf16` (full-precision rollouts and learner), same model and synthetic multi-turn batch.

The batch: E episodes (groups of G) of T turns: a P-token prompt, then per turn N sampled tokens
(no stop token, so every turn is N long) followed by an O-token observation (random ids, the
same for both algos). With `--group-prompt` the G episodes of a group share their prompt, as a
GRPO group does (the engine then prefills it once per group, `TorchEngine(share_prefill=True)`;
`--no-share` prefills every row). Each phase is timed the way `agentq/trainer/rl.py` runs it:
  rollout  `TorchEngine.generate` turn by turn (delta prefill of the observation, batched decode);
  old_ref  `Learner.fill_old_and_ref` (π_old and π_ref no-grad forwards); with `--old-logp bypass`
           (`trainer.old_logp`) `Learner.fill_ref`, π_ref only (every preset has kl_coef > 0);
  update   the objective's `prepare` + `Learner.update` (one PPO epoch, whole-batch minibatch); with
           bypass the update takes π_old from its own forward and weighs per micro-batch, then the
           whole batch's `prepare` the trainer logs;
  sync     `TorchEngine.update_weights(learner.named_weights())`.
Only the public engine API is used, so engine speed-ups show up here unchanged. Objective
parameters come from `conf/algo/<algo>.yaml` (read with PyYAML: no Hydra needed). `--grad-input
int8` gives the aligned learners (interq) int8 dX in backward (`trainer.grad_input`); a learner
without aligned linears (bf16) is unaffected. An algo written `NAME+int8dx` in `--algos` runs with
int8 dX whatever `--grad-input` says, so `--algos interq,interq+int8dx,bf16` times both dX GEMMs
against bf16 in one process. `NAME+allhead` runs the learner's LM head at every position, not only
at those that predict action tokens (`Learner(head_tokens="all")`): `--algos
interq,bf16,interq+allhead,bf16+allhead` times what that saves each algo, and compares each entry
with the bf16 entry of the same head.

    python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --logprob-micro 64 --out runs/bench  # H200
    python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --logprob-micro 64 --algos interq,interq+int8dx,bf16  # H200
    python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --logprob-micro 64 --quantized-rollout w8a8_kv8_head
    python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --logprob-micro 64 --old-logp bypass
    python -m agentq.eval.bench_rl_step --model 4b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --activation-checkpointing --group-prompt
    python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --logprob-micro 64 --host-profile
    python -m agentq.eval.bench_rl_step --model tiny --episodes 8 --turns 2 --prompt 32 --obs 16 --new 8   # CPU

`--profile` (CUDA) prints where each phase's GPU time goes and how much of a rollout the GPU sits
idle, and each quantized entry's ceiling (`gpu_time_ceiling`): the most its step could gain over
bf16 in GPU time if every GEMM it moves to int8 ran at the int8 peak (2x the cuBLAS time it
replaces), its decode attention read fewer bytes at bf16's speed, and quantization launches cost
nothing, with the rest (the bf16 backward, other attention, norms, sampling) as in bf16;
`--host-profile` prints cProfile tables of one rollout and one old_ref pass, for the phases
where the host holds the GPU back (the eager prefill of a turn's observation, the learner's passes).

On an fp32 (CPU) learner bypass is timed but not what the trainer runs: there the π_old pass computes
attention in fp64 and the training pass in fp32, so the trainer refuses bypass (`grad_pass_refusal`)
and the mismatch printed below then carries the training pass's rounding.

On a GPU the learner wants larger forwards than the trainer's CPU-sized default of 8 trajectories:
the aligned path launches more per layer, so small forwards leave it host-bound (round 7 on the
H200: 0.90x at --micro 8, 1.06-1.11x at --micro 16 --logprob-micro 64; docs/kernels-history.md).
"""
from __future__ import annotations

import json
import statistics
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from agentq.eval.bench_common import (base_parser, gpu_s_by_class, kernel_table, kernel_timeline, print_timeline,
                                      profile_host, profiled_kernels, random_model, release_memory, sync)
from agentq.kernels.jit_watch import counting_compiles
from agentq.kernels.ste import GRAD_INPUTS
from agentq.kernels.triton_attention import kv_bytes_per_token
from agentq.learner.learner import OLD_LOGP_MODES
from agentq.rollout.torch_engine.prefill_graphs import DEFAULT_MAX_TOKENS as DEFAULT_PREFILL_GRAPH_TOKENS

PHASES = ("rollout", "old_ref", "update", "sync")


def algo_preset(name: str) -> dict:
    """conf/algo/<name>.yaml → {"rollout_quant", "learner_quant", "objective", "params"}."""
    import yaml

    text = resources.files("agentq.conf").joinpath("algo", f"{name}.yaml").read_text()
    doc = yaml.safe_load(text)
    algo = doc["algo"]
    rollout = next(d["override /rollout"] for d in doc.get("defaults", []) if isinstance(d, dict)
                   and "override /rollout" in d)
    params = dict(algo.get("objective_params") or {})
    return {"rollout_quant": rollout, "learner_quant": algo["learner_quant"], "objective": algo["objective"],
            "params": dict(params, clip_eps=algo["clip_eps"], dual_clip=algo["dual_clip"], kl_coef=algo["kl_coef"],
                           loss_agg=algo["loss_agg"])}


def rollout_spec_name(preset: str) -> str:
    import yaml

    return yaml.safe_load(resources.files("agentq.conf").joinpath("rollout", f"{preset}.yaml").read_text())["quant"]


def play(engine, args, vocab: int, step: int):
    """E episodes × T turns through `engine.generate`; returns Trajectories."""
    from agentq.agent.trajectory import Trajectory
    from agentq.rollout import SamplingParams, TurnRequest

    g = torch.Generator().manual_seed(1000 + step)
    sp = SamplingParams(max_new_tokens=args.new)
    trajs = [Trajectory(episode_id=step * args.episodes + i, task_id=f"t{i // args.group}", split="train",
                        group_id=i // args.group) for i in range(args.episodes)]
    prompts = [torch.randint(0, vocab, (args.prompt,), generator=g).tolist() for _ in trajs]
    for i, t in enumerate(trajs):
        t.append(prompts[i - i % args.group if args.group_prompt else i], sampled=False)
    for turn in range(1, args.turns + 1):
        reqs = [TurnRequest(t.episode_id, list(t.input_ids), sp, seed=t.episode_id * 31 + turn) for t in trajs]
        for t, r in zip(trajs, engine.generate(reqs)):
            t.append(r.token_ids, sampled=True, seg=turn, logps=r.logprobs)
            t.turns = turn
            if turn < args.turns:
                t.append(torch.randint(0, vocab, (args.obs,), generator=g).tolist(), sampled=False)
    for t in trajs:
        engine.release(t.episode_id)
    return trajs


def fill_no_grad(learner, batch, args) -> None:
    """The no-grad pass before the update: π_old and π_ref, or π_ref only in bypass mode."""
    (learner.fill_ref if args.old_logp == "bypass" else learner.fill_old_and_ref)(batch)


def learn(learner, objective, batch, args, t: dict, device: torch.device):
    """The old_ref and update phases as the trainer runs them in `args.old_logp` mode (times into
    `t`); returns the weighted batch with old_logp filled."""
    t0 = time.perf_counter()
    fill_no_grad(learner, batch, args)
    sync(device)
    t["old_ref"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.old_logp == "bypass":       # π_old and weights inside the update; the logged prepare after it
        learner.update(batch, objective, epochs=1, minibatch_size=args.episodes, old_logp_mode="bypass")
        batch = batch.weighted(objective.prepare(batch))
    else:
        batch = batch.weighted(objective.prepare(batch))
        learner.update(batch, objective, epochs=1, minibatch_size=args.episodes)
    sync(device)
    t["update"] = time.perf_counter() - t0
    return batch


def profile_phases(entry: str, engine, learner, objective, batch, args, vocab: int, step: int) -> dict:
    """After the timed steps (CUDA): one more rollout's kernel timeline (how much of its span the
    GPU is busy: the host's share of the phase), then the kernel and host-op tables of old_ref and
    update. Returns the rollout's {"span_s", "busy_s", "idle_frac", "kernels"} and, under
    "by_class", each profiled phase's kernel seconds per `kernel_class` (for `gpu_time_ceiling`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        play(engine, args, vocab, step)
        torch.cuda.synchronize()
    rollout = profiled_kernels(prof)
    timeline = kernel_timeline(rollout)
    print_timeline(f"{entry}: one rollout", timeline, rows=args.profile_rows)
    old_ref = kernel_table(f"{entry}: old_ref", lambda: fill_no_grad(learner, batch, args), rows=args.profile_rows)
    update = kernel_table(f"{entry}: update", lambda: learner.update(
        batch, objective, epochs=1, minibatch_size=args.episodes, old_logp_mode=args.old_logp), rows=args.profile_rows)
    return {"span_s": timeline["span_us"] / 1e6, "busy_s": timeline["busy_us"] / 1e6,
            "idle_frac": timeline["idle_frac"], "kernels": timeline["kernels_per_step"],
            "by_class": {"rollout": gpu_s_by_class(rollout), "old_ref": gpu_s_by_class(old_ref),
                         "update": gpu_s_by_class(update)}}


#: int8 over bf16 dense tensor-core peak on the GPUs this targets (Hopper: ~1,979 against ~989 TOP/s)
INT8_GEMM_PEAK_RATIO = 2.0


def kv_read_ratio(spec, head_dim: int) -> float:
    """Bytes a bf16 KV cache reads per cached position over what the spec's cache reads (codes, and
    an fp32 scale per token and head for int8 per-token formats): decode attention's ideal speed-up."""
    if not spec.kv_quantized:
        return 1.0
    scale = 4 if spec.kv.startswith("int8") else 0
    return kv_bytes_per_token(1, 1, head_dim, torch.bfloat16) / kv_bytes_per_token(1, 1, head_dim, torch.int8, scale)


def gpu_time_ceiling(bf16: dict, quant: dict, gemm_ratio: float, attention_ratio: float) -> dict[str, float]:
    """The most a quantized step can gain over bf16 in GPU time, per phase and for the profiled
    phases together (Amdahl), from each algo's kernel seconds per class ({phase: {class: s}}): the
    bf16 step with the GEMM work the quantized algo moves to int8 (bf16's cuBLAS time less what the
    quantized algo still runs there: its bf16 LM head, the learner's backward) `gemm_ratio` times
    faster, its decode attention `attention_ratio` times faster, the rest unchanged, and the
    quantization's own launches (codes, K/V writes) free. Host time and idle GPU are not counted."""
    out, total, bound = {}, 0.0, 0.0
    for phase, b in bf16.items():
        t = sum(b.values())
        moved = max(0.0, b["bf16_gemm"] - quant[phase]["bf16_gemm"])
        best = t - moved * (1 - 1 / gemm_ratio) - b["decode_attention"] * (1 - 1 / attention_ratio)
        out[phase] = t / best
        total, bound = total + t, bound + best
    out["step"] = total / bound
    return out


#: `--algos` suffixes → the learner arguments they set: "+int8dx", the aligned learner's dX in int8;
#: "+allhead", the LM head at every position rather than at the action tokens' only; "+noshare",
#: packs that compute every row's prompt (`Learner(share_prefix=False)`) rather than a group's once
ALGO_VARIANTS = {"int8dx": ("grad_input", "int8"), "allhead": ("head_tokens", "all"),
                 "noshare": ("share_prefix", False)}
#: variants whose cost both algos pay alike: an entry with them is compared with bf16 with them too
SHARED_COST_VARIANTS = ("allhead", "noshare")


def parse_algo(entry: str, grad_input: str) -> tuple[str, dict[str, Any]]:
    """(conf/algo name, learner arguments {"grad_input", "head_tokens", "share_prefix"}) of an
    `--algos` entry "NAME[+VARIANT...]"; `grad_input` is `--grad-input`, which "+int8dx" overrides."""
    name, *variants = entry.split("+")
    unknown = [v for v in variants if v not in ALGO_VARIANTS]
    if unknown:
        raise SystemExit(f"--algos {entry!r}: unknown variant {unknown}; valid: {sorted(ALGO_VARIANTS)}")
    learner_kw: dict[str, Any] = {"grad_input": grad_input, "head_tokens": "actions", "share_prefix": True}
    learner_kw.update(ALGO_VARIANTS[v] for v in variants)
    return name, learner_kw


def baseline_of(entry: str, entries) -> str | None:
    """The bf16 entry `entry` is compared with: "bf16" with the same `SHARED_COST_VARIANTS` when
    that ran (costs both algos share), else "bf16"; None without one."""
    same = "+".join(["bf16", *[v for v in entry.split("+")[1:] if v in SHARED_COST_VARIANTS]])
    return same if same in entries else ("bf16" if "bf16" in entries else None)


def run_algo(entry: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    from agentq.algos import grpo_advantages, make_objective, mismatch_metrics
    from agentq.kernels import QuantSpec
    from agentq.learner.batch import collate
    from agentq.learner.learner import Learner
    from agentq.rollout.torch_engine.engine import TorchEngine

    name, learner_kw = parse_algo(entry, args.grad_input)
    pre = algo_preset(name)
    rollout_spec = QuantSpec.preset(rollout_spec_name(pre["rollout_quant"]))
    if args.quantized_rollout and rollout_spec.linear_quantized:      # e.g. w8a8_kv8_head for interq
        rollout_spec = QuantSpec.preset(args.quantized_rollout)
    aligned = pre["learner_quant"] == "aligned"
    learner_spec = rollout_spec if aligned else QuantSpec.preset("none")
    max_len = args.prompt + args.turns * (args.new + args.obs) + 8
    model, cfg = random_model(args.model, max_len, device, dtype)
    learner = Learner(model, learner_spec, dtype=dtype, device=str(device), lr=1e-6,
                      use_reference=float(pre["params"]["kl_coef"]) > 0, micro_batch_size=args.micro,
                      pack_tokens=args.pack_tokens, logprob_micro_batch_size=args.logprob_micro,
                      logprob_pack_tokens=args.logprob_pack_tokens,
                      grad_input=learner_kw["grad_input"] if aligned else "bf16",
                      cuda_graphs=args.cuda_graphs, head_tokens=learner_kw["head_tokens"],
                      share_prefix=learner_kw["share_prefix"],
                      activation_checkpointing=args.activation_checkpointing)
    engine = TorchEngine(cfg, rollout_spec, max_slots=args.episodes, max_len=max_len, dtype=dtype, device=device,
                         share_prefill=not args.no_share, prefill_graph_tokens=args.prefill_graph_tokens)
    engine.update_weights(learner.named_weights(), version=0)
    objective = make_objective(pre["objective"], **pre["params"])
    times = {p: [] for p in PHASES}
    mism = []
    if device.type == "cuda":               # the step's peak: learner, its optimizer state, engine, KV
        torch.cuda.reset_peak_memory_stats(device)
    compiles = []                           # Triton compiles per timed step: their time is in the phases
    for step in range(args.warmup + args.steps):
        t = {}
        with counting_compiles() as compiled:
            sync(device)
            t0 = time.perf_counter()
            trajs = play(engine, args, cfg.vocab_size, step)
            sync(device)
            t["rollout"] = time.perf_counter() - t0
            rewards = torch.rand(len(trajs), generator=torch.Generator().manual_seed(step))
            batch = collate(trajs, grpo_advantages(rewards, torch.tensor([x.group_id for x in trajs])))
            batch = learn(learner, objective, batch, args, t, device)
            t0 = time.perf_counter()
            engine.update_weights(learner.named_weights(), version=step + 1)
            sync(device)
            t["sync"] = time.perf_counter() - t0
        if step >= args.warmup:
            for p in PHASES:
                times[p].append(t[p])
            mism.append(mismatch_metrics(batch))       # π_old (learner) vs μ (engine), per turn too
            if compiled.available:
                compiles.append(compiled.total)
        print(f"[{entry}] step {step}: " + " ".join(f"{p} {t[p]:.2f}s" for p in PHASES)
              + (f", {compiled.describe()}" if device.type == "cuda" else ""), flush=True)
    if args.host_profile:           # after the timed steps: where the host time of the eager phases goes
        step = args.warmup + args.steps
        profile_host(f"{entry}: one rollout", lambda: (play(engine, args, cfg.vocab_size, step), sync(device)),
                     rows=args.profile_rows)
        profile_host(f"{entry}: old_ref", lambda: (fill_no_grad(learner, batch, args), sync(device)),
                     rows=args.profile_rows)
    rollout_gpu, by_class = None, None
    if args.profile and device.type == "cuda":        # after the timed steps: where each phase's time goes
        rollout_gpu = profile_phases(entry, engine, learner, objective, batch, args, cfg.vocab_size,
                                     args.warmup + args.steps)
        by_class = rollout_gpu.pop("by_class")
    med = {p: statistics.median(v) for p, v in times.items()}
    res = {"algo": entry, "rollout_quant": rollout_spec.name, "learner_quant": learner_spec.name,
           "grad_input": learner.grad_input, "head_tokens": learner.head_tokens,
           "share_prefix": learner_kw["share_prefix"], "old_logp": args.old_logp,
           "activation_checkpointing": bool(getattr(learner.model, "is_gradient_checkpointing", False)),
           "objective": pre["objective"], "phases_s": med, "phases_all_s": times, "step_s": sum(med.values()),
           "timed_step_compiles": compiles,
           "action_tokens": int(sum(x.num_action_tokens for x in trajs)), "tokens": int(sum(x.num_tokens for x in trajs)),
           "mismatch": mism[-1] if mism else {},
           "peak_gib": torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None,
           "rollout_gpu": rollout_gpu, "gpu_s_by_class": by_class,
           "kv_read_ratio": kv_read_ratio(rollout_spec, cfg.head_dim),
           "prefill_graph_stats": dict(engine.prefiller.stats),
           "sync_graph_stats": dict(engine.syncer.stats)}
    del learner, engine, model
    release_memory(device)
    return res


def print_ceilings(rows: dict, report: dict) -> None:
    """With --profile: each quantized entry's `gpu_time_ceiling` over its bf16 baseline (into `report`
    as "ceiling_<entry>"), beside what the timed steps gained: how far the design lets it go."""
    for entry, q in rows.items():
        base = baseline_of(entry, rows)
        if base is None or entry.startswith("bf16") or not (q["gpu_s_by_class"] and rows[base]["gpu_s_by_class"]):
            continue
        ceil = gpu_time_ceiling(rows[base]["gpu_s_by_class"], q["gpu_s_by_class"], INT8_GEMM_PEAK_RATIO,
                                q["kv_read_ratio"])
        report["ceiling_" + entry.replace("+", "_")] = ceil
        print(f"ceiling of {entry} over {base} in GPU time (int8 GEMMs {INT8_GEMM_PEAK_RATIO:g}x the cuBLAS "
              f"time they replace, decode attention {q['kv_read_ratio']:.2f}x (bytes), quantization launches "
              "free, the rest as bf16's): " + " ".join(f"{p} {v:.2f}x" for p, v in ceil.items()))


def main(argv=None) -> dict:
    ap = base_parser(__doc__)
    ap.add_argument("--algos", default="interq,bf16")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--group", type=int, default=8, help="episodes per task (GRPO group)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--obs", type=int, default=128)
    ap.add_argument("--new", type=int, default=64, help="sampled tokens per turn")
    ap.add_argument("--micro", type=int, default=8, help="trajectories per learner forward")
    ap.add_argument("--pack-tokens", type=int, default=None,
                    help="learner sequence packing: packs of at most this many tokens (default: padded micro-batches)")
    ap.add_argument("--logprob-micro", type=int, default=None,
                    help="trajectories per no-grad forward of π_old / π_ref (default: --micro)")
    ap.add_argument("--logprob-pack-tokens", type=int, default=None,
                    help="packs of the no-grad forwards (default: --pack-tokens)")
    ap.add_argument("--grad-input", default="bf16", choices=GRAD_INPUTS,
                    help="the aligned learner's dX GEMM in backward (trainer.grad_input; bf16 learners unaffected)")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="the learner's packed passes as CUDA graphs, both algos (trainer.cuda_graphs; needs "
                         "--pack-tokens and/or --logprob-pack-tokens)")
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="recompute each decoder layer in the update's backward (trainer.activation_checkpointing; "
                         "what fits a 4B update's activations at 20k-token packs on one GPU), both algos")
    ap.add_argument("--quantized-rollout", default=None, metavar="PRESET",
                    help="QuantSpec preset for the algos whose rollouts are quantized (default: their conf/algo "
                         "preset's, w8a8_kv8); an aligned learner follows it")
    ap.add_argument("--old-logp", default="recompute", choices=OLD_LOGP_MODES,
                    help="where π_old comes from (trainer.old_logp): a no-grad pass (recompute) or the update's "
                         "own forward (bypass: the old_ref phase then holds π_ref only)")
    ap.add_argument("--group-prompt", action="store_true", help="the episodes of a group share their prompt (GRPO)")
    ap.add_argument("--no-share", action="store_true", help="the engine prefills every row (share_prefill=False)")
    ap.add_argument("--prefill-graph-tokens", type=int, default=DEFAULT_PREFILL_GRAPH_TOKENS,
                    help="the engine's prefill chunks of at most this many tokens a row replay CUDA graphs (0: eager)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3,
                    help="timed steps after --warmup; each phase is their median (with 3, one slow step, e.g. one "
                         "that compiled a kernel, does not move it)")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps: one rollout's GPU busy share and kernels, the CUDA kernel and "
                         "host-op tables of old_ref and update")
    ap.add_argument("--host-profile", action="store_true",
                    help="after the timed steps: cProfile tables (own, cumulative time) of one rollout and one "
                         "old_ref pass, for phases the host holds back")
    ap.add_argument("--profile-rows", type=int, default=25)
    ap.add_argument("--plot", action="store_true",
                    help="with --out: the phases of each algo's step as stacked bars (matplotlib), beside the JSON")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = {a: run_algo(a, args, device, dtype) for a in args.algos.split(",")}
    report = {"model": args.model, "args": vars(args), "dtype": str(dtype), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "results": rows}
    print(f"\nRL step {args.model}: {args.episodes} episodes x {args.turns} turns, prompt {args.prompt}, "
          f"obs {args.obs}, {args.new} new/turn, aligned dX {args.grad_input}, pack {args.pack_tokens} / "
          f"{args.logprob_pack_tokens}, CUDA graphs {args.cuda_graphs}, checkpointing {args.activation_checkpointing}, "
          f"old_logp {args.old_logp}, "
          f"group prompts {args.group_prompt} (shared prefill {not args.no_share}), "
          f"prefill chunks of ≤ {args.prefill_graph_tokens} tokens from CUDA graphs, "
          f"{report['device']} {dtype}")
    print(f"{'algo':<13} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'step s':>8} {'peak GiB':>9}")
    for r in rows.values():
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        print(f"{r['algo']:<13} " + " ".join(f"{r['phases_s'][p]:>9.3f}" for p in PHASES)
              + f" {r['step_s']:>8.3f} {peak:>9}")
    for r in rows.values():
        if r["rollout_gpu"]:
            g = r["rollout_gpu"]
            print(f"{r['algo']} rollout (profiled): GPU busy {g['busy_s']:.3f} s of a {g['span_s']:.3f} s span "
                  f"({100 * (1 - g['idle_frac']):.0f} %), {g['kernels']:.0f} kernels")
    for r in rows.values():
        if any(r["timed_step_compiles"]):        # a step class first seen in a timed step: its time holds the compile
            print(f"{r['algo']}: the timed steps compiled {r['timed_step_compiles']} Triton kernels (step by step); "
                  f"the medians hold that time: more --warmup or --steps leave it out")
    for r in rows.values():
        m = r["mismatch"]
        print(f"{r['algo']} mismatch: max|Δlogp| {m['dlogp_abs_max']:.3e} K3 {m['k3']:.3e} K3 by turn "
              + " ".join(f"{v:.2e}" for v in m["k3_by_turn"]))
    for entry, q in rows.items():
        base = baseline_of(entry, rows)
        if base is None or entry.startswith("bf16"):
            continue
        b = rows[base]
        key = "speedup_bf16_over_" + entry.replace("+", "_")
        report[key] = b["step_s"] / q["step_s"]
        print(f"{base} / {entry}: " + " ".join(f"{p} {b['phases_s'][p] / q['phases_s'][p]:.2f}x" for p in PHASES)
              + f"  step {report[key]:.2f}x (> 1 = quantized faster)")
    print_ceilings(rows, report)
    for variant, what, saved_by in (("allhead", "head_actions_over_all", "the head at the actions only"),
                                    ("noshare", "shared_prefix_over_none", "computing shared prefixes once")):
        for entry in [e for e in rows if e.endswith("+" + variant)]:     # what the default saves each algo
            plain = entry.replace("+" + variant, "")
            if plain in rows:
                key = f"speedup_{what}_" + plain.replace("+", "_")
                report[key] = rows[entry]["step_s"] / rows[plain]["step_s"]
                print(f"{entry} / {plain}: " + " ".join(
                    f"{p} {rows[entry]['phases_s'][p] / rows[plain]['phases_s'][p]:.2f}x" for p in PHASES)
                    + f"  step {report[key]:.2f}x (> 1 = {saved_by} is faster)")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        suffix = (("_int8dx" if args.grad_input == "int8" else "") + ("_dxab" if "+int8dx" in args.algos else "")
                  + ("_headab" if "+allhead" in args.algos else "") + ("_shareab" if "+noshare" in args.algos else "")
                  + ("_graphs" if args.cuda_graphs else "") + ("_ckpt" if args.activation_checkpointing else "")
                  + ("_bypass" if args.old_logp == "bypass" else "") + ("_groupprompt" if args.group_prompt else ""))
        stem = Path(args.out) / f"bench_rl_step_{args.model}{suffix}"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
        if args.plot:
            from agentq.eval.plots import rl_step_plot

            rl_step_plot({args.model: report}, stem.with_suffix(".png"))
    return report


if __name__ == "__main__":
    main()
