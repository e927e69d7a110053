"""Speed, memory and reference rewards of agentq/WebShop-v0.

    python -m agentq.eval.bench_webshop                   # 1,000 goals of the generated catalog
    python -m agentq.eval.bench_webshop --goals 200 --json out.json
    python -m agentq.eval.bench_webshop --data-dir ~/webshop/data   # WebShop's real files

Builds the shop from scratch (catalog or files, goals, BM25 index), then plays goals 0..N-1 twice:
with the oracle (search, open the goal item, choose its options, buy) and with the "first result"
baseline (search the instruction, buy the first result without choosing options). Reports build
time, per-step and per-reset wall time (the policy's own time excluded), memory (RSS) and the
mean rewards (the oracle must score 1.0).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

from agentq.envs.webshop.env import WebShopEnv
from agentq.envs.webshop.experts import oracle_action, search_queries
from agentq.envs.webshop.shop import _cached_shop, get_shop
from agentq.eval.bench_common import write_json


def rss_mb() -> float:
    """Current resident set size in MiB (Linux /proc; elsewhere the peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return peak_rss_mb()


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


def _split_of(env: WebShopEnv, i: int) -> str:
    return next(s for s, r in env._ranges.items() if i in r)


def play(env: WebShopEnv, goals: int, policy: str) -> dict:
    """Run `policy` ("oracle" or "first") on goals 0..goals-1; time env.reset/env.step only."""
    step_ms, reset_ms, rewards, wins, steps = [], [], [], 0, 0
    by_kind: dict[str, list[float]] = {"search": [], "click": []}
    for i in range(goals):
        t0 = time.perf_counter()
        obs, info = env.reset(options={"task_id": str(i), "split": _split_of(env, i)})
        reset_ms.append((time.perf_counter() - t0) * 1e3)
        plan = None
        if policy == "first":
            plan = [f"search[{search_queries(env.goal)[0]}]", None, "click[buy now]"]
        n = 0
        while True:
            if policy == "oracle":
                action = oracle_action(env.session)
            else:
                action = plan[n] or f"click[{env.session.page_products()[0].lower()}]"
            t0 = time.perf_counter()
            obs, r, term, trunc, info = env.step(action)
            dt = (time.perf_counter() - t0) * 1e3
            step_ms.append(dt)
            by_kind["search" if action.startswith("search[") else "click"].append(dt)
            n += 1
            if term or trunc:
                break
        steps += n
        rewards.append(r)
        wins += bool(info["won"])
    q = statistics.quantiles(step_ms, n=100)
    return {
        "policy": policy, "episodes": goals, "steps": steps, "mean_reward": sum(rewards) / goals,
        "success_rate": wins / goals, "mean_reward_first_100_test": sum(rewards[:100]) / min(100, goals),
        "step_ms_mean": statistics.fmean(step_ms), "step_ms_p50": q[49], "step_ms_p99": q[98],
        "search_step_ms_mean": statistics.fmean(by_kind["search"]) if by_kind["search"] else None,
        "click_step_ms_mean": statistics.fmean(by_kind["click"]) if by_kind["click"] else None,
        "reset_ms_mean": statistics.fmean(reset_ms),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--goals", type=int, default=1000, help="goals 0..N-1 to play (default 1000)")
    ap.add_argument("--num-products", type=int, default=None,
                    help="generated catalog size (default 1000); with real data, the first N products (default all)")
    ap.add_argument("--catalog-seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None, help="WebShop's real files (default: $WEBSHOP_DATA, else generated)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)

    rss0 = rss_mb()
    _cached_shop.cache_clear()
    t0 = time.perf_counter()
    shop = get_shop(data_dir=args.data_dir, num_products=args.num_products, catalog_seed=args.catalog_seed)
    build_s = time.perf_counter() - t0
    rss_shop = rss_mb()
    n = len(shop.goals)      # small data sets (e.g. the test fixture) get proportionally smaller splits
    sizes = {"test": min(500, n // 3), "dev": min(1000, n // 3)}
    envs = [WebShopEnv(data_dir=args.data_dir, num_products=args.num_products, catalog_seed=args.catalog_seed,
                       max_steps=50, split_sizes=sizes) for _ in range(10)]
    rss_envs = rss_mb()
    env = envs[0]
    goals = min(args.goals, len(shop.goals))
    results = {
        "shop": shop.source, "products": len(shop.products), "goals_total": len(shop.goals),
        "build_s": build_s, "rss_mb_start": rss0, "rss_mb_after_build": rss_shop,
        "rss_mb_shop": rss_shop - rss0, "rss_mb_per_extra_env": (rss_envs - rss_shop) / len(envs),
        "oracle": play(env, goals, "oracle"), "first_result": play(env, goals, "first"),
    }
    results["rss_mb_end"] = rss_mb()
    results["rss_mb_peak"] = peak_rss_mb()

    o, f = results["oracle"], results["first_result"]
    print(f"shop: {results['shop']}: {results['products']} products, {results['goals_total']} goals; "
          f"built in {build_s:.2f} s")
    print(f"memory: RSS {rss0:.0f} MiB at start, {rss_shop:.0f} MiB with the shop (+{results['rss_mb_shop']:.1f}), "
          f"+{results['rss_mb_per_extra_env']:.2f} MiB per extra env, peak {results['rss_mb_peak']:.0f} MiB")
    print(f"{'policy':<14}{'goals':>6}{'steps':>7}{'reward':>8}{'success':>9}{'step ms':>9}{'p50':>7}{'p99':>7}"
          f"{'search':>8}{'click':>7}{'reset':>7}")
    for name, r in (("oracle", o), ("first result", f)):
        print(f"{name:<14}{r['episodes']:>6}{r['steps']:>7}{r['mean_reward']:>8.4f}{r['success_rate']:>9.3f}"
              f"{r['step_ms_mean']:>9.3f}{r['step_ms_p50']:>7.3f}{r['step_ms_p99']:>7.3f}"
              f"{r['search_step_ms_mean']:>8.3f}{r['click_step_ms_mean']:>7.3f}{r['reset_ms_mean']:>7.3f}")
    print(f"first 100 test goals: oracle {o['mean_reward_first_100_test']:.4f}, "
          f"first result {f['mean_reward_first_100_test']:.4f}")
    write_json(args.json, results, indent=2)
    return results


if __name__ == "__main__":
    main()
