"""Round 51: `CUDA_LAUNCH` rows from a `bench_kernels --attn-cuda` sweep (bench.json), and the engine
benchmark run under given rows.

    python launch_rows.py pick OUT/bench.json HQ:HKV        # prints the rows as JSON
    LAUNCH_ROWS='[[128,2,3],...]' python launch_rows.py engine ARGS...   # bench_engine under those rows
"""
import json
import re
import runpy
import sys

BATCH_ROW = {16: 128, 32: 256, 64: 512, 128: 1024, 256: None}      # B at 8 KV heads -> the row's most blocks


def pick(path, heads):
    hq, hkv = map(int, heads.split(":"))
    rows = []
    for case in json.load(open(path))["attention_cuda"]:
        if (case["Hq"], case["Hkv"]) != (hq, hkv) or case["L"] != 2304 or case["B"] not in BATCH_ROW:
            continue
        timed = {n: r["us"] for n, r in case.items() if isinstance(r, dict) and n.startswith("cuda w")}
        best = min((us, n) for n, us in timed.items() if "spauto" in n)       # the table cannot fix splits
        w, st = re.match(r"cuda w(\d) spauto st(\d)", best[1]).groups()
        rows.append((BATCH_ROW[case["B"]] if BATCH_ROW[case["B"]] is not None else 1 << 30, int(w), int(st),
                     case["B"], best[0], case["cuda default"]["us"]))
    rows.sort()
    for most, w, st, b, us, default in rows:
        print(f"# B {b}: w{w} st{st} {us:.1f} µs (default {default:.1f})", file=sys.stderr)
    print(json.dumps([[None if most == 1 << 30 else most, w, st] for most, w, st, *_ in rows]))


def engine(argv):
    import os

    from agentq.kernels import triton_attention as ta
    rows = tuple(tuple(r) for r in json.loads(os.environ["LAUNCH_ROWS"]))
    ta.CUDA_LAUNCH = (("", rows),)
    print(f"CUDA_LAUNCH rows (most blocks, warps, stages): {rows}", flush=True)
    sys.argv = ["bench_engine", *argv]
    runpy.run_module("agentq.eval.bench_engine", run_name="__main__")


if __name__ == "__main__":
    if sys.argv[1] == "pick":
        pick(sys.argv[2], sys.argv[3])
    else:
        engine(sys.argv[2:])
