"""A TextEnv whose hooks return the wrong type (or a TaskStep with a field of the wrong type) fails
with a TypeError naming the hook (it was an AttributeError deep inside `reset`/`step`, or an int task
id that `reset` then refused as "not a str"), an empty split or a repeated task id is a ValueError,
an unknown task id's message reads without KeyError's quotes, `task_type()` fills info["task_type"],
and a typo in "module:Class" suggests the class."""
from __future__ import annotations

import pytest

from agentq.envs import EpisodeOverError, TaskStep, TextEnv, UnknownTaskError


class Good(TextEnv):
    splits = ("train", "test")

    def _tasks(self, split):
        return ["a", "b"]

    def _reset_task(self, task_id, split):
        return "goal", TaskStep(obs="start")

    def _step_task(self, action):
        return TaskStep(obs="ok")


class ResetObsOnly(Good):
    def _reset_task(self, task_id, split):
        return "start"


class ResetObsString(Good):
    def _reset_task(self, task_id, split):
        return "goal", "start"


class StepGymTuple(Good):
    def _step_task(self, action):
        return "ok", 0.0, False, False, {}


class IntTasks(Good):
    def _tasks(self, split):
        return [1, 2]


@pytest.mark.parametrize("cls, said", [
    (ResetObsOnly, "ResetObsOnly._reset_task must return (goal: str, TaskStep(obs=...)), got str"),
    (ResetObsString, "ResetObsString._reset_task must return (goal: str, TaskStep(obs=...)), got (str, str)"),
])
def test_a_reset_hook_of_the_wrong_type_is_named(cls, said):
    env = cls()
    with pytest.raises(TypeError) as e:
        env.reset(options={"task_id": "a"})
    assert str(e.value) == said
    with pytest.raises(EpisodeOverError):         # the failed reset left no episode to step
        env.step("x")


def test_a_step_hook_returning_gymnasiums_tuple_is_named_and_ends_the_episode():
    env = StepGymTuple()
    env.reset(options={"task_id": "a"})
    with pytest.raises(TypeError) as e:
        env.step("x")
    assert str(e.value) == ("StepGymTuple._step_task must return a TaskStep(obs=..., reward=..., done=..., won=...), "
                            "got a tuple of 5")
    with pytest.raises(EpisodeOverError, match="its last step raised TypeError"):
        env.step("x")


def test_task_ids_that_are_not_str_are_named_at_the_task_list():
    with pytest.raises(TypeError) as e:
        IntTasks().list_tasks("test")
    assert str(e.value) == "IntTasks._tasks('test') must return str task ids, got int (1)"


def test_an_unknown_task_id_reads_as_a_sentence():
    with pytest.raises(UnknownTaskError) as e:
        Good().reset(options={"task_id": "zz"})
    assert str(e.value) == ("unknown task_id 'zz' for split 'train' of Good (2 tasks, e.g. ['a', 'b']); "
                            "see env.unwrapped.list_tasks('train')")
    assert isinstance(e.value, KeyError)           # still what callers catch


def test_a_good_env_is_unchanged():
    env = Good()
    obs, info = env.reset(options={"task_id": "b"})
    assert obs == "start" and info["task"] == "goal" and info["task_id"] == "b"
    assert env.step("x")[0] == "ok"


