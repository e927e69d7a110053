"""ALFWorld benchmark: experts through agentq's wrapper, and step time before/after the parse cache.

    python -m agentq.eval.bench_alfworld --archive ../shared/data/alfworld-json_2.1.1-valid.tar.gz
    python -m agentq.eval.bench_alfworld            # uses $ALFWORLD_DATA
    python -m agentq.eval.bench_alfworld --quick    # 6 real games, 1 generated game per type, 2 speed games

Sections (each can be skipped):
1. handcoded: ALFWorld's handcoded expert on a fixed sample of valid_unseen games (numpy seed 0,
   40 games), 50-step cap, success per task type.
2. planner: the planner walkthrough on generated games, `--gen-per-type` games of each task type
   from each of gen_seen and gen_unseen (and, with `--handcoded-gen-per-type N`, the handcoded
   expert on N gen_seen games per type).
3. speed: seeded random episodes (admissible and invalid commands) recorded on the unpatched
   engine, replayed with the parse cache; reports median step time of both and whether every
   observation and admissible-command list is byte-identical; also the time to reset a game that
   was played before, without and with the PDDL translation memo.

Writes a JSON report with `--json PATH`. The functions are also used by tests/envs/test_alfworld.py.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tarfile
import tempfile
import time
from collections import defaultdict

import numpy as np

from agentq.eval.bench_common import write_json

INVALID = "fly to the moon"


def make_env(split: str, **kwargs):
    from agentq.envs import make

    return make("alfworld", split=split, **kwargs)


def fixed_sample(task_ids: list[str], n: int, seed: int = 0) -> list[str]:
    """n ids drawn without replacement by numpy's default_rng(seed), in sorted order."""
    if n >= len(task_ids):
        return sorted(task_ids)
    return sorted(np.random.default_rng(seed).choice(sorted(task_ids), n, replace=False).tolist())


def per_type_sample(task_ids: list[str], per_type: int, task_type) -> list[str]:
    """The first `per_type` ids of each task type, in list order."""
    out, seen = [], defaultdict(int)
    for t in task_ids:
        k = task_type(t)
        if seen[k] < per_type:
            out.append(t)
            seen[k] += 1
    return out


def expert_eval(env, task_ids: list[str], split: str, log=None) -> dict:
    """Play each task with `info["expert_action"]`; success per task type and overall."""
    from agentq.envs.alfworld.experts import play_expert
    by_type: dict[str, list[dict]] = defaultdict(list)
    t0 = time.perf_counter()
    for tid in task_ids:
        r = play_expert(env, tid, split)
        by_type[r["task_type"]].append(r)
        if log:
            log(f"  {'WON ' if r['won'] else 'lost'} {r['steps']:3d} steps  {split}:{tid}")
    rows = {k: {"n": len(v), "won": sum(r["won"] for r in v),
                "success": sum(r["won"] for r in v) / len(v),
                "mean_steps_won": statistics.mean([r["steps"] for r in v if r["won"]] or [float("nan")])}
            for k, v in sorted(by_type.items())}
    n = sum(r["n"] for r in rows.values())
    won = sum(r["won"] for r in rows.values())
    return {"split": split, "n": n, "won": won, "success": won / max(n, 1), "per_type": rows,
            "seconds": round(time.perf_counter() - t0, 1),
            "lost": [r["task_id"] for v in by_type.values() for r in v if not r["won"]]}


def random_actions(info: dict, rng: random.Random, i: int) -> str:
    """A command for a recorded episode: invalid every 5th step, else interact more than walk."""
    if i % 5 == 4:
        return INVALID
    acts = info["admissible_actions"]
    act = [a for a in acts if not a.startswith(("go to", "look", "help", "inventory"))]
    return rng.choice(act if act and rng.random() < 0.5 else acts)


