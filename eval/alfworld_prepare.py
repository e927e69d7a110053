"""Pre-generate ALFWorld games (and planner walkthroughs) into the cache, before a run needs them.

    python -m agentq.eval.alfworld_prepare --split gen_train                 # games only (seconds)
    python -m agentq.eval.alfworld_prepare --split gen_train --walkthroughs  # + planner walkthroughs
    python -m agentq.eval.alfworld_prepare --split valid_unseen --walkthroughs --limit 20

Games are otherwise written on first use, and walkthroughs computed on the first expert=True
reset of a game; doing it up front keeps that cost (about 0.2-1 s of planning per game, plus the
game's first load) out of a training run. The cache folder is --cache-dir, else
$AGENTQ_ALFWORLD_CACHE, else ~/.cache/agentq/alfworld.
"""
from __future__ import annotations

import argparse
import sys
import time


def _open_split(a: argparse.Namespace):
    """(the env, the first --limit task ids of --split).

    Raises:
        SystemExit(2): the env refused the split (a misspelled name, a real split without its games),
            after one line on stderr, as the agentq commands end on bad input; it was a traceback.
    """
    from agentq.envs import make
    from agentq.envs.alfworld import generator as gen
    from agentq.envs.base import SplitRefused

    kwargs = {"cache_dir": a.cache_dir, "data_dir": a.data_dir}
    if a.gen_per_type is not None:
        kwargs["gen_sizes"] = {a.split: a.gen_per_type} if a.split in gen.GEN_SPLITS else None
    try:
        env = make("alfworld", split=a.split, expert=a.walkthroughs, expert_type="planner", **kwargs)
        return env, env.unwrapped.list_tasks()[: a.limit]
    except SplitRefused as e:
        print(f"alfworld_prepare: --split {a.split}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="gen_train")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--data-dir", default=None, help="for real splits (default $ALFWORLD_DATA)")
    p.add_argument("--gen-per-type", type=int, default=None, help="games per task type (generated splits)")
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks of the split")
    p.add_argument("--walkthroughs", action="store_true", help="also compute and cache planner walkthroughs")
    a = p.parse_args(argv)

    from agentq.envs.alfworld import generator as gen
    env, tasks = _open_split(a)
    u = env.unwrapped
    t0 = time.perf_counter()
    missing = []
    for i, tid in enumerate(tasks):
        if a.walkthroughs:
            _, info = env.reset(options={"task_id": tid})
            if info["expert_action"] is None:
                missing.append(tid)
        elif a.split in gen.GEN_SPLITS:
            gen.ensure_game(u.cache_dir, tid)
        if (i + 1) % 100 == 0:
            print(f"{i + 1}/{len(tasks)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    env.close()
    out = {"split": a.split, "tasks": len(tasks), "cache_dir": str(u.cache_dir), "no_plan": missing,
           "seconds": round(time.perf_counter() - t0, 1)}
    print(f"{a.split}: {len(tasks)} tasks ready in {out['cache_dir']} ({out['seconds']} s); "
          f"without a plan: {len(missing)}")
    return out


if __name__ == "__main__":
    main()
