"""One RL step on 2 devices driven by torch.distributed directly (no Ray): 2 rollout workers and a
2-rank data-parallel learner, colocated (process r holds engine r and learner rank r on device r).

Ray cannot travel to the GPU machine (its wheel is larger than what may be carried), so this script
runs the same worker classes the Ray actors hold (`EngineWorker`, `RankLearner`) in two processes
joined by one process group (NCCL on CUDA, gloo on CPU) and reports, side by side in one run:

1. **Rollout throughput**: one engine (process 0; process 1 idles) against two engines playing at
   once. *Weak scaling*: every engine holds the same batch of episodes (2 engines play twice the
   episodes; the capacity of the deployment), the number the ≥ 1.8× target is about. *Strong
   scaling*: the same episodes split over the two engines (a memory-bound decode step costs nearly
   as much at half the batch, so this ratio is lower; reported as measured).
2. **Gradient**: the 2-rank gradient of the aligned (QAT) learner on a batch built from the
   rollouts (`collate` of real `Trajectory` records, GRPO advantages, InterQ-RL token weights
   computed once on the whole batch) against the one-device gradient on the same batch
   (``max |Δg| / max |g|``; the ranks sum fp32 partial gradients of other micro-batch compositions).
3. **The RL step**: old/ref log-probs (rows split over the ranks), one optimizer step per minibatch
   (one all-reduce each), replicas checked equal across ranks, and the weight sync (each engine
   requantizes its own rank's weights in place: the replicas are equal, so no broadcast is needed in
   colocated mode), each phase timed.

    python -m agentq.eval.bench_distributed_gpu --model 1b --out $OUT          # 2 GPUs (NCCL)
    python -m agentq.eval.bench_distributed_gpu --device cpu --model tiny      # CPU (gloo), as CI runs it
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from agentq.eval.bench_common import SHAPES, qwen3_config

WORLD = 2
OBS = 16          # observation tokens appended after every turn (they enter the context, not the loss)


def hf_config(args):
    return qwen3_config(args.model, max_len(args))


def max_len(args) -> int:
    return args.prompt + args.turns * (args.new + OBS) + 32


def build_model(cfg, device: str):
    """The same random-init model on every rank: rank 0's weights are broadcast."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    for p in model.state_dict().values():
        dist.broadcast(p, 0)
    return model


# ---------------------------------------------------------------------- rollouts
def play(engine, episodes: list[int], args) -> tuple[list, float]:
    """`args.turns` turns of `args.new` tokens for every episode; returns (per-episode records, seconds).
    Episode e's prompt and observations depend on e alone (the same on any engine)."""
    from agentq.rollout.backend import SamplingParams, TurnRequest

    vocab = SHAPES[args.model]["vocab_size"]
    sp = SamplingParams(max_new_tokens=args.new)
    ctx = {e: [(7 * j + 13 * e) % (vocab - 3) + 3 for j in range(args.prompt)] for e in episodes}
    recs = {e: {"prompt": list(ctx[e]), "turns": []} for e in episodes}
    sync(args)
    t = time.perf_counter()
    for turn in range(args.turns):
        for r in engine.generate([TurnRequest(e, ctx[e], sp, seed=1000 + e) for e in episodes]):
            obs = [(11 * r.episode_id + 5 * turn + j) % (vocab - 3) + 3 for j in range(OBS)]
            recs[r.episode_id]["turns"].append((r.token_ids, r.logprobs, obs))
            ctx[r.episode_id] = ctx[r.episode_id] + r.token_ids + obs
    sync(args)
    elapsed = time.perf_counter() - t
    for e in episodes:
        engine.release(e)
    return [recs[e] for e in episodes], elapsed


