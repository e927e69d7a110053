"""Evaluating a policy on a held-out split: `agentq eval checkpoint=<dir> env=<env> split=<split>`.

Plays every task of the split, or a seeded sample of `eval.num_tasks` stratified by task type
(`selection.py`; the report's `task_selection` says which), with the rollout numerics of the config (so W8A8-KV8 and bf16 deployment can be compared), and reports
success rate (with a 95 % interval), mean score, mean turns of successful episodes, the share of
episodes that hit the step cap, and per-task-type success.
"""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from agentq.agent import BackendPolicy, ChatFormat, EpisodeSpec, episode_seed
from agentq.agent.trajectory import Trajectory
from agentq.utils.logging import console, jsonable, progress

from .metrics import summarize
from .selection import TaskSelection, select_tasks


def choose_eval_tasks(cfg: DictConfig, split: str, num_tasks: int | None) -> TaskSelection:
    """The tasks of `split` an evaluation plays: all, or `num_tasks` stratified by task type
    (`eval.selection`, seeded by `seed`, so every evaluation of a run plays the same tasks)."""
    from agentq import build

    env = build.make_env(cfg, split)
    try:
        u = env.unwrapped
        return select_tasks(list(u.list_tasks(split)), num_tasks, getattr(u, "task_type", None),
                            seed=int(cfg.seed), method=str(cfg.eval.get("selection", "stratified")))
    finally:
        env.close()


def repeat_tasks(tasks: list[str], repeats: int = 1) -> list[str]:
    return [t for t in tasks for _ in range(int(repeats))]


def run_episodes(loop, policy, tasks: list[str], split: str, seed: int, first_id: int = 0,
                 description: str = "eval") -> list[Trajectory]:
    specs = [EpisodeSpec(first_id + i, t, split, group_id=i, seed=episode_seed(seed, first_id + i))
             for i, t in enumerate(tasks)]
    with progress(transient=True) as prog:
        task = prog.add_task(description, total=len(specs), info="")
        won = [0]

        def done(t: Trajectory):
            won[0] += int(t.won)
            prog.update(task, advance=1, info=f"won {won[0]}")
        return loop.run(specs, policy, on_done=done)


def evaluate(cfg: DictConfig) -> dict:
    from agentq import build

    device, dtype = build.device_and_dtype(cfg)
    path = cfg.checkpoint or build.model_path(cfg)
    if not (Path(path) / "config.json").exists():
        raise FileNotFoundError(f"checkpoint={path!r} is not an HF checkpoint folder (no config.json)")
    split = cfg.split or cfg.env.eval_split
    selection = choose_eval_tasks(cfg, split, cfg.eval.num_tasks)
    tasks = repeat_tasks(selection.tasks, cfg.eval.repeats)
    chat = ChatFormat.from_tokenizer(build.load_tokenizer(path))
    n_conc = min(len(tasks), int(cfg.rollout.max_slots), int(cfg.trainer.max_concurrent))
    engine = build.make_backend(cfg, path, device, dtype, chat.tokenizer, max_slots=n_conc)
    pool = build.env_pool(cfg, split, n_conc)
    try:
        loop = build.agent_loop(cfg, pool, chat, build.sampling_params(cfg, chat, cfg.eval.temperature), n_conc,
                                run_seed=int(cfg.seed))
        trajs = run_episodes(loop, BackendPolicy(engine), tasks, split, int(cfg.seed),
                             description=f"eval {cfg.env.name}/{split}")
    finally:
        pool.close()
    report = {"env": cfg.env.name, "split": split, "checkpoint": str(path), "rollout_quant": cfg.rollout.quant,
              "temperature": float(cfg.eval.temperature), "task_selection": selection.to_dict(), **summarize(trajs)}
    out = Path(cfg.eval.out_dir) if cfg.eval.out_dir else Path(path) / f"eval-{cfg.env.name}-{split}"
    write_report(out, report, trajs)
    print_report(report)
    return report


def write_report(out: Path, report: dict, trajs: list[Trajectory]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(jsonable(report), indent=2))
    with (out / "episodes.jsonl").open("w") as f:
        for t in trajs:
            f.write(json.dumps({"task_id": t.task_id, "won": t.won, "score": t.score, "turns": t.turns,
                                "end_reason": t.end_reason, "reward": t.reward, "error": t.error,
                                "task_type": t.info.get("task_type"), "transcript": t.transcript}) + "\n")
    report["out_dir"] = str(out)


def print_report(r: dict) -> None:
    from rich.table import Table

    t = Table(title=f"{r['env']} / {r['split']}  ({r['episodes']} episodes, rollout={r['rollout_quant']})")
    for c in ("metric", "value"):
        t.add_column(c)
    if r.get("task_selection"):
        t.add_row("tasks", r["task_selection"]["description"])
    lo, hi = r["success_ci95"]
    t.add_row("success rate", f"{100 * r['success_rate']:.1f} %  (95 % CI {100 * lo:.1f}–{100 * hi:.1f})")
    t.add_row("mean score", f"{100 * r['score_mean']:.1f}")
    t.add_row("turns (successful)", f"{r['turns_success_mean']:.2f}")
    t.add_row("hit step cap", f"{100 * r['cap_rate']:.1f} %")
    t.add_row("invalid-format turns", f"{100 * r['invalid_action_rate']:.1f} %")
    t.add_row("inadmissible-action turns", f"{100 * r['inadmissible_action_rate']:.1f} %")
    if r.get("errors"):
        t.add_row("errored episodes", str(r["errors"]))
    for k, v in (r.get("per_task_type") or {}).items():
        t.add_row(f"  {k}", f"{100 * v['success_rate']:.1f} % of {v['episodes']}")
    console.print(t)
