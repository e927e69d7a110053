"""`build.check_split_data` / `build.split_tasks`: a split the env refuses (no task ids) is one line
before the model is built, for every command, in the words `agentq eval` uses; a split is listed
once a process per env setting."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agentq import build
from agentq.cli import main
from agentq.config import load_config
from conftest import SHARED_SPLITS_ENV, one_task_env

EMPTY = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("Base", ("train", "test"), """
    def _expert_action(self):
        return "go"
""") + '''

class EmptyTest(Base):
    def _tasks(self, split):
        return [] if split == "test" else ["a"]


class EmptyTrain(Base):
    def _tasks(self, split):
        return [] if split == "train" else ["a"]
'''


@pytest.mark.parametrize("cmd, cls, key, split", [("train", "EmptyTest", "env.eval_split", "test"),
                                                  ("train", "EmptyTrain", "env.train_split", "train"),
                                                  ("pipeline", "EmptyTest", "env.eval_split", "test"),
                                                  ("sft", "EmptyTrain", "env.train_split", "train"),
                                                  ("eval", "EmptyTest", "split", "test")])
def test_an_empty_split_is_one_line_before_the_model_is_built(tmp_path, monkeypatch, capsys, request, cmd, cls,
                                                              key, split):
    """An env whose `_tasks('test')` returned [] made `agentq train` build the model, then end in a
    25-line traceback from the trainer's task list; `agentq eval` said it in one line, and now every
    command does, in its words (`build.split_refused`), naming the setting that gave the split."""
    (tmp_path / "empty_split_env.py").write_text(EMPTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "env").mkdir(parents=True)
    base = OmegaConf.to_container(load_config([]).env)
    (tmp_path / "conf" / "env" / "empty.yaml").write_text(OmegaConf.to_yaml(
        {**base, "name": f"empty_split_env:{cls}", "kwargs": {}, "train_split": "train", "eval_split": "test"}))
    # SFT loads the tokenizer before its task list (and builds its model after the demonstrations)
    for name in ("make_backend", "env_pool", "learner_threads", *(["load_tokenizer"] if cmd != "sft" else [])):
        monkeypatch.setattr(build, name, lambda *a, **k: pytest.fail("the model was built"))
    out = tmp_path / "out"
    where = {"train": ["trainer.out_dir", "trainer.steps=1"], "sft": ["sft.out_dir"],
             "pipeline": ["pipeline.out_dir", "pipeline.eval_splits=null"],
             "eval": ["eval.out_dir", f"checkpoint={request.getfixturevalue('tiny_model_dir')}", "split=test"]}[cmd]
    assert main([cmd, "env=empty", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "env_pool=inline",
                 f"{where[0]}={out}", *where[1:]]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"agentq: {key}={split!r}: {cls}._tasks({split!r}) returned no task ids; every "
                                    "split in `splits` ['train', 'test'] needs at least one")
    assert "Traceback" not in err and not out.exists()


def test_a_bug_in_an_envs_task_list_says_where(tmp_path, monkeypatch, capsys):
    """Only the base class's refusals (`SplitRefused`) read as they are; another ValueError from
    `_tasks` (here a JSON parse of a damaged file) is a bug or the env's own refusal, so the line
    names where it was raised instead of blaming the split alone."""
    source = EMPTY + '''

class Buggy(Base):
    def _tasks(self, split):
        import json
        return json.loads("")
'''
    (tmp_path / "buggy_split_env.py").write_text(source)
    line = source.splitlines().index('        return json.loads("")') + 1
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "env").mkdir(parents=True)
    base = OmegaConf.to_container(load_config([]).env)
    (tmp_path / "conf" / "env" / "buggy.yaml").write_text(OmegaConf.to_yaml(
        {**base, "name": "buggy_split_env:Buggy", "kwargs": {}, "train_split": "train", "eval_split": "test"}))
    cfg = load_config(["env=buggy", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"])
    with pytest.raises(build.ConfigError) as err:
        build.check_split_data(cfg, ["train"])
    assert str(err.value) == ("env.train_split='train': Expecting value: line 1 column 1 (char 0) "
                              f"(raised at buggy_split_env.py:{line})")


def test_a_held_out_split_sharing_task_ids_with_training_is_said(tmp_path, monkeypatch, capsys):
    """Both splits are listed at start-up anyway: ids the held-out split shares with env.train_split
    (an env whose _tasks gives both the same games) are counted in a warning; disjoint ones say nothing."""
    (tmp_path / "shared_split_env.py").write_text(SHARED_SPLITS_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    for cls in ("Shared", "Apart"):
        cfg = load_config(["env.train_split=train", "env.eval_split=test"])
        OmegaConf.update(cfg, "env.name", f"shared_split_env:{cls}")
        OmegaConf.update(cfg, "env.kwargs", {}, merge=False)
        build.check_split_data(cfg, ["train", "test"])
        said = " ".join(capsys.readouterr().err.split())
        if cls == "Shared":
            assert said == ("warning: 2 of the 4 task ids of env.eval_split='test' are also ids of "
                            "env.train_split='train': evaluations there measure tasks training draws from, not "
                            "held-out ones (an env's _tasks gives each split its ids)")
        else:
            assert said == ""


def test_the_split_key_is_the_setting_that_gave_the_split():
    """A pipeline sets env.eval_split to each of pipeline.eval_splits in turn, so there the list is
    what to change; a run's own eval split otherwise."""
    cfg = load_config(["env.train_split=train", "env.eval_split=test", "pipeline.eval_splits=[dev,test]"],
                      command="pipeline")
    assert [build.split_key(cfg, s) for s in ("train", "dev", "test", "other")] == [
        "env.train_split", "pipeline.eval_splits", "pipeline.eval_splits", "split"]
    cfg = load_config(["env.train_split=train", "env.eval_split=test", "pipeline.eval_splits=null"])
    assert [build.split_key(cfg, s) for s in ("train", "test")] == ["env.train_split", "env.eval_split"]


