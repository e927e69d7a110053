"""The embedded default run: `agentq pipeline`.

tiny model + tokenizer (built from the env's text) → SFT on a few expert demonstrations →
held-out evaluation → RL with the W8A8-KV8 rollout engine and the aligned learner → held-out
evaluation → summary.json and a PNG learning curve, with a table of them printed.

Everything is an ordinary config override away (`env=...`, `sft.num_demos=...`,
`trainer.steps=...`, `pipeline.eval_tasks=...`), so the same command is also the template for a
real warm-start + RL run on a local HF checkpoint (`model=hf model.path=...`).
"""
from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import IO

from omegaconf import DictConfig, OmegaConf

from agentq.config import ConfigError
from agentq.eval.episodes import recover_eval_pairs
from agentq.eval.metrics import outcomes_by_task, paired_comparison, paired_test_name, two_proportion_z
from agentq.utils.errors import says_where_on_stop
from agentq.utils.files import write_text_replacing
from agentq.utils.folder_lock import removed_if_left_empty
from agentq.utils.logging import console, jsonable

from .run_dir import PIPELINE_ARTIFACTS, claim_run_dir, last_step_checkpoint, new_run_dir, remove_run_artifacts


def evaluate_checkpoint(cfg: DictConfig, checkpoint: str, out: Path, num_tasks: int, split: str) -> dict:
    """`agentq eval` of one checkpoint on the first `num_tasks` tasks of `split`, written to `out`."""
    from agentq.eval.evaluate import evaluate

    c = cfg.copy()
    OmegaConf.update(c, "checkpoint", checkpoint, force_add=True)
    OmegaConf.update(c, "split", split, force_add=True)
    OmegaConf.update(c, "eval.num_tasks", num_tasks)
    OmegaConf.update(c, "eval.out_dir", str(out))
    return evaluate(c)


def _episode_outcomes(report: dict) -> dict[str, list[bool]]:
    """task id → the outcomes of every episode of an evaluation (its episodes.jsonl in `out_dir`): with
    eval.repeats > 1 a task has several, and the paired test uses them all. None recorded (a resumed
    run's evaluation whose episodes.jsonl is gone, as `rl.recorded_step` allows): no pairs."""
    from agentq.eval.episodes import read_trajectories

    path = Path(report["out_dir"]) / "episodes.jsonl"
    return outcomes_by_task((t.task_id, t.won) for t in read_trajectories(path)) if path.exists() else {}


def _comparison(before: dict, after: dict) -> dict:
    """SFT vs RL on one split: both success rates with their evaluations' intervals, the unpaired z, and the
    paired test over the tasks both evaluated (the same held-out tasks: the sharper test; exact McNemar
    with one episode per task, the sign-flip test over tasks with repeats: `metrics.paired_comparison`)."""
    n1, n2 = before["episodes"], after["episodes"]
    k1, k2 = round(before["success_rate"] * n1), round(after["success_rate"] * n2)
    return {
        "episodes": n2, "sft_success_rate": before["success_rate"], "rl_success_rate": after["success_rate"],
        # the evaluations' own intervals: they know which episodes repeat a task (metrics.success_interval)
        "sft_success_ci95": before["success_ci95"], "rl_success_ci95": after["success_ci95"],
        "success_gain": after["success_rate"] - before["success_rate"],
        "gain_z": two_proportion_z(k1, n1, k2, n2),
        "paired": paired_comparison(_episode_outcomes(before), _episode_outcomes(after)),
        "sft_score": before["score_mean"], "rl_score": after["score_mean"],
        "sft_turns_success": before["turns_success_mean"], "rl_turns_success": after["turns_success_mean"],
        "sft_cap_rate": before["cap_rate"], "rl_cap_rate": after["cap_rate"],
        "sft_inadmissible_rate": before["inadmissible_action_rate"],
        "rl_inadmissible_rate": after["inadmissible_action_rate"],
    }