def test_a_typo_in_module_class_suggests_the_class(tmp_path, monkeypatch):
    """`env.name=my_mod:GoodEnvv` said the attribute was missing and then named env.name a second time
    (the CLI names it already); it now suggests the module's TextEnv subclass spelled closest."""
    import gymnasium as gym

    from agentq.envs import env_id

    (tmp_path / "typo_mod.py").write_text("from agentq.envs import TaskStep, TextEnv\n\n\n"
                                          "class GoodEnv(TextEnv):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(gym.error.NameNotFound) as e:
        env_id("typo_mod:GoodEnvv")
    assert str(e.value) == "module 'typo_mod' has no attribute 'GoodEnvv'; did you mean typo_mod:GoodEnv?"
    with pytest.raises(gym.error.NameNotFound) as e:
        env_id("typo_mod:Other")
    assert str(e.value) == "module 'typo_mod' has no attribute 'Other'; its TextEnv subclasses: ['GoodEnv']"


class FieldsOf(Good):
    """A TaskStep from `_step_task` (or, with at_reset, from `_reset_task`) with `fields` set."""
    fields: dict = {}
    at_reset = False

    def _reset_task(self, task_id, split):
        return "goal", TaskStep(**{"obs": "start", **(self.fields if self.at_reset else {})})

    def _step_task(self, action):
        return TaskStep(**{"obs": "ok", **self.fields})


@pytest.mark.parametrize("fields, at_reset, said", [
    ({"obs": None}, False, "_step_task returned a TaskStep whose obs is NoneType (None); it must be a str"),
    ({"obs": 42}, True, "_reset_task returned a TaskStep whose obs is int (42); it must be a str"),
    ({"reward": None}, False, "_step_task returned a TaskStep whose reward is NoneType (None); it must be a finite "
                              "number"),
    ({"score": float("nan")}, False, "_step_task returned a TaskStep whose score is float (nan); it must be a finite "
                                     "number"),
    ({"admissible_actions": "go north"}, False, "_step_task returned a TaskStep whose admissible_actions is str "
                                                "('go north'); it must be None or a list of str"),
    ({"admissible_actions": ["go", 3]}, True, "_reset_task returned a TaskStep whose admissible_actions is list "
                                              "(['go', 3]); it must be None or a list of str"),
    ({"extra": ["oops"]}, False, "_step_task returned a TaskStep whose extra is list (['oops']); it must be a dict"),
])
def test_a_task_step_field_the_agent_loop_cannot_use_is_named_with_the_hook(fields, at_reset, said):
    """An obs of None crashed the trainer's process at the next prompt (`len(None)`), not the episode;
    admissible actions given as one str were shown and compared one character at a time; a None reward
    or a list `extra` was a TypeError / ValueError from inside `step` naming neither hook nor field.
    Now each is a TypeError naming both, so inside training it loses that episode (errored)."""
    cls = type("Bad", (FieldsOf,), {"fields": fields, "at_reset": at_reset})
    env = cls()
    with pytest.raises(TypeError) as e:
        env.reset(options={"task_id": "a"})
        env.step("x")
    assert str(e.value) == f"Bad.{said}"
    with pytest.raises(EpisodeOverError):           # the episode is over either way
        env.step("x")


def test_gymnasiums_checker_refuses_an_obs_that_is_no_str_and_numpy_numbers_pass():
    """check_env, the guide's first step, stepped an env whose obs was None without a word."""
    import numpy as np
    from gymnasium.utils.env_checker import check_env

    with pytest.raises(TypeError, match="Bad._step_task returned a TaskStep whose obs is NoneType"):
        check_env(type("Bad", (FieldsOf,), {"fields": {"obs": None}})())
    fine = type("Fine", (FieldsOf,), {"fields": {"reward": np.float32(1.0), "score": np.int64(1),
                                                 "admissible_actions": ("a", "b"), "extra": {"k": 1}}})()
    fine.reset(options={"task_id": "a"})
    obs, reward, *_, info = fine.step("x")
    assert (obs, reward, info["score"], info["admissible_actions"], info["k"]) == ("ok", 1.0, 1.0, ("a", "b"), 1)


class NoTestTasks(Good):
    def _tasks(self, split):
        return ["a", "b"] if split == "train" else []


class RepeatedTasks(Good):
    def _tasks(self, split):
        return ["a", "b", "c", "b"]


def test_an_empty_split_or_a_repeated_task_id_is_named_at_the_task_list():
    """An empty split was numpy's "high <= 0" in training's task sampling and an evaluation of 0
    episodes ("nan %"); a repeated id was played twice by evaluation and mixed up in paired tests."""
    env = NoTestTasks()
    assert env.list_tasks("train") == ["a", "b"]
    with pytest.raises(ValueError) as e:
        env.list_tasks("test")
    assert str(e.value) == ("NoTestTasks._tasks('test') returned no task ids; every split in `splits` "
                            "['train', 'test'] needs at least one")
    with pytest.raises(ValueError) as e:
        env.reset(options={"split": "test"})
    assert "NoTestTasks._tasks('test') returned no task ids" in str(e.value)
    with pytest.raises(ValueError) as e:
        RepeatedTasks().list_tasks("train")
    assert str(e.value) == ("RepeatedTasks._tasks('train') returned the task id 'b' more than once; task ids must "
                            "be unique within a split")


class Typed(Good):
    def task_type(self, task_id):
        return f"type-{task_id}"


class TypedWithExtra(Typed):
    def _step_task(self, action):
        return TaskStep(obs="ok", extra={"task_type": "own"})


def test_info_task_type_comes_from_task_type_unless_the_env_sets_it():
    """An env with `task_type()` but no `extra={"task_type": ...}` had no task type in its info
    (training's segments and transcripts lacked it) while evaluation stratified by the method."""
    env = Typed()
    assert env.reset(options={"task_id": "b"})[1]["task_type"] == "type-b"
    assert env.step("x")[4]["task_type"] == "type-b"
    env = TypedWithExtra()
    assert env.reset(options={"task_id": "a"})[1]["task_type"] == "type-a"
    assert env.step("x")[4]["task_type"] == "own"
    assert "task_type" not in Good().reset(options={"task_id": "a"})[1]        # no types: no key