def trajectory(e: int, rec: dict):
    from agentq.agent.trajectory import Trajectory

    t = Trajectory(episode_id=e, task_id=f"task{e // 8}", split="train", group_id=e // 8)
    t.append(rec["prompt"], sampled=False)
    for s, (ids, logps, obs) in enumerate(rec["turns"], start=1):
        t.append(ids, sampled=True, seg=s, logps=logps)
        t.append(obs, sampled=False)
    t.reward = float((e * 2654435761) % 7 < 3)             # a fixed, seeded 0/1 outcome per episode
    return t


def gather_objects(obj):
    out = [None] * WORLD
    dist.all_gather_object(out, obj)      # between this script's own processes only
    return out


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def rollout_phase(engine, rank: int, args, report: dict):
    """1 engine vs 2 engines (weak and strong scaling); returns the weak run's records of all ranks."""
    B = args.batch
    eps_one = list(range(B))
    if rank == 0:
        recs1, t1 = play(engine, eps_one, args)
    else:
        sync(args), sync(args)
        recs1, t1 = [], 0.0
    mine = list(range(rank * B, (rank + 1) * B))                     # weak: B episodes per engine
    recs_w, tw = play(engine, mine, args)
    half = eps_one[rank::WORLD]                                       # strong: the B episodes split
    recs_s, ts = play(engine, half, args)
    times = gather_objects({"t1": t1, "tw": tw, "ts": ts, "strong": dict(zip(half, recs_s))})
    if rank == 0:
        t_one = times[0]["t1"]
        tok = lambda recs: sum(len(ids) for r in recs for ids, _, _ in r["turns"])    # noqa: E731
        n1 = tok(recs1)
        tw_max, ts_max = max(x["tw"] for x in times), max(x["ts"] for x in times)
        strong = {**times[0]["strong"], **times[1]["strong"]}
        same = sum(all(a[0] == b[0] for a, b in zip(recs1[e]["turns"], strong[e]["turns"])) for e in eps_one)
        report["rollout"] = {
            "one_engine_tok_s": n1 / t_one, "two_engines_weak_tok_s": 2 * n1 / tw_max,
            "weak_scaling": (2 * n1 / tw_max) / (n1 / t_one), "two_engines_strong_tok_s": n1 / ts_max,
            "strong_scaling": t_one / ts_max, "episodes_same_tokens_split_vs_one": f"{same}/{B}",
            "seconds": {"one": t_one, "two_weak": tw_max, "two_strong": ts_max}}
        print(json.dumps(report["rollout"], indent=1), flush=True)
    return gather_objects((mine, recs_w))


# ---------------------------------------------------------------------- learner
def make_batch(parts, args):
    from agentq.algos.advantages import grpo_advantages
    from agentq.learner.batch import collate

    trajs = [trajectory(e, r) for eps, recs in parts for e, r in zip(eps, recs)][: args.learn_episodes]
    rewards = torch.tensor([t.reward for t in trajs])
    adv = grpo_advantages(rewards, torch.tensor([t.group_id for t in trajs]))
    return collate(trajs, adv)


def fill_old_and_ref_sharded(learner, batch, rank: int, device: str):
    """Every rank scores its rows; one all-reduce (SUM over disjoint rows) gives all ranks the batch's."""
    from agentq.learner.distributed import shard_rows

    rows = shard_rows(batch.attention_mask.sum(1), rank, WORLD,
                      batch.input_ids if learner.logprob_batching.shares_prefixes else None)
    old, ref = learner.logprobs_rows(batch, rows)
    full = torch.zeros((2, *batch.input_ids.shape), device=device)
    full[0, rows], full[1, rows] = old.to(device), ref.to(device)
    dist.all_reduce(full)
    batch.old_logp, batch.ref_logp = full[0].cpu(), full[1].cpu()


def learner_phase(model, engine, parts, rank: int, args, report: dict) -> None:
    from agentq.algos import make_objective
    from agentq.kernels.quant_spec import QuantSpec
    from agentq.learner.distributed import RankLearner, flat_grad
    from agentq.learner.learner import Learner

    device = f"{args.device}:{rank}" if args.device == "cuda" else "cpu"
    spec = QuantSpec.preset(args.quant)
    kw = dict(dtype=torch.float32, device=device, lr=1e-5, micro_batch_size=args.micro, use_reference=True)
    objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.001,
                               budget_B=1.0, H_floor=1.0, budget_scope="trajectory", prefix_inclusive=True)
    batch = make_batch(parts, args)
    ranker = RankLearner(rank, WORLD, copy.deepcopy(model), spec, **kw)
    timings = {}
    sync(args)
    t = time.perf_counter()
    fill_old_and_ref_sharded(ranker, batch, rank, device)
    sync(args)
    timings["old_ref_logp_s"] = time.perf_counter() - t
    batch = batch.weighted(objective.prepare(batch))      # token weights once, on the whole batch
    got = ranker.reduced_gradient(batch, objective)
    sums = gather_objects(float(got.double().sum()))
    if rank == 0:                                # the one-device gradient of the same batch
        single = Learner(copy.deepcopy(model), spec, **kw)
        single.accumulate_grads(batch, objective, {})
        want = flat_grad(single.model)
        del single
        free(args)
        err = float((got - want).abs().max()) / float(want.abs().max())
        report["gradient"] = {"max_abs_diff_over_max_abs": err, "max_abs_grad": float(want.abs().max()),
                              "ranks_equal": sums[0] == sums[1], "rows": batch.num_seqs,
                              "tokens": int(batch.attention_mask.sum()), "tolerance": args.grad_tol}
        print("gradient:", json.dumps(report["gradient"]), flush=True)
    sync(args)
    plan = [p for p in torch.randperm(batch.num_seqs, generator=torch.Generator().manual_seed(7)).split(args.minibatch)]
    sync(args)
    t = time.perf_counter()
    _, norms, _ = ranker.update_minibatches(batch, objective, plan)
    sync(args)
    timings["update_s"] = time.perf_counter() - t
    params = torch.cat([p.detach().reshape(-1)[:4096].cpu() for p in ranker.model.parameters()])
    replicas = gather_objects(float(params.double().sum()))
    t = time.perf_counter()
    stats = engine.update_weights(dict(ranker.named_weights()), version=1)
    sync(args)
    timings["weight_sync_s"] = time.perf_counter() - t
    if rank == 0:
        report["rl_step"] = {**timings, "optimizer_steps": len(norms), "grad_norms": norms,
                             "replicas_equal": replicas[0] == replicas[1],
                             "int8_codes_changed": stats.int8_codes_changed}
        print("rl step:", json.dumps(report["rl_step"]), flush=True)


