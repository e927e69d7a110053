"""Stand-in arm runners for the sweep's job scheduling test (spawned processes import this module
by name: the pool's children get the test's sys.path). A real arm takes minutes; what is tested is
the scheduling around it."""
from __future__ import annotations

import time
from pathlib import Path


def run_marked(job: dict) -> None:
    """Write `<run_dir>.started`; the arm "fail" raises after 0.2 s, the others take 2 s."""
    Path(str(job["run_dir"]) + ".started").touch()
    if job["arm"] == "fail":
        time.sleep(0.2)
        raise RuntimeError("arm fail broke")
    time.sleep(2)


def run_dying(job: dict) -> None:
    """The arm "die" ends its worker process (as the kernel's OOM killer would) once the job named by
    its "wait_for" has started, so that one is running beside it; others take 3 s."""
    import os

    Path(str(job["run_dir"]) + ".started").touch()
    if job["arm"] == "die":
        deadline = time.time() + 60
        while job.get("wait_for") and not Path(job["wait_for"]).exists() and time.time() < deadline:
            time.sleep(0.01)
        os._exit(9)
    time.sleep(3)
    Path(str(job["run_dir"]) + ".done").touch()


def run_folder_only(job: dict) -> None:
    """As `run_arm` with its RL run left out: the run folder made afresh (a file in its place fails as
    it does there), then result.json."""
    import shutil

    run_dir = Path(job["run_dir"])
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text("{}")


def run_finished(job: dict) -> None:
    """As `run_arm` with its RL left out: the run folder with its composed config.yaml, metrics.jsonl
    (an evaluation at steps 1 and 2), the final evaluation (two tasks, one won) and result.json."""
    import json
    import shutil

    from omegaconf import OmegaConf

    from agentq.trainer.sweep import RESULT, arm_config

    run_dir = Path(job["run_dir"])
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cfg = arm_config(job["overrides"])
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    steps = int(cfg.trainer.steps)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "reward_mean": 0.5, "k3": 0.0, "rollout_time_s": 1.0, "train_time_s": 2.0},
        {"step": 1, "eval/success_rate": 0.25}, {"step": steps, "eval/success_rate": 0.5}]))
    final = run_dir / "eval" / f"step_{steps:06d}"
    final.mkdir(parents=True)
    (final / "eval.json").write_text(json.dumps({"success_rate": 0.5, "episodes": 2}))
    (final / "episodes.jsonl").write_text("".join(json.dumps({"task_id": t, "won": w}) + "\n"
                                                  for t, w in (("a", True), ("b", False))))
    (run_dir / RESULT).write_text(json.dumps({
        "arm": job["arm"], "seed": job["seed"], "algo": cfg.algo.name, "objective": cfg.algo.objective,
        "rollout_quant": cfg.rollout.quant, "rollout_backend": cfg.rollout.backend,
        "learner_quant": cfg.algo.learner_quant, "steps": steps, "overrides": job["overrides"]}))
