"""Gold paths, speed, memory and crash recovery of agentq/ScienceWorld-v0.

    python -m agentq.eval.bench_scienceworld                       # everything (~5 min on 2 cores)
    python -m agentq.eval.bench_scienceworld --sections gold       # gold paths only
    python -m agentq.eval.bench_scienceworld --json out.json --jvm-heap 768m --jvm-opts="-Xms64m"

Sections:
  gold    the simulator's gold action sequence, fed through our wrapper (expert=True, step cap
          1000), on the first variation of `--split` of every task: won / score / steps.
  speed   a fresh env (expert=False) replays those gold sequences twice; wall time of env.reset()
          and env.step() (second round, warm JIT), overall and per task; plus the cost of
          admissible_actions=True and include_objects=False (on 6 tasks x 20 steps).
  memory  a fresh process runs 8 envs (8 tasks, one shared JVM) interleaved step by step, each
          cycling through the recorded gold sequences; peak RSS of that process + its JVM.
  crash   kills the JVM with SIGKILL mid-episode: step() must raise EnvCrashedError, the next
          reset() must restart the JVM (timed) and the episode must be playable again.

Numbers are wall-clock on whatever else the machine runs: the 1-minute load average is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

import agentq.envs  # noqa: F401  (registers agentq/* ids)
from agentq.envs import EnvCrashedError
from agentq.envs.scienceworld import JVMHost, all_tasks
from agentq.eval.bench_common import write_json
from agentq.utils.errors import first_line

ENV_ID = "agentq/ScienceWorld-v0"
MEMORY_TASKS = ("10-2", "10-1", "9-3", "9-2", "5-2", "2-3", "1-1", "3-4")
JVM: dict = {"jvm_heap": "1g", "jvm_opts": []}     # env kwargs for the JVM, set from the command line


def load_avg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def rss_mb(pid: int | None = None, peak: bool = False) -> float:
    key = "VmHWM:" if peak else "VmRSS:"
    try:
        with open(f"/proc/{pid or 'self'}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import psutil
    p = psutil.Process(pid or os.getpid())
    return p.memory_info().rss / 2**20


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of this process plus process `pid` (the JVM)."""
    t = os.times()
    total = t.user + t.system
    if pid:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def stats_ms(xs: list[float]) -> dict:
    return {"n": len(xs), "median_ms": round(1e3 * statistics.median(xs), 2) if xs else None,
            "mean_ms": round(1e3 * statistics.mean(xs), 2) if xs else None,
            "p90_ms": round(1e3 * pct(xs, 0.9), 2) if xs else None,
            "max_ms": round(1e3 * max(xs), 2) if xs else None}


def first_task_ids(split: str, heap: str) -> dict[str, str]:
    env = gym.make(ENV_ID, split=split, **JVM).unwrapped
    try:
        ids = env.list_tasks(split)
    finally:
        env.close()
    out = {}
    for t in all_tasks():
        out[t.num] = next(i for i in ids if i.split("/")[0] == t.name)
    return out


# ---------------------------------------------------------------------- gold
def run_gold(split: str, heap: str) -> dict:
    ids = first_task_ids(split, heap)
    env = gym.make(ENV_ID, split=split, expert=True, max_steps=1000, **JVM).unwrapped
    rows, gold = [], {}
    print(f"\n== gold paths through the wrapper: first {split} variation of each task (load avg {load_avg()})")
    print(f"{'task':5} {'task id':52} {'gold':>4} {'steps':>5} {'score':>5} {'won':>5} {'reset+gold s':>12}")
    try:
        for num, tid in ids.items():
            t0 = time.perf_counter()
            obs, info = env.reset(options={"task_id": tid})
            reset_s = time.perf_counter() - t0
            seq = list(env._gold)
            rewards = 0.0
            term = trunc = False
            while info.get("expert_action") is not None and not (term or trunc):
                obs, r, term, trunc, info = env.step(info["expert_action"])
                rewards += r
            row = {"task": num, "task_id": tid, "gold_len": len(seq), "steps": env.num_steps,
                   "score": info["score"], "won": bool(info["won"]), "terminated": term,
                   "reward_sum": round(rewards, 4), "reset_s": round(reset_s, 2)}
            rows.append(row)
            gold[tid] = seq
            print(f"{num:5} {tid:52} {len(seq):4d} {env.num_steps:5d} {info['score']:5.2f} {str(row['won']):>5} "
                  f"{reset_s:12.2f}", flush=True)
    finally:
        env.close()
    won = sum(r["won"] for r in rows)
    print(f"gold paths won: {won}/{len(rows)}")
    return {"split": split, "won": won, "total": len(rows), "rows": rows, "gold": gold}