def eval_splits(cfg: DictConfig) -> list[str]:
    """`pipeline.eval_splits` (null = [env.eval_split]), each checked against the env's splits.

    Raises:
        ConfigError: a split the env does not have (one line on the command line, not a traceback).
    """
    from agentq.envs import env_class

    splits = list(cfg.pipeline.eval_splits or [cfg.env.eval_split])
    # any env.name form (built-in, plugin, module:Class), not REGISTRY's names only: a plugin's env
    # was a KeyError here; load_config has checked that the name resolves
    env_cls = env_class(str(cfg.env.name))
    if env_cls is None:
        return splits       # a factory function's env: its splits are only known once built
    valid = list(env_cls.splits)
    bad = [s for s in splits if s not in valid]
    if bad:
        raise ConfigError(f"pipeline.eval_splits={splits}: {bad} not a split of {cfg.env.name}; valid: {valid} "
                          f"(conf/pipeline.yaml's [dev, test] are TextWorldExpress's; pipeline.eval_splits=null "
                          f"evaluates env.eval_split, {cfg.env.eval_split!r})")
    return splits


def pipeline(cfg: DictConfig, overrides: list[str] | None = None) -> dict:
    """`agentq pipeline` into pipeline.out_dir (default a new runs/pipeline-<env>-<time>), locked for this
    process and refused when it holds another run (`claim_pipeline_dir`); a start refused before anything
    was written there (a bad model.path or SFT setting) leaves no folder. A stop (Ctrl-C, a worker given
    up on) ends with where the pipeline stands (`pipeline_stopped_text`; `overrides`: its command line)."""
    from agentq.trainer.rl import check_rl_config
    from agentq.trainer.sft import check_expert

    from agentq import build

    split, *others = eval_splits(cfg)       # before the run folder: a bad split leaves no empty folder
    check_rl_config(cfg)                    # and a bad RL setting costs no SFT stage
    build.check_split_data(cfg, [str(cfg.env.train_split), split, *others])   # nor missing data (ALFWorld's)
    check_expert(cfg)                       # nor an env without an expert a tiny model's build
    out = Path(cfg.pipeline.out_dir or new_run_dir(f"pipeline-{cfg.env.name}"))
    with says_where_on_stop(lambda: pipeline_stopped_text(out, overrides or [])), removed_if_left_empty(out):
        lock = claim_pipeline_dir(out, overwrite=bool(cfg.trainer.get("overwrite", False)))
        try:
            return _pipeline(cfg, out, split, others)
        finally:
            lock.close()            # releases the folder


def pipeline_stopped_text(out: Path, overrides: list[str]) -> str:
    """Where a stopped `agentq pipeline` left its folder: the stage it stopped in and the command that
    starts it over there; stopped in RL after a checkpoint, also the `agentq train` resume that
    continues that stage alone ("" when the folder was removed as left empty).

    Args:
        out: pipeline.out_dir.
        overrides: the command line, repeated in the command that starts over.
    """
    if not out.is_dir():
        return ""
    keep = [o for o in overrides if not o.startswith(("pipeline.out_dir=", "trainer.overwrite="))]
    over = (f"start it over with {shlex.join(['agentq', 'pipeline', *keep])} "
            f"{shlex.quote(f'pipeline.out_dir={out}')} trainer.overwrite=true")
    rl = out / "rl"
    if (rl / "train_summary.json").exists():
        stage = "evaluation after RL"
    elif rl.is_dir():
        stage = "RL"
    else:
        stage = "evaluation after SFT" if (out / "sft" / "sft_summary.json").exists() else "SFT"
    last = last_step_checkpoint(rl) if stage == "RL" else None
    if last is None:
        return f"pipeline folder {out} stopped in its {stage} stage; {over}"
    return (f"pipeline folder {out} stopped in its RL stage, last checkpoint {last}; continue that stage alone with "
            f"agentq train {shlex.quote(f'trainer.resume={rl}')} (no summary.json then), or {over}")


