"""Held-out tasks that begin exactly as a training task does (`eval/replays.py`): TextWorldExpress
coin at its default size replays train games at test seeds 20480-20999 (measured by walking every
room in tests/envs/test_heldout_splits.py), and an evaluation's success over them measured training
games without a word. Now eval.json's `replays_train` names them, with the success over them and over
the others, recomputed here from episodes.jsonl."""
from __future__ import annotations

import json
import shutil

from agentq.agent.trajectory import Trajectory
from agentq.cli import main
from agentq.config import load_config
from agentq.eval.replays import opening_key, replays_record, train_openings

SMALL = ["env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8"]


def test_an_evaluation_names_the_tasks_that_replay_training_openings(tiny_model_dir, tmp_path, capsys):
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    out = tmp_path / "ev"
    assert main(["eval", f"checkpoint={ckpt}", "eval.num_tasks=20", *SMALL, f"eval.out_dir={out}"]) == 0
    report = json.loads((out / "eval.json").read_text())
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    replay = [e for e in episodes if 20480 <= int(e["task_id"].rsplit("/", 1)[1]) <= 20999]
    other = [e for e in episodes if e not in replay]
    assert 0 < len(replay) < len(episodes) == 20                 # the stratified sample holds both kinds
    r = report["replays_train"]
    assert (r["train_split"], r["tasks"], r["of_tasks"], r["episodes"], r["other_episodes"]) == \
        ("train", len(replay), 20, len(replay), len(other))
    assert r["success_rate"] == sum(e["won"] for e in replay) / len(replay)
    assert r["other_success_rate"] == sum(e["won"] for e in other) / len(other)
    assert set(r["examples"]) <= {e["task_id"] for e in replay}
    assert all(0 <= int(t.rsplit("/", 1)[1]) <= 999 for t in r["examples"].values())      # train tasks
    said = " ".join(capsys.readouterr().err.split())
    assert f"warning: {len(replay)} of the 20 tasks begin exactly as a train task does (the same first prompt" in said
    assert main(["eval", f"checkpoint={ckpt}", "eval.num_tasks=20", *SMALL, "eval.check_replays=false",
                 f"eval.out_dir={tmp_path / 'off'}"]) == 0
    assert "replays_train" not in json.loads((tmp_path / "off" / "eval.json").read_text())


def test_envs_whose_training_openings_are_not_cheap_are_not_listed():
    """ScienceWorld's class does not set openings_listable: nothing is built or reset."""
    assert train_openings(load_config(["env=scienceworld"]), {}) is None


def test_the_record_by_hand():
    def traj(task, first, won):
        t = Trajectory(0, task, "test")
        t.won, t.transcript = won, [{"user": first}] if first is not None else []
        return t

    openings = {opening_key("kitchen, coin"): "coin/3", opening_key("pantry"): "coin/7"}
    trajs = [traj("coin/20500", "kitchen, coin", True), traj("coin/20500", "kitchen, coin", False),
             traj("coin/20001", "hallway", True), traj("coin/20002", None, False),   # errored before its first turn
             traj("coin/20600", "pantry", True)]
    assert replays_record(trajs, openings, "train") == {
        "train_split": "train", "tasks": 2, "of_tasks": 4, "episodes": 3, "success_rate": 2 / 3,
        "other_episodes": 2, "other_success_rate": 0.5, "examples": {"coin/20500": "coin/3", "coin/20600": "coin/7"}}
    assert replays_record(trajs[2:4], openings, "train") is None and replays_record(trajs, None, "train") is None