# ---------------------------------------------------------------------- speed
def replay(env, gold: dict[str, list[str]]) -> tuple[list[float], list[float], dict, int]:
    resets, steps, per_task, wins = [], [], {}, 0
    for tid, seq in gold.items():
        t0 = time.perf_counter()
        _, info = env.reset(options={"task_id": tid})
        resets.append(time.perf_counter() - t0)
        mine = []
        for a in seq:
            t0 = time.perf_counter()
            _, _, term, trunc, info = env.step(a)
            mine.append(time.perf_counter() - t0)
            if term or trunc:
                break
        wins += bool(info["won"])
        steps += mine
        per_task[tid.split("/")[0]] = round(1e3 * statistics.median(mine), 2) if mine else None
    return resets, steps, per_task, wins


def run_speed(gold: dict[str, list[str]], split: str, heap: str) -> dict:
    print(f"\n== speed: replaying the gold sequences with expert=False (load avg {load_avg()})")
    env = gym.make(ENV_ID, split=split, max_steps=1000, **JVM).unwrapped
    out: dict = {}
    try:
        env.reset(options={"task_id": next(iter(gold))})    # JVM up before timing
        cold_resets, cold_steps, _, _ = replay(env, gold)
        c0, w0 = cpu_s(env.jvm.pid), time.perf_counter()
        resets, steps, per_task, wins = replay(env, gold)
        cpu, wall = cpu_s(env.jvm.pid) - c0, time.perf_counter() - w0
        out["cold"] = {"reset": stats_ms(cold_resets), "step": stats_ms(cold_steps)}
        out["warm"] = {"reset": stats_ms(resets), "step": stats_ms(steps), "won": wins, "episodes": len(gold)}
        out["per_task_median_step_ms"] = per_task
        # resets alone, 3 per task: wall median and CPU (python + JVM) per reset
        walls, c0 = [], cpu_s(env.jvm.pid)
        for _ in range(3):
            for tid in gold:
                t0 = time.perf_counter()
                env.reset(options={"task_id": tid})
                walls.append(time.perf_counter() - t0)
        out["reset_loop"] = stats_ms(walls)
        out["reset_loop"]["cpu_ms_per_reset"] = round(1e3 * (cpu_s(env.jvm.pid) - c0) / len(walls), 2)
        # CPU time (python + JVM) per env call: what a step costs without other processes' load
        out["warm"]["cpu_ms_per_call"] = round(1e3 * cpu / (len(steps) + len(resets)), 2)
        out["warm"]["wall_ms_per_call"] = round(1e3 * wall / (len(steps) + len(resets)), 2)
        print(f"round 1 (cold JIT): reset {out['cold']['reset']}  step {out['cold']['step']}")
        print(f"round 2 (warm):     reset {out['warm']['reset']}")
        print(f"                    step  {out['warm']['step']}  (won {wins}/{len(gold)} replays)")
        print(f"                    CPU (python + JVM) {out['warm']['cpu_ms_per_call']} ms per reset/step call, "
              f"wall {out['warm']['wall_ms_per_call']} ms")
        print("median step per task (ms): " + ", ".join(f"{k} {v}" for k, v in per_task.items()))
        print(f"reset loop (3 x 30 tasks): {out['reset_loop']}")
    finally:
        env.close()

    # Options, on the same subset (6 tasks, first 20 gold steps each): default, objects off,
    # admissible actions on.
    names = ("boil", "use-thermometer", "test-conductivity", "find-animal", "chemistry-mix",
             "inclined-plane-determine-angle")
    some = {t: seq for t, seq in gold.items() if t.split("/")[0] in names}
    out["options"] = {}
    for label, kw in (("default", {}), ("include_objects=False", {"include_objects": False}),
                      ("admissible_actions=True", {"admissible_actions": True})):
        env = gym.make(ENV_ID, split=split, max_steps=20, **JVM, **kw).unwrapped
        try:
            replay(env, some)
            _, st, _, _ = replay(env, some)
        finally:
            env.close()
        out["options"][label] = stats_ms(st)
        print(f"{label:24} step {out['options'][label]}")
    return out