def claim_pipeline_dir(out: Path, overwrite: bool) -> IO:
    """Lock `out` (pipeline.out_dir) for this process as `agentq train` locks its folder (`claim_run_dir`):
    one holding an `agentq train` or `agentq sft` run is refused whatever the settings (a pipeline's
    files beside it were a mix that `agentq report` rendered as the old run); one holding an earlier
    pipeline, unless trainer.overwrite=true (its stages replace sft/ and rl/ when they start, `_pipeline`
    the rest once SFT is done). Then the evaluations a kill cut short are put back (`recover_eval_pairs`):
    eval_sft_<split> and eval_rl_<split>, which only the pipeline writes, were broken for readers
    until it wrote them again; its stages' folders recover their own when claimed (rl/eval/step_*).

    Returns:
        the open lock file; the lock lasts until it is closed (or the process exits).
    Raises:
        RunDirError: the folder cannot be created, another process holds it, or it holds another run.
        Any error once the folder is locked releases it first.
    """
    lock = claim_run_dir(out, resume=False, overwrite=overwrite, kind="pipeline", out_key="pipeline.out_dir",
                         remove=False)
    try:
        recover_eval_pairs(sorted([*out.glob("eval_sft_*"), *out.glob("eval_rl_*")]))
    except BaseException:       # an OSError of the recovery, Ctrl-C: the folder is free again
        lock.close()
        raise
    return lock


def _pipeline(cfg: DictConfig, out: Path, split: str, others: list[str]) -> dict:
    from agentq import build
    from agentq.trainer.sft import sft

    t0 = time.time()
    p = cfg.pipeline
    n_eval = int(p.eval_tasks)
    cfg = cfg.copy()
    OmegaConf.update(cfg, "env.eval_split", split)     # the RL learning curve and final eval use it too

    console.rule(f"[bold]agentq pipeline: {cfg.env.name} — tiny model → SFT → RL ({cfg.algo.name}, "
                 f"rollout {cfg.rollout.quant}) → eval on {', '.join([split, *others])}")
    base = build.model_path(cfg)                                          # 1. tiny model + tokenizer
    s = sft(cfg, out_dir=out / "sft", init_path=base, out_key="pipeline.out_dir", rl_hint=False)  # 2. SFT (RL'd by 4.)
    # trainer.overwrite: the earlier pipeline's evaluations, summary and curve go now that SFT, which
    # replaced sft/, is done (a bad setting found before then costs none of them; a split not evaluated
    # again left its old eval_sft_<split> beside the new run's)
    remove_run_artifacts(out, tuple(a for a in PIPELINE_ARTIFACTS if a not in ("sft", "rl")))
    sft_evals = {sp: evaluate_checkpoint(cfg, s["checkpoint"], out / f"eval_sft_{sp}", n_eval, sp)   # 3. held-out evals
                 for sp in (split, *others)}

    summary_rl = _rl_stage(cfg, out, s["checkpoint"], n_eval)              # 4. RL from the SFT checkpoint
    # 5. the same evals after RL (trainer.eval_every=-1: the trainer made none, and the comparison needs it)
    final = summary_rl["final_eval"] or evaluate_checkpoint(cfg, summary_rl["checkpoint"], out / f"eval_rl_{split}",
                                                            n_eval, split)
    rl_evals = {split: final, **{sp: evaluate_checkpoint(cfg, summary_rl["checkpoint"], out / f"eval_rl_{sp}", n_eval, sp)
                                 for sp in others}}

    summary = {
        "env": cfg.env.name, "split": split, "algo": cfg.algo.name, "rollout_quant": cfg.rollout.quant,
        "rollout_backend": cfg.rollout.backend, **_comparison(sft_evals[split], rl_evals[split]),
        # further held-out splits, each evaluated after SFT and after RL on the same tasks
        "other_splits": {sp: _comparison(sft_evals[sp], rl_evals[sp]) for sp in others},
        "rl_steps": int(cfg.trainer.steps), "sft_demos": s["demos_used"],
        "checkpoints": {"sft": s["checkpoint"], "rl": summary_rl["checkpoint"]},
        "wall_time_s": time.time() - t0,
    }
    write_text_replacing(out / "summary.json", json.dumps(jsonable(summary), indent=2))
    from agentq.eval.plots import learning_curve

    learning_curve(out / "rl" / "metrics.jsonl", out / "learning_curve.png", sft_success=summary["sft_success_rate"],
                   title=f"{cfg.env.name}: SFT → RL ({cfg.algo.name}, {cfg.rollout.quant})", split=split,
                   sft_episodes=sft_evals[split]["episodes"])
    print_summary(summary, out)
    return summary