def record(env, task_ids: list[str], split: str, steps: int, seed: int = 0, actions=None) -> list[dict]:
    """Play each task for `steps` turns (seeded random commands, or `actions` to replay).

    Returns one transcript per task: commands, observations, admissible lists, step times.
    """
    out = []
    for k, tid in enumerate(task_ids):
        rng = random.Random(f"{seed}/{tid}")
        obs, info = env.reset(options={"task_id": tid, "split": split})
        tr = {"task_id": tid, "actions": [], "obs": [obs], "admissible": [info["admissible_actions"]], "step_s": []}
        for i in range(steps):
            a = actions[k][i] if actions else random_actions(info, rng, i)
            t = time.perf_counter()
            obs, _, term, trunc, info = env.step(a)
            tr["step_s"].append(time.perf_counter() - t)
            tr["actions"].append(a)
            tr["obs"].append(obs)
            tr["admissible"].append(info["admissible_actions"])
            if term or trunc:
                break
        out.append(tr)
    return out


def speed_compare(env, task_ids: list[str], split: str, steps: int) -> dict:
    """Median step time on the unpatched engine vs with the parse cache, and output identity."""
    from agentq.envs.alfworld import parse_cache
    with parse_cache.disabled(parse=True, translation=False):
        before = record(env, task_ids, split, steps)
    after = record(env, task_ids, split, steps, actions=[t["actions"] for t in before])
    identical = all(b["obs"] == a["obs"] and b["admissible"] == a["admissible"] for b, a in zip(before, after))
    sb = [s for t in before for s in t["step_s"]]
    sa = [s for t in after for s in t["step_s"]]
    return {"games": len(task_ids), "steps": len(sb), "identical": identical,
            "median_ms_uncached": 1000 * statistics.median(sb), "median_ms_cached": 1000 * statistics.median(sa),
            "mean_ms_uncached": 1000 * statistics.mean(sb), "mean_ms_cached": 1000 * statistics.mean(sa),
            "speedup_median": statistics.median(sb) / statistics.median(sa)}


def reset_compare(env, task_id: str, split: str, repeats: int = 3) -> dict:
    """Seconds to reset a game played before: without, then with, the PDDL translation memo."""
    from agentq.envs.alfworld import parse_cache

    def timed():
        env.reset(options={"task_id": task_id, "split": split})
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            env.reset(options={"task_id": task_id, "split": split})
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    with parse_cache.disabled(parse=False, translation=True):
        before = timed()
    return {"reset_s_uncached": before, "reset_s_cached": timed()}


def _unpack(archive: str) -> str:
    tmp = tempfile.mkdtemp(prefix="alfworld-data-")
    with tarfile.open(archive) as tf:
        tf.extractall(tmp, filter="data") if sys.version_info >= (3, 12) else tf.extractall(tmp)
    return os.path.join(tmp, "alfworld")


def _table(res: dict) -> str:
    lines = [f"  {'task type':34s} {'won':>7s} {'success':>8s} {'mean steps (won)':>17s}"]
    for k, r in res["per_type"].items():
        lines.append(f"  {k:34s} {r['won']:3d}/{r['n']:<3d} {100 * r['success']:7.1f}% {r['mean_steps_won']:17.1f}")
    lines.append(f"  {'all':34s} {res['won']:3d}/{res['n']:<3d} {100 * res['success']:7.1f}%   ({res['seconds']} s)")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archive", help="unpack this json_2.1.1 archive into a temp folder and use it as ALFWORLD_DATA")
    p.add_argument("--data-dir", help="folder holding json_2.1.1 (default $ALFWORLD_DATA)")
    p.add_argument("--cache-dir", help="generated games and walkthroughs (default: a fresh temp folder)")
    p.add_argument("--real-split", default="valid_unseen")
    p.add_argument("--real-games", type=int, default=40)
    p.add_argument("--gen-per-type", type=int, default=2)
    p.add_argument("--speed-games", type=int, default=5)
    p.add_argument("--speed-steps", type=int, default=12)
    p.add_argument("--handcoded-gen-per-type", type=int, default=0,
                   help="also run the handcoded expert on this many gen_seen games per type (default: skip)")
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--skip", nargs="*", default=[], choices=["handcoded", "planner", "speed"])
    p.add_argument("--quick", action="store_true", help="small sample sizes (smoke run)")
    p.add_argument("--json", help="write the report here")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per episode")
    return p