# ---------------------------------------------------------------------- memory
def memory_worker(gold_file: str, heap: str, n_envs: int, episodes_per_env: int) -> dict:
    gold = json.load(open(gold_file))
    by_num = {t.num: t.name for t in all_tasks()}
    order = [tid for num in MEMORY_TASKS for tid in gold if tid.split("/")[0] == by_num[num]]
    order += [tid for tid in gold if tid not in order]
    envs = [gym.make(ENV_ID, split="test", max_steps=1000, **JVM).unwrapped for _ in range(n_envs)]
    queue = {i: [order[(i + k * n_envs) % len(order)] for k in range(episodes_per_env)] for i in range(n_envs)}
    cur = {}

    def start(i):
        tid = queue[i].pop(0)
        envs[i].reset(options={"task_id": tid})
        cur[i] = [tid, list(gold[tid])]

    for i in range(n_envs):
        start(i)
    host = envs[0].jvm
    assert all(e.jvm is host for e in envs), "envs of one process must share one JVM"
    peak_total, peak_py, peak_jvm, steps, episodes, wins = 0.0, 0.0, 0.0, 0, 0, 0
    t0 = time.perf_counter()
    while cur:
        for i in list(cur):
            tid, seq = cur[i]
            _, _, term, trunc, info = envs[i].step(seq.pop(0))
            steps += 1
            if term or trunc or not seq:
                episodes += 1
                wins += bool(info["won"])
                if queue[i]:
                    start(i)
                else:
                    del cur[i]
        if steps % 5 == 0 or not cur:
            py, jvm = rss_mb(), rss_mb(host.pid)
            peak_py, peak_jvm, peak_total = max(peak_py, py), max(peak_jvm, jvm), max(peak_total, py + jvm)
    wall = time.perf_counter() - t0
    res = {"envs": n_envs, "jvm_heap": heap, "jvm_pid": host.pid, "episodes": episodes, "won": wins, "steps": steps,
           "wall_s": round(wall, 1), "step_mean_ms": round(1e3 * wall / max(steps, 1), 2),
           "peak_total_rss_mb": round(peak_total), "peak_python_rss_mb": round(peak_py),
           "peak_jvm_rss_mb": round(peak_jvm),
           "hwm_python_mb": round(rss_mb(peak=True)), "hwm_jvm_mb": round(rss_mb(host.pid, peak=True)),
           "final_total_rss_mb": round(rss_mb() + rss_mb(host.pid))}
    for e in envs:
        e.close()
    return res


def run_memory(gold: dict, heap: str, n_envs: int, episodes_per_env: int) -> dict:
    print(f"\n== memory: {n_envs} envs in one process (one JVM, -Xmx{heap}), {episodes_per_env} gold episodes each,"
          f" interleaved (load avg {load_avg()})")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(gold, f)
    try:
        cmd = [sys.executable, "-m", "agentq.eval.bench_scienceworld", "--memory-worker", f.name,
               "--jvm-heap", heap, "--jvm-opts=" + " ".join(JVM["jvm_opts"]),
               "--envs", str(n_envs), "--episodes-per-env", str(episodes_per_env)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"memory worker failed:\n{p.stdout}\n{p.stderr}")
        res = json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)
    print(f"peak RSS: python {res['peak_python_rss_mb']} MB + JVM {res['peak_jvm_rss_mb']} MB = "
          f"{res['peak_total_rss_mb']} MB total (high-water marks: python {res['hwm_python_mb']} MB, "
          f"JVM {res['hwm_jvm_mb']} MB); {res['episodes']} episodes ({res['won']} won), {res['steps']} steps, "
          f"{res['step_mean_ms']} ms/step mean")
    return res


# ---------------------------------------------------------------------- crash
def run_crash(gold: dict, split: str, heap: str) -> dict:
    print(f"\n== crash: SIGKILL the JVM mid-episode (load avg {load_avg()})")
    tid, seq = next((t, s) for t, s in gold.items() if len(s) > 5)
    env = gym.make(ENV_ID, split=split, max_steps=1000, **JVM).unwrapped
    out = {"task_id": tid}
    try:
        env.reset(options={"task_id": tid})
        env.step(seq[0])
        old_pid, old_gen = env.jvm.pid, env.jvm.generation
        os.kill(old_pid, signal.SIGKILL)
        time.sleep(0.2)
        try:
            env.step(seq[1])
            out["raised"] = False
        except EnvCrashedError as e:
            out["raised"] = True
            out["error"] = first_line(e)
        t0 = time.perf_counter()
        _, info = env.reset(options={"task_id": tid})
        out["restart_reset_s"] = round(time.perf_counter() - t0, 2)
        out["new_pid"], out["generation"] = env.jvm.pid, env.jvm.generation
        for a in seq:
            _, _, term, trunc, info = env.step(a)
            if term or trunc:
                break
        out["won_after_restart"] = bool(info["won"])
        out["old_pid_gone"] = old_pid != env.jvm.pid and old_gen < env.jvm.generation
    finally:
        env.close()
    print(f"step after kill raised EnvCrashedError: {out['raised']} ({out.get('error', '')})")
    print(f"reset restarted the JVM in {out['restart_reset_s']} s (pid {old_pid} -> {out['new_pid']}); "
          f"episode won after restart: {out['won_after_restart']}")
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="gold,speed,memory,crash")
    ap.add_argument("--split", default="test", choices=["train", "dev", "test"])
    ap.add_argument("--jvm-heap", default="1g")
    ap.add_argument("--jvm-opts", default="", help='extra JVM options, space separated: --jvm-opts="-Xms64m -Xss512k"')
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--episodes-per-env", type=int, default=4)
    ap.add_argument("--gold-file", help="reuse/save the recorded gold sequences (JSON)")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--memory-worker", help=argparse.SUPPRESS)
    return ap


