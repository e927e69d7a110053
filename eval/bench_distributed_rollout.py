"""Rollout throughput with 2 engines vs 1: `DistributedBackend` over Ray actors, same model, same
episodes, measured side by side in one run (the ratio is the result; absolute numbers depend on the
machine).

B episodes each get a P-token prompt and T turns of N decoded tokens (no stop token; every turn
after the first appends a 16-token observation, so the delta prefill runs). Episodes are spread over
the engines by the backend's least-loaded assignment. One warm-up turn per configuration is not
timed.

    python -m agentq.eval.bench_distributed_rollout                        # CPU: tiny model, 2 CPU actors
    python -m agentq.eval.bench_distributed_rollout --gpus --model 1b      # one GPU per engine (not run yet)

On CPU each engine actor gets one core (torch threads = 1); on a 2-core machine that other work
also loads, the ratio falls short of 2 (reported as measured).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from agentq.kernels.quant_spec import QuantSpec
from agentq.rollout.backend import SamplingParams, TurnRequest
from agentq.rollout.distributed import DistributedBackend
from agentq.eval.bench_common import SHAPES, qwen3_config


def hf_model(shape: str):
    from transformers import AutoModelForCausalLM

    cfg = qwen3_config(shape, 4096 - 256)
    torch.manual_seed(0)
    return cfg, AutoModelForCausalLM.from_config(cfg).state_dict()


def run(workers: int, cfg, weights, args) -> dict:
    gpu = {"num_gpus": 1} if args.gpus else {}
    backend = DistributedBackend(cfg, QuantSpec.preset(args.quant), workers, args.batch,
                                 [{"num_cpus": 1, **gpu}] * workers,
                                 {"max_len": args.prompt + args.turns * (args.new + 16) + 32,
                                  "dtype": torch.bfloat16 if args.gpus else torch.float32,
                                  "device": "cuda" if args.gpus else "cpu"},
                                 threads=None if args.gpus else 1)
    try:
        backend.update_weights(weights.items(), version=0)
        sp = SamplingParams(max_new_tokens=args.new)
        g = torch.Generator().manual_seed(1)
        vocab = cfg.vocab_size
        ctx = {e: torch.randint(3, vocab, (args.prompt,), generator=g).tolist() for e in range(args.batch)}

        def one_turn(first_id: int) -> int:
            reqs = [TurnRequest(first_id + e, ctx[e], sp, seed=e) for e in range(args.batch)]
            out = backend.generate(reqs)
            for e, r in enumerate(out):
                ctx[e] = ctx[e] + r.token_ids + torch.randint(3, vocab, (16,), generator=g).tolist()
            return sum(len(r.token_ids) for r in out)

        one_turn(10**6)                           # warm-up episodes (their own ids, then released)
        for e in range(args.batch):
            backend.release(10**6 + e)
            ctx[e] = ctx[e][: args.prompt]
        t0 = time.perf_counter()
        tokens = sum(one_turn(0) for _ in range(args.turns))
        dt = time.perf_counter() - t0
        return {"workers": workers, "tokens": tokens, "seconds": round(dt, 3), "tokens_per_s": round(tokens / dt, 1)}
    finally:
        backend.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=16, help="episodes in flight")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=32, help="tokens decoded per turn")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--quant", default="w8a8_kv8")
    ap.add_argument("--gpus", action="store_true", help="one GPU per engine")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    args = ap.parse_args()

    from agentq.pool.ray_pool import keep_local_cluster_on_loopback, ray_init_kwargs

    keep_local_cluster_on_loopback()
    import ray

    ray.init(**ray_init_kwargs(None), num_cpus=args.num_cpus)     # a new local cluster, as the trainer starts one
    try:
        cfg, weights = hf_model(args.model)
        one, two = run(1, cfg, weights, args), run(2, cfg, weights, args)
    finally:
        ray.shutdown()
    print(json.dumps({"model": args.model, "batch": args.batch, "prompt": args.prompt, "new": args.new,
                      "turns": args.turns, "quant": args.quant, "one_engine": one, "two_engines": two,
                      "ratio": round(two["tokens_per_s"] / one["tokens_per_s"], 2)}, indent=1))


if __name__ == "__main__":
    main()
