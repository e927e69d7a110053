"""The embedded default run: `agentq pipeline`.

tiny model + tokenizer (built from the env's text) → SFT on a few expert demonstrations →
held-out evaluation → RL with the W8A8-KV8 rollout engine and the aligned learner → held-out
evaluation → summary.json, a PNG learning curve, and a table.

Everything is an ordinary config override away (`env=...`, `sft.num_demos=...`,
`trainer.steps=...`, `pipeline.eval_tasks=...`), so the same command is also the template for a
real warm-start + RL run on a local HF checkpoint (`model=hf model.path=...`).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from agentq.eval.metrics import paired_comparison, two_proportion_z, wilson_interval
from agentq.utils.logging import console, jsonable


def _eval(cfg: DictConfig, checkpoint: str, out: Path, num_tasks: int) -> dict:
    from agentq.eval.evaluate import evaluate

    c = cfg.copy()
    OmegaConf.update(c, "checkpoint", checkpoint, force_add=True)
    OmegaConf.update(c, "eval.num_tasks", num_tasks)
    OmegaConf.update(c, "eval.out_dir", str(out))
    return evaluate(c)


def _won_by_task(report: dict) -> dict[str, bool]:
    with open(Path(report["out_dir"]) / "episodes.jsonl") as f:
        return {e["task_id"]: bool(e["won"]) for e in map(json.loads, f)}


def pipeline(cfg: DictConfig) -> dict:
    from agentq.trainer import setup
    from agentq.trainer.rl import RLTrainer
    from agentq.trainer.sft import sft

    t0 = time.time()
    p = cfg.pipeline
    out = Path(p.out_dir or Path("runs") / f"pipeline-{cfg.env.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    n_eval = int(p.eval_tasks)
    split = cfg.env.eval_split

    console.rule(f"[bold]agentq pipeline: {cfg.env.name} — tiny model → SFT → RL ({cfg.algo.name}, "
                 f"rollout {cfg.rollout.quant}) → eval on {split}")
    base = setup.model_path(cfg)                                          # 1. tiny model + tokenizer
    s = sft(cfg, out_dir=out / "sft", init_path=base)                     # 2. SFT on expert demos
    sft_eval = _eval(cfg, s["checkpoint"], out / "eval_sft", n_eval)      # 3. held-out eval after SFT

    rl_cfg = cfg.copy()                                                   # 4. RL from the SFT checkpoint
    OmegaConf.update(rl_cfg, "trainer.out_dir", str(out / "rl"))
    OmegaConf.update(rl_cfg, "trainer.resume", None)
    summary_rl = RLTrainer(rl_cfg, init_path=s["checkpoint"]).train(final_eval_tasks=n_eval)
    rl_eval = summary_rl["final_eval"]

    n1, n2 = sft_eval["episodes"], rl_eval["episodes"]
    k1, k2 = round(sft_eval["success_rate"] * n1), round(rl_eval["success_rate"] * n2)
    summary = {
        "env": cfg.env.name, "split": split, "episodes": n2, "algo": cfg.algo.name, "rollout_quant": cfg.rollout.quant,
        "sft_success_rate": sft_eval["success_rate"], "rl_success_rate": rl_eval["success_rate"],
        "sft_success_ci95": list(wilson_interval(k1, n1)), "rl_success_ci95": list(wilson_interval(k2, n2)),
        "success_gain": rl_eval["success_rate"] - sft_eval["success_rate"],
        "gain_z": two_proportion_z(k1, n1, k2, n2),
        # the same held-out tasks before and after RL: the paired test is the sharper one
        "paired": paired_comparison(_won_by_task(sft_eval), _won_by_task(rl_eval)),
        "sft_score": sft_eval["score_mean"], "rl_score": rl_eval["score_mean"],
        "sft_turns_success": sft_eval["turns_success_mean"], "rl_turns_success": rl_eval["turns_success_mean"],
        "sft_cap_rate": sft_eval["cap_rate"], "rl_cap_rate": rl_eval["cap_rate"],
        "sft_inadmissible_rate": sft_eval["inadmissible_action_rate"],
        "rl_inadmissible_rate": rl_eval["inadmissible_action_rate"],
        "rl_steps": int(cfg.trainer.steps), "sft_demos": s["demos_used"],
        "checkpoints": {"sft": s["checkpoint"], "rl": summary_rl["checkpoint"]},
        "wall_time_s": time.time() - t0,
    }
    (out / "summary.json").write_text(json.dumps(jsonable(summary), indent=2))
    from agentq.eval.plots import learning_curve

    learning_curve(out / "rl" / "metrics.jsonl", out / "learning_curve.png", sft_success=summary["sft_success_rate"],
                   title=f"{cfg.env.name}: SFT → RL ({cfg.algo.name}, {cfg.rollout.quant})")
    print_summary(summary, out)
    return summary


def print_summary(s: dict, out: Path) -> None:
    from rich.table import Table

    t = Table(title=f"agentq pipeline — {s['env']} / {s['split']} ({s['episodes']} held-out episodes)")
    for c in ("", "after SFT", "after RL"):
        t.add_column(c)
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    t.add_row("success", pct(s["sft_success_rate"]), pct(s["rl_success_rate"]))
    t.add_row("95 % CI", "–".join(pct(x) for x in s["sft_success_ci95"]), "–".join(pct(x) for x in s["rl_success_ci95"]))
    t.add_row("mean score", f"{100 * s['sft_score']:.1f}", f"{100 * s['rl_score']:.1f}")
    t.add_row("turns (won)", f"{s['sft_turns_success']:.2f}", f"{s['rl_turns_success']:.2f}")
    t.add_row("hit step cap", pct(s["sft_cap_rate"]), pct(s["rl_cap_rate"]))
    t.add_row("inadmissible turns", pct(s["sft_inadmissible_rate"]), pct(s["rl_inadmissible_rate"]))
    console.print(t)
    pr = s["paired"]
    console.print(f"gain {100 * s['success_gain']:+.1f} points (unpaired z = {s['gain_z']:.2f}; paired over "
                  f"{pr['pairs']} tasks: won only after RL {pr['won_only_after']}, only after SFT "
                  f"{pr['won_only_before']}, McNemar z = {pr['mcnemar_z']:.2f}, p = {pr['mcnemar_p']:.3g}); wall time "
                  f"{s['wall_time_s'] / 60:.1f} min; outputs in {out}/ (summary.json, learning_curve.png)")