COUNTED = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("Counted", ("train", "test"), """
    def __init__(self, size=1, colour="red", **kwargs):
        super().__init__(**kwargs)
""") + """

class Other(Counted):
    pass
"""


def test_a_split_is_listed_once_a_process_per_env_setting(tmp_path, monkeypatch):
    """The start-up check (`check_split_data`) and the run's own list (`split_tasks`: the trainer's,
    SFT's) share one listing (ALFWorld's real splits were listed twice, each reading every game's
    files); equal settings composed anew share it too, their keys in any order. Another env, split,
    env.kwargs value or step cap (each reaches the env's constructor) is listed again, never answered
    from another setting's list. Counted at the env's own listing."""
    from agentq.envs import TextEnv

    (tmp_path / "counted_split_env.py").write_text(COUNTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen, list_tasks = [], TextEnv.list_tasks
    monkeypatch.setattr(TextEnv, "list_tasks",
                        lambda env, split=None: seen.append((type(env).__name__, split)) or list_tasks(env, split))

    def cfg(name="Counted", kwargs=None, max_steps=5):
        c = load_config([f"env.max_steps={max_steps}"])
        OmegaConf.update(c, "env.name", f"counted_split_env:{name}")
        OmegaConf.update(c, "env.kwargs", kwargs or {"size": 1, "colour": "red"}, merge=False)
        return c

    build.check_split_data(cfg(), ["train", "test", "train"])
    assert seen == [("Counted", "train"), ("Counted", "test")]
    tasks = build.split_tasks(cfg(), "train")
    assert tasks == ("a",) and isinstance(tasks, tuple)       # a caller cannot change the list kept
    assert build.split_tasks(cfg(kwargs={"colour": "red", "size": 1}), "test") == ("a",)
    assert len(seen) == 2                                       # the same settings: no second listing
    for other in (cfg(name="Other"), cfg(kwargs={"size": 2, "colour": "red"}), cfg(max_steps=6)):
        assert build.split_tasks(other, "train") == build.split_tasks(other, "train") == ("a",)
    assert seen[2:] == [("Other", "train"), ("Counted", "train"), ("Counted", "train")]
    build.forget_split_tasks()
    build.split_tasks(cfg(), "train")
    assert seen[5:] == [("Counted", "train")]
