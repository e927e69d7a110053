"""CPU benchmark of the default run (`agentq pipeline`'s sizes): one RL step and a held-out eval,
with the CPU int8 GEMM dispatch off (`torch._int_mm`, what torch does) and on (the path
`cpu_int_gemm=auto` picks on this CPU), and without quantization (`algo=bf16`: full-precision
rollouts and learner, fp32 on a CPU), side by side in one process, printing the CPU capability,
the chosen path, a table and a JSON file. The last arm says what quantization costs on this CPU.

    python -m agentq.eval.bench_cpu                          # this CPU as it is
    python -m agentq.eval.bench_cpu --emulate-no-vnni        # as on an AVX2-only CPU (see below)
    python -m agentq.eval.bench_cpu --eval-episodes 50 --profile runs/bench_cpu/profile.txt

Both arms start from the same SFT checkpoint (built once with the pipeline's SFT settings and kept
in --work), the same seed and the same tasks; since every GEMM path gives `_int_mm`'s bits, both
arms play the same episodes and take the same update — the benchmark checks that (identical
reward, loss and eval successes) and reports only time.

--emulate-no-vnni: torch runs `_int_mm` through oneDNN only with oneDNN enabled and a CPU with
AVX-512 VNNI (cpuinfo), else through a scalar fallback loop. Disabling oneDNN
(`torch.backends.mkldnn.enabled = False`) sends a VNNI machine down that same fallback, which is
what an AVX2-only CPU runs (the environment variables ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA do
not: torch's check reads cpuid). fp32/fp64 matmuls go through MKL either way.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


UNQUANTIZED = "unquantized (algo=bf16)"
TIMES = ("step_time_s", "rollout_time_s", "train_time_s", "eval_time_s")
#: (M, K, N) first measured slow on an AVX2-only Zen 3: decode batch, learner micro-batch, long prefill
GEMM_SHAPES = [(32, 256, 768), (256, 256, 768), (1024, 256, 512)]


def gemm_ms(shapes=GEMM_SHAPES, reps: int = 5) -> list[dict]:
    """Milliseconds per int8 GEMM on each CPU path, single-threaded, best of `reps`."""
    from agentq.kernels import cpu_gemm

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    rows = []
    try:
        for m, k, n in shapes:
            x_q = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
            w_q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
            rows.append({"shape": [m, k, n], **{p: 1e3 * cpu_gemm._time_path(p, x_q, w_q, reps) for p in cpu_gemm.PATHS}})
    finally:
        torch.set_num_threads(before)
    return rows


def build_sft(cfg, work: Path) -> str:
    """The pipeline's SFT checkpoint for this config (built once, reused from --work)."""
    from agentq import build
    from agentq.trainer.sft import sft

    ckpt = work / "sft" / "checkpoint"
    if not (ckpt / "config.json").exists():
        sft(cfg, out_dir=work / "sft", init_path=build.model_path(cfg))
    return str(ckpt)