def gold_sequences(a, sections: list[str], results: dict) -> dict[str, list[str]]:
    """The gold action sequences: recorded now (section `gold`, or when none are saved) or read
    from `--gold-file`; a recording's outcome goes into `results["gold"]`."""
    if a.gold_file and os.path.exists(a.gold_file) and "gold" not in sections:
        return json.loads(Path(a.gold_file).read_text())
    g = run_gold(a.split, a.jvm_heap)
    results["gold"] = {k: v for k, v in g.items() if k != "gold"}
    if a.gold_file:
        Path(a.gold_file).write_text(json.dumps(g["gold"]))
    return g["gold"]


def print_summary(results: dict, split: str) -> None:
    print("\n== summary")
    if "gold" in results:
        print(f"gold paths won: {results['gold']['won']}/{results['gold']['total']} (first {split} variation per task)")
    if "speed" in results:
        w = results["speed"]["warm"]
        print(f"median step {w['step']['median_ms']} ms (mean {w['step']['mean_ms']}, p90 {w['step']['p90_ms']}); "
              f"median reset {w['reset']['median_ms']} ms (p90 {w['reset']['p90_ms']}, max {w['reset']['max_ms']}); "
              f"CPU {w['cpu_ms_per_call']} ms per call (wall {w['wall_ms_per_call']})")
        r = results["speed"]["reset_loop"]
        print(f"reset loop: median {r['median_ms']} ms (p90 {r['p90_ms']}), CPU {r['cpu_ms_per_reset']} ms per reset")
    if "memory" in results:
        m = results["memory"]
        print(f"{m['envs']} concurrent envs: peak RSS {m['peak_total_rss_mb']} MB total "
              f"(python {m['peak_python_rss_mb']} + JVM {m['peak_jvm_rss_mb']})")
    if "crash" in results:
        c = results["crash"]
        print(f"crash: EnvCrashedError raised {c['raised']}, restart+reset {c['restart_reset_s']} s, "
              f"won after restart {c['won_after_restart']}")
    print(f"load average: start {results['load_avg_start']}, end {results['load_avg_end']}; {results['cpus']} CPUs; "
          f"wall {results['wall_s']} s")


def main(argv=None):
    ap = _parser()
    a = ap.parse_args(argv)
    JVM.update(jvm_heap=a.jvm_heap, jvm_opts=a.jvm_opts.split())
    if a.memory_worker:
        print(json.dumps(memory_worker(a.memory_worker, a.jvm_heap, a.envs, a.episodes_per_env)))
        return 0
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = set(sections) - {"gold", "speed", "memory", "crash"}
    if bad:
        ap.error(f"unknown sections {sorted(bad)}; valid: gold, speed, memory, crash")
    results: dict = {"load_avg_start": load_avg(), "cpus": os.cpu_count(), "jvm_heap": a.jvm_heap,
                     "jvm_opts": JVM["jvm_opts"]}
    t0 = time.perf_counter()
    host = JVMHost.get(a.jvm_heap, tuple(JVM["jvm_opts"]))
    results["jvm_start_s"] = round(host.start_time_s, 2)
    results["jvm_command"] = " ".join(host.command())
    host.shutdown()
    print(f"JVM start: {results['jvm_start_s']} s  ({results['jvm_command']})")
    gold = gold_sequences(a, sections, results)
    if "speed" in sections:
        results["speed"] = run_speed(gold, a.split, a.jvm_heap)
    if "memory" in sections:
        results["memory"] = run_memory(gold, a.jvm_heap, a.envs, a.episodes_per_env)
    if "crash" in sections:
        results["crash"] = run_crash(gold, a.split, a.jvm_heap)
    results["load_avg_end"] = load_avg()
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    print_summary(results, a.split)
    write_json(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