def free(args):
    import gc

    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------- processes
def worker(rank: int, args, port: int) -> None:
    from agentq.kernels.quant_spec import QuantSpec
    from agentq.rollout.distributed import EngineWorker

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    device = f"cuda:{rank}" if cuda else "cpu"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, device_id=torch.device(device) if cuda else None)
    report = {"model": args.model, "quant": args.quant, "device": torch.cuda.get_device_name() if cuda else "cpu",
              "batch_per_engine": args.batch, "prompt": args.prompt, "turns": args.turns, "new": args.new}
    cfg = hf_config(args)
    model = build_model(cfg, device)
    engine = EngineWorker(cfg, QuantSpec.preset(args.quant),
                          {"max_slots": args.batch, "max_len": max_len(args), "device": device,
                           "dtype": torch.bfloat16 if cuda else torch.float32})
    engine.update_weights(model.state_dict(), version=0)
    for n in (args.batch, args.batch // 2):      # untimed: kernel compilation, graph capture of both batch sizes
        play(engine, list(range(10_000, 10_000 + n)), args)
    parts = rollout_phase(engine, rank, args, report)
    learner_phase(model, engine, parts, rank, args, report)
    if rank == 0:
        g = report["gradient"]
        report["checks"] = {"gradient_within_tolerance": g["max_abs_diff_over_max_abs"] <= args.grad_tol,
                            "ranks_equal": g["ranks_equal"], "replicas_equal": report["rl_step"]["replicas_equal"]}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"distributed-{args.device}-{args.model}.json").write_text(json.dumps(report, indent=1))
        print("checks:", report["checks"], flush=True)
    # both ranks tear down together: rank 1 finishing first, while rank 0 still writes its report,
    # closed gloo's connection under rank 0's threads (SIGABRT, "terminate called without an
    # active exception", once in CI)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--quant", default="w8a8_kv8")
    ap.add_argument("--batch", type=int, default=64, help="episodes per engine")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new", type=int, default=64, help="tokens per turn")
    ap.add_argument("--learn-episodes", type=int, default=32, help="trajectories in the learner's batch")
    ap.add_argument("--minibatch", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4, help="trajectories per learner forward")
    ap.add_argument("--grad-tol", type=float, default=1e-4, help="max |Δg| / max |g| allowed")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        raise SystemExit(f"--device cuda needs {WORLD} GPUs; this machine has {torch.cuda.device_count()}")
    torch.multiprocessing.spawn(worker, args=(args, free_port()), nprocs=WORLD, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