def handcoded_section(a, data_dir: str | None, cache_dir: str, log) -> dict:
    """Section 1: the handcoded expert on a fixed sample of real games."""
    real = make_env(a.real_split, data_dir=data_dir, cache_dir=cache_dir, expert=True, max_steps=a.max_steps)
    ids = fixed_sample(real.unwrapped.list_tasks(), a.real_games)
    res = expert_eval(real, ids, a.real_split, log)
    real.close()
    print(f"handcoded expert, {a.real_split}, {res['n']} games (numpy seed 0), cap {a.max_steps} steps:\n{_table(res)}")
    return res


def planner_section(a, cache_dir: str, log) -> dict:
    """Section 2: planner walkthroughs on generated games of both generated splits."""
    genv = make_env("gen_seen", cache_dir=cache_dir, expert=True, max_steps=a.max_steps)
    u = genv.unwrapped
    out = {}
    for split in ("gen_seen", "gen_unseen"):
        ids = per_type_sample(u.list_tasks(split), a.gen_per_type, u.task_type)
        out[split] = res = expert_eval(genv, ids, split, log)
        print(f"planner walkthrough, {split}, {res['n']} games:\n{_table(res)}")
    genv.close()
    return out


def handcoded_gen_section(a, cache_dir: str, log) -> dict:
    """Section 2b (`--handcoded-gen-per-type N`): the handcoded expert on generated games."""
    genv = make_env("gen_seen", cache_dir=cache_dir, expert=True, expert_type="handcoded", max_steps=a.max_steps)
    u = genv.unwrapped
    ids = per_type_sample(u.list_tasks(), a.handcoded_gen_per_type, u.task_type)
    res = expert_eval(genv, ids, "gen_seen", log)
    print(f"handcoded expert, gen_seen, {res['n']} games, cap {a.max_steps} steps:\n{_table(res)}")
    genv.close()
    return res


def speed_section(a, data_dir: str | None, cache_dir: str) -> dict:
    """Section 3: step and reset time without and with the parse cache, real and generated games."""
    from agentq.envs.alfworld import generator as gen

    # no expert here: its per-step work would count as step time
    real = make_env(a.real_split, data_dir=data_dir, cache_dir=cache_dir, max_steps=a.max_steps)
    ids = fixed_sample(real.unwrapped.list_tasks(), a.speed_games, seed=1)
    res = speed_compare(real, ids, a.real_split, a.speed_steps)
    res.update(reset_compare(real, ids[0], a.real_split))
    gen_ids = per_type_sample(gen.list_gen_tasks("gen_seen", 1), 1, lambda t: t.split("/")[0])[:2]
    g = speed_compare(real, gen_ids, "gen_seen", a.speed_steps)
    res["generated"] = g
    res["identical"] = res["identical"] and g["identical"]
    print(f"step time, {res['games']} {a.real_split} games x {a.speed_steps} steps ({res['steps']} steps):"
          f" median {res['median_ms_uncached']:.1f} ms uncached -> {res['median_ms_cached']:.1f} ms with the parse"
          f" cache ({res['speedup_median']:.2f}x; mean {res['mean_ms_uncached']:.1f} -> {res['mean_ms_cached']:.1f});"
          f" generated games: {g['median_ms_uncached']:.1f} -> {g['median_ms_cached']:.1f} ms")
    print(f"outputs byte-identical (observations and admissible commands, real + generated): {res['identical']}")
    print(f"reset of a game played before: {res['reset_s_uncached']:.2f} s -> {res['reset_s_cached']:.2f} s "
          "with the translation memo")
    real.close()
    return res


def main(argv=None) -> dict:
    a = _parser().parse_args(argv)
    if a.quick:
        a.real_games, a.gen_per_type, a.speed_games = 6, 1, 2
    data_dir = _unpack(a.archive) if a.archive else a.data_dir
    cache_dir = a.cache_dir or tempfile.mkdtemp(prefix="alfworld-cache-")
    log = print if a.verbose else None
    report: dict = {"args": vars(a)}
    if "handcoded" not in a.skip:
        report["handcoded"] = handcoded_section(a, data_dir, cache_dir, log)
    if "planner" not in a.skip:
        report["planner"] = planner_section(a, cache_dir, log)
    if a.handcoded_gen_per_type:
        report["handcoded_gen"] = handcoded_gen_section(a, cache_dir, log)
    if "speed" not in a.skip:
        report["speed"] = speed_section(a, data_dir, cache_dir)
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