def rl_arm(cfg, path: str, sft_ckpt: str, out: Path, eval_episodes: int, profile: Path | None) -> dict:
    """A fresh RL trainer from the SFT checkpoint on CPU GEMM `path`: one RL step, then an eval of
    `eval_episodes` tasks."""
    from omegaconf import OmegaConf

    from agentq.trainer.rl import RLTrainer

    c = cfg.copy()
    OmegaConf.update(c, "trainer.out_dir", str(out))
    OmegaConf.update(c, "trainer.overwrite", True)          # the arm's folder is this benchmark's scratch
    OmegaConf.update(c, "cpu_int_gemm", path)
    trainer = RLTrainer(c, init_path=sft_ckpt)
    try:
        if profile is not None:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                m = trainer.step(1)
            profile.parent.mkdir(parents=True, exist_ok=True)
            profile.write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        else:
            m = trainer.step(1)
        t0 = time.perf_counter()
        report = trainer.evaluate(1, eval_episodes) if eval_episodes else {}
        t_eval = time.perf_counter() - t0
    finally:
        trainer.close()
    return {"step_time_s": m["step_time_s"], "rollout_time_s": m["rollout_time_s"], "train_time_s": m["train_time_s"],
            "sync_time_s": m["sync_time_s"], "eval_time_s": t_eval, "eval_episodes": report.get("episodes", 0),
            "check": {"reward_mean": m["reward_mean"], "loss": m.get("loss"), "action_tokens": m["action_tokens"],
                      "eval_success_rate": report.get("success_rate")}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emulate-no-vnni", action="store_true", help="disable oneDNN: _int_mm as on an AVX2-only CPU")
    ap.add_argument("--eval-episodes", type=int, default=200, help="held-out episodes per arm (0: none)")
    ap.add_argument("--work", default="runs/bench_cpu", help="SFT checkpoint cache and outputs")
    ap.add_argument("--profile", default=None, help="write a torch profiler table of the 'on' arm's RL step here")
    ap.add_argument("--arms", default="off,on,bf16",
                    help="which arms to run: off (int_mm), on (the chosen path), bf16 (algo=bf16: no quantization)")
    ap.add_argument("overrides", nargs="*", help="pipeline config overrides (key=value)")
    a = ap.parse_args(argv)
    if a.emulate_no_vnni:
        torch.backends.mkldnn.enabled = False

    from agentq.config import load_config
    from agentq.kernels import cpu_gemm
    from agentq import build

    work = Path(a.work) / ("no_vnni" if a.emulate_no_vnni else "native")
    gemm = gemm_ms()
    cfg = load_config(["device=cpu", *a.overrides], config_name="pipeline")
    sft_ckpt = build_sft(cfg, Path(a.work))
    build.device_and_dtype(cfg)                              # the run's thread count; probes the GEMM paths
    info = cpu_gemm.describe()
    chosen = info["path"]
    arms = {label: path for label, path in (("off (int_mm)", "int_mm"), (f"on ({chosen})", chosen))
            if label.split()[0] in a.arms.split(",")}
    results = {}
    for label, path in arms.items():
        prof = Path(a.profile) if a.profile and path == chosen else None
        results[label] = {"path": path, **rl_arm(cfg, path, sft_ckpt, work / path, a.eval_episodes, prof)}
    if "bf16" in a.arms.split(","):
        full = load_config(["device=cpu", "algo=bf16", *a.overrides], config_name="pipeline")
        results[UNQUANTIZED] = {"path": None, **rl_arm(full, chosen, sft_ckpt, work / "bf16", a.eval_episodes, None)}
    off, on, bf16 = results.get("off (int_mm)"), results.get(f"on ({chosen})"), results.get(UNQUANTIZED)
    ratios = {k: off[k] / max(on[k], 1e-9) for k in TIMES if off and on and on[k] > 0}
    cost = {k: on[k] / max(bf16[k], 1e-9) for k in TIMES if on and bf16 and bf16[k] > 0}
    out = {"cpu_capability": info["cpu_capability"], "onednn_int8": info["onednn_int8"],
           "emulated_no_vnni": a.emulate_no_vnni, "chosen_path": chosen, "probe_ms": info.get("probe_ms"),
           "torch_threads": torch.get_num_threads(), "gemm_ms_1_thread": gemm, "arms": results, "speedup_off_over_on": ratios,
           "quantized_over_unquantized": cost,
           "same_bits": off["check"] == on["check"] if off and on else None}
    work.mkdir(parents=True, exist_ok=True)
    (work / "bench_cpu.json").write_text(json.dumps(out, indent=2))
    print_table(out)
    print(f"JSON: {work / 'bench_cpu.json'}")
    return out


def print_table(r: dict) -> None:
    from agentq.utils.logging import make_console
    from rich.table import Table

    probe = ", ".join(f"{p} {ms:.2f} ms" for p, ms in (r["probe_ms"] or {}).items())
    t = Table(title=f"agentq CPU benchmark — torch CPU capability {r['cpu_capability']}, oneDNN int8 "
                    f"{'yes' if r['onednn_int8'] else 'no'}{' (emulated AVX2-only)' if r['emulated_no_vnni'] else ''}; "
                    f"chosen path {r['chosen_path']} (probe: {probe})")
    arms = list(r["arms"].values())
    t.add_column("")
    for label in r["arms"]:
        t.add_column(label if label == UNQUANTIZED else f"dispatch {label}")
    t.add_column("off / on")
    cost = r.get("quantized_over_unquantized") or {}
    if cost:
        t.add_column("on / unquantized")
    for k, name in zip(TIMES, ("RL step (s)", "  rollout (s)", "  learner (s)",
                               f"eval, {arms[0]['eval_episodes']} episodes (s)")):
        ratio = r["speedup_off_over_on"].get(k)
        cells = [f"{x[k]:.1f}" for x in arms] + [f"{ratio:.2f}×" if ratio else "–"]
        t.add_row(name, *cells, *([f"{cost[k]:.2f}×" if k in cost else "–"] if cost else []))
    out = make_console(stderr=False)
    out.print(t)
    g = Table(title="int8 GEMM, ms, 1 thread (best of 5)")
    for col in ("(M, K, N)", *(p for p in r["gemm_ms_1_thread"][0] if p != "shape"), "int_mm / fp32"):
        g.add_column(col)
    for row in r["gemm_ms_1_thread"]:
        g.add_row(str(tuple(row["shape"])), *(f"{row[p]:.2f}" for p in row if p != "shape"),
                  f"{row['int_mm'] / row['fp32']:.1f}×")
    out.print(g)
    print(f"same episodes and update on both arms: {r['same_bits']} ({arms[0]['check']})")


if __name__ == "__main__":
    main()