def _rl_stage(cfg: DictConfig, out: Path, sft_checkpoint: str, n_eval: int) -> dict:
    """The pipeline's RL stage: `agentq train` from `sft_checkpoint` in <out>/rl, ending on the final
    evaluation of `n_eval` tasks (pipeline.eval_tasks; the pipeline's evaluation after RL).

    Returns:
        The trainer's summary (train_summary.json).
    """
    from agentq.trainer.rl import RLTrainer

    rl_cfg = cfg.copy()
    OmegaConf.update(rl_cfg, "trainer.out_dir", str(out / "rl"))
    OmegaConf.update(rl_cfg, "trainer.resume", None)
    # a setting, so rl/config.yaml has it: `agentq train trainer.resume=<out>/rl` (`pipeline_stopped_text`)
    # ends on this evaluation too, not on trainer.eval_num_tasks tasks
    OmegaConf.update(rl_cfg, "trainer.final_eval_tasks", n_eval)
    # in <pipeline.out_dir>/rl: the pipeline refuses trainer.out_dir, so the folder's messages name pipeline.out_dir
    return RLTrainer(rl_cfg, init_path=sft_checkpoint, out_key="pipeline.out_dir").train()


def print_summary(s: dict, out: Path) -> None:
    for split, c in {s["split"]: s, **s["other_splits"]}.items():
        _print_comparison(f"agentq pipeline — {s['env']} / {split} ({c['episodes']} held-out episodes)", c)
    console.print(f"wall time {s['wall_time_s'] / 60:.1f} min; outputs in {out}/ (summary.json, learning_curve.png); "
                  f"HTML report: agentq report {out}")


def _print_comparison(title: str, c: dict) -> None:
    from rich.table import Table

    from agentq.eval.evaluate import rate_text, turns_text

    t = Table(title=title)
    for col in ("", "after SFT", "after RL"):
        t.add_column(col)
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    t.add_row("success", pct(c["sft_success_rate"]), pct(c["rl_success_rate"]))
    t.add_row("95 % CI", "–".join(pct(x) for x in c["sft_success_ci95"]), "–".join(pct(x) for x in c["rl_success_ci95"]))
    t.add_row("mean score (% of the maximum)", f"{100 * c['sft_score']:.1f}", f"{100 * c['rl_score']:.1f}")
    t.add_row("turns (won)", turns_text(c["sft_turns_success"]), turns_text(c["rl_turns_success"]))
    t.add_row("hit step cap", pct(c["sft_cap_rate"]), pct(c["rl_cap_rate"]))
    no_list = "no admissible list"
    t.add_row("inadmissible turns", rate_text(c["sft_inadmissible_rate"], no_list),
              rate_text(c["rl_inadmissible_rate"], no_list))
    console.print(t)
    pr = c["paired"]
    paired = (f"paired over {pr['pairs']} tasks, {paired_test_name(pr)}: better after RL on {pr['won_only_after']}, "
              f"after SFT on {pr['won_only_before']}, z = {pr['mcnemar_z']:.2f}, p = {pr['mcnemar_p']:.3g}"
              if pr["pairs"] else "no paired test: the two evaluations share no task")
    console.print(f"gain {100 * c['success_gain']:+.1f} points (unpaired z = {c['gain_z']:.2f}; {paired})")
