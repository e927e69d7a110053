"""A TextEnv whose hooks return the wrong type fails with a TypeError naming the hook (it was an
AttributeError deep inside `reset`/`step`, or an int task id that `reset` then refused as "not a str"),
an unknown task id's message reads without KeyError's quotes, and a typo in "module:Class" suggests
the class."""
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
