"""`eval/partial.py`: what a stopped `agentq eval` keeps (the end-to-end resume is in
test_eval_outputs.py): errored episodes are played again, the fingerprint sees the model files only
(and the env data folder's),
and the stop says how to go on where a rerun would not find the folder."""
from __future__ import annotations

import json
import shutil

from omegaconf import OmegaConf

from agentq.eval.evaluate import resume_text, run_settings
from agentq.eval.partial import PARTIAL, PartialEpisodes, fingerprint


def test_errored_episodes_are_played_again_and_a_later_line_wins(tmp_path):
    rows = [{"fingerprint": "k"},
            {"episode_id": 7, "task_id": "a", "won": True, "score": 1.0, "turns": 2, "end_reason": "won", "reward": 1.0},
            {"episode_id": 8, "task_id": "b", "won": False, "score": 0.0, "turns": 1, "end_reason": "error",
             "reward": 0.0, "error": "the env worker died"},
            {"episode_id": 9, "task_id": "c", "won": False, "score": 0.0, "turns": 1, "end_reason": "error", "reward": 0.0},
            {"episode_id": 9, "task_id": "c", "won": False, "score": 0.5, "turns": 3, "end_reason": "step_cap",
             "reward": 0.0}]
    (tmp_path / PARTIAL).write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = PartialEpisodes(tmp_path, "k", resume="go on")
    assert sorted(p.done) == [7, 9] and p.done[9].score == 0.5 and p.done[7].won
    assert p.kept_text() == f"2 finished episodes kept in {tmp_path / PARTIAL}: go on"


def test_the_fingerprint_sees_the_model_files_not_what_an_evaluation_writes_beside_them(tiny_model_dir, tmp_path):
    """eval.out_dir at the checkpoint folder: the partial file and the lock changed the fingerprint, so
    the same command started over."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    key = fingerprint({"a": 1}, str(ckpt), ["t"])
    (ckpt / PARTIAL).write_text("{}\n")
    (ckpt / ".agentq.lock").write_text("1")
    (ckpt / "eval.json").write_text("{}")
    assert fingerprint({"a": 1}, str(ckpt), ["t"]) == key
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text() + " ")
    assert fingerprint({"a": 1}, str(ckpt), ["t"]) != key


def test_the_checkpoint_as_written_is_not_a_setting_and_a_timed_folder_is_named_to_go_on(tmp_path):
    a = OmegaConf.create({"checkpoint": "ckpt", "eval": {"out_dir": None}})
    b = OmegaConf.create({"checkpoint": str(tmp_path / "ckpt"), "eval": {"out_dir": None}})
    assert run_settings(a) == run_settings(b)           # `fingerprint` takes the resolved path
    assert resume_text(a, tmp_path / "e") == "the same command plays the rest"
    c = OmegaConf.create({"checkpoint": None, "eval": {"out_dir": None}})
    assert resume_text(c, tmp_path / "e") == f"the same command with eval.out_dir={tmp_path / 'e'} plays the rest"


def test_the_fingerprint_sees_the_env_data_folder_changed_in_place(tiny_model_dir, tmp_path):
    """An ALFWorld / WebShop data folder changed under the same path (env.kwargs.data_dir unchanged)
    holds other games: the stopped evaluation's episodes are not taken."""
    data = tmp_path / "data"
    (data / "json_2.1.1" / "valid_seen" / "g1").mkdir(parents=True)
    game = data / "json_2.1.1" / "valid_seen" / "g1" / "game.tw-pddl"
    game.write_text("a")
    key = fingerprint({"a": 1}, str(tiny_model_dir), ["t"], str(data))
    assert fingerprint({"a": 1}, str(tiny_model_dir), ["t"], str(data)) == key
    assert fingerprint({"a": 1}, str(tiny_model_dir), ["t"]) != key
    game.write_text("ab")                                            # a game rewritten
    changed = fingerprint({"a": 1}, str(tiny_model_dir), ["t"], str(data))
    assert changed != key
    (data / "json_2.1.1" / "valid_seen" / "g2").mkdir()
    (data / "json_2.1.1" / "valid_seen" / "g2" / "game.tw-pddl").write_text("c")      # a game added
    assert fingerprint({"a": 1}, str(tiny_model_dir), ["t"], str(data)) != changed
    # no data folder, or a path that is none: the model and settings alone, as before
    assert fingerprint({"a": 1}, str(tiny_model_dir), ["t"], str(tmp_path / "none")) == \
        fingerprint({"a": 1}, str(tiny_model_dir), ["t"], None)


def test_the_data_fingerprint_walks_linked_folders_and_lists_a_dangling_link(tiny_model_dir, tmp_path):
    """A data tree whose games folder is a link (the env reads through it) is fingerprinted through it;
    a link to nothing is listed, not a crash; a link loop ends."""
    import os

    games = tmp_path / "elsewhere" / "json_2.1.1"
    (games / "valid_seen").mkdir(parents=True)
    game = games / "valid_seen" / "game.tw-pddl"
    game.write_text("a")
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(games, data / "json_2.1.1")
    os.symlink(tmp_path / "nothing", data / "dangling")
    os.symlink(data, games / "loop")                         # data/json_2.1.1/loop -> data
    from agentq.eval.partial import data_files

    assert data_files(str(data)) == [("dangling", -1, -1),
                                     ("json_2.1.1/valid_seen/game.tw-pddl", 1, game.stat().st_mtime_ns)]
    key = fingerprint({"a": 1}, str(tiny_model_dir), ["t"], str(data))
    game.write_text("ab")
    assert fingerprint({"a": 1}, str(tiny_model_dir), ["t"], str(data)) != key


def test_without_a_data_folder_the_fingerprint_is_the_one_before_data_folders_counted(tiny_model_dir):
    """A stopped evaluation from before the data folder entered the fingerprint still resumes."""
    import hashlib
    from pathlib import Path

    from agentq.eval.partial import MODEL_FILES

    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in Path(tiny_model_dir).iterdir()
                   if p.is_file() and (p.suffix == ".safetensors" or p.name in MODEL_FILES))
    before = json.dumps({"settings": {"a": 1}, "checkpoint": str(Path(tiny_model_dir).resolve()), "files": files,
                         "tasks": ["t"]}, sort_keys=True, default=str)
    assert fingerprint({"a": 1}, str(tiny_model_dir), ["t"]) == hashlib.sha256(before.encode()).hexdigest()
