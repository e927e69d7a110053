"""Each environment's conf/env/<name>.yaml works with `agentq train` (2 steps) and `agentq eval` on
its held-out split, through the CLI entry point, with the real engines (tiny sizes)."""
import json
import os
import tarfile
from pathlib import Path

import pytest

from agentq.cli import main

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = "alfworld-json_2.1.1-valid.tar.gz"
SMALL = ["trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.eval_every=-1",
         "env.max_steps=3", "env.max_new_tokens=16", "model.tiny.corpus_episodes=4", "env_pool=inline"]


def alfworld_data(tmp_path_factory) -> str:
    for p in (os.environ.get("AGENTQ_ALFWORLD_ARCHIVE"), REPO.parent / "shared" / "data" / ARCHIVE):
        if p and Path(p).exists():
            d = tmp_path_factory.mktemp("alfdata")
            with tarfile.open(p) as t:
                t.extractall(d, filter="data")
            return str(d / "alfworld")
    pytest.skip(f"real ALFWorld games not available (set AGENTQ_ALFWORLD_ARCHIVE to {ARCHIVE})")


@pytest.mark.parametrize("env,split", [("alfworld", "valid_unseen"), ("scienceworld", "test"), ("webshop", "test")])
def test_env_config_trains_and_evaluates(env, split, tmp_path, tmp_path_factory, monkeypatch):
    if env == "alfworld":
        monkeypatch.setenv("ALFWORLD_DATA", alfworld_data(tmp_path_factory))
    run = tmp_path / "run"
    assert main(["train", f"env={env}", *SMALL, f"trainer.out_dir={run}"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["episodes"] == 4 and rows[-1]["errored_episodes"] == 0
    ckpt = run / "checkpoints" / "step_000002"
    assert main(["eval", f"env={env}", f"checkpoint={ckpt}", f"split={split}", "eval.num_tasks=2", "env.max_steps=3",
                 "env_pool=inline", f"eval.out_dir={tmp_path / 'eval'}"]) == 0
    rep = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert rep["env"] == env and rep["split"] == split and rep["episodes"] == 2 and rep["errors"] == 0
    if env == "alfworld":
        assert rep["per_task_type"]            # per-task-type success in every ALFWorld report
