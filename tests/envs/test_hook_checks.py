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


class ExpertRaises(Good):
    """An expert (or, with `raise_in = "task_type"`, a task type) that raises from turn `at` on;
    `engine_calls` counts the steps that reached the engine."""
    at = 1
    raise_in = "_expert_action"

    def _reset_task(self, task_id, split):
        self.engine_calls = 0
        return super()._reset_task(task_id, split)

    def _step_task(self, action):
        self.engine_calls += 1
        return super()._step_task(action)

    def _boom(self, hook):
        if self.raise_in == hook and self.num_steps >= self.at:
            raise KeyError(f"{hook} exploded")

    def _expert_action(self):
        self._boom("_expert_action")
        return "x"

    def task_type(self, task_id):
        self._boom("task_type")
        return "t"


@pytest.mark.parametrize("hook", ["_expert_action", "task_type"])
def test_a_hook_raising_while_the_info_is_built_ends_the_episode(hook):
    """The episode stayed open (`_done` was cleared before the info was built, outside the guard
    that marks a step lost), so every later step reached the engine again; and the hook's raw
    KeyError is none of the documented exceptions. Now it is an EnvCrashedError naming the hook,
    chained to the KeyError, and the next step raises EpisodeOverError without reaching the engine."""
    from agentq.envs import EnvCrashedError

    env = type("Boom", (ExpertRaises,), {"raise_in": hook})(expert=True)
    env.reset(options={"task_id": "a"})
    with pytest.raises(EnvCrashedError) as e:
        env.step("x")
    assert str(e.value).startswith(f"Boom.{hook} raised KeyError: '{hook} exploded'; the episode is lost")
    assert isinstance(e.value.__cause__, KeyError)
    for _ in range(2):
        with pytest.raises(EpisodeOverError, match="its last step raised EnvCrashedError"):
            env.step("x")
    assert env.engine_calls == 1
    # the same at reset: no episode to step afterwards
    env = type("Boom", (ExpertRaises,), {"raise_in": hook, "at": 0})(expert=True)
    with pytest.raises(EnvCrashedError, match=f"Boom.{hook} raised KeyError"):
        env.reset(options={"task_id": "a"})
    with pytest.raises(EpisodeOverError, match="\\(lost: its reset raised EnvCrashedError\\)"):
        env.step("x")
    assert env.engine_calls == 0
    env.at = 99                                           # a good reset starts over
    env.reset(options={"task_id": "a"})
    assert env.step("x")[0] == "ok"


@pytest.mark.parametrize("hook", ["_expert_action", "task_type"])
def test_a_hook_returning_no_str_is_named(hook):
    """An expert returning an int was written into demonstrations as "<action>8</action>" (or failed
    as the next step's "action must be a str", a step the user never called); a task type the same.
    Now a TypeError naming the hook at the info it went into, and the episode ends."""
    env = type("Eight", (ExpertRaises,), {hook: lambda self, *a: 8})(expert=True)
    with pytest.raises(TypeError) as e:
        env.reset(options={"task_id": "a"})
    assert str(e.value) == f"Eight.{hook} must return a str or None, got int (8)"
    with pytest.raises(EpisodeOverError):
        env.step("x")


def test_engine_steps_leave_out_refused_turns():
    """A fixed expert path indexed by the turn count skipped a gold action after a refused turn (one
    the engine never saw, e.g. 10,001 characters): `engine_steps` counts only the turns it saw."""
    env = type("Quiet", (ExpertRaises,), {"at": 99})()
    env.reset(options={"task_id": "a"})
    env.step("x")
    obs, *_, info = env.step("x" * 10_001)
    assert "invalid_action" in info
    env.step("x")
    assert (env.num_steps, env.engine_steps, env.engine_calls) == (3, 2, 2)
    env.reset(options={"task_id": "a"})
    assert (env.num_steps, env.engine_steps) == (0, 0)


@pytest.mark.parametrize("kwargs, said", [
    ({"max_steps": 0}, "max_steps must be an int >= 1 (or None for the default), got int (0)"),
    ({"max_steps": -2}, "max_steps must be an int >= 1 (or None for the default), got int (-2)"),
    ({"max_steps": 2.7}, "max_steps must be an int >= 1 (or None for the default), got float (2.7)"),
    ({"max_steps": True}, "max_steps must be an int >= 1 (or None for the default), got bool (True)"),
    ({"expert": "no"}, "expert must be a bool (True: info['expert_action'] holds the expert's next action), "
                       "got str ('no')"),
    ({"expert": 1}, "expert must be a bool (True: info['expert_action'] holds the expert's next action), "
                    "got int (1)"),
    ({"split": ""}, "unknown split '' for Good; valid: ['train', 'test']"),
])
def test_bad_constructor_arguments_are_refused_by_name(kwargs, said):
    """max_steps=0 became the default cap, -2 truncated the first step, 2.7 became 2; expert="no" was
    True; split="" the first split."""
    with pytest.raises(ValueError) as e:
        Good(**kwargs)
    assert str(e.value) == said


def test_good_constructor_arguments_still_pass():
    import numpy as np

    assert Good().max_steps == Good.default_max_steps and Good(max_steps=None).max_steps == Good.default_max_steps
    assert Good(max_steps=1).max_steps == 1 and Good(max_steps=np.int64(7)).max_steps == 7
    assert Good(expert=np.bool_(True)).expert is True and Good(split=None).split == "train"


def test_an_empty_split_option_is_refused_not_read_as_the_default():
    env = Good(split="test")
    with pytest.raises(ValueError) as e:
        env.reset(options={"split": ""})
    assert str(e.value) == "unknown split '' for Good; valid: ['train', 'test']"
    with pytest.raises(ValueError, match="unknown split ''"):
        env.list_tasks("")
    assert env.reset(options={"split": None})[1]["split"] == "test"   # None still means env.split
    assert env.list_tasks() == ["a", "b"]


_GOOD_MODULE = """from agentq.envs import TaskStep, TextEnv


class GoodEnv(TextEnv):
    splits = ("train", "test")

    def _tasks(self, split):
        return ["a", "b"]

    def _reset_task(self, task_id, split):
        self.engine_calls = 0
        return "goal", TaskStep(obs="start")

    def _step_task(self, action):
        self.engine_calls += 1
        return TaskStep(obs=f"ok {self.engine_calls}")
"""


@pytest.mark.parametrize("how", ["module:Class", "registered id"])
def test_steps_work_after_a_first_reset_that_raised(how, tmp_path, monkeypatch):
    """Gymnasium 1.4's passive env checker (a wrapper gym.make adds) kept None as the data of a first
    reset that raised (an unknown task id, say): after a good reset every step raised "cannot unpack
    non-iterable NoneType object", with the engine stepped each time. agentq's make leaves that
    checker out, for ids registered elsewhere too (its own registrations:
    tests/envs/test_textworld_express.py)."""
    import gymnasium as gym

    import agentq.envs as envs

    name = f"good_mod_{how.split()[0].replace(':', '_')}"
    (tmp_path / f"{name}.py").write_text(_GOOD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    if how == "module:Class":
        env = envs.make(f"{name}:GoodEnv")
    else:
        gym_id = f"test/{name}-v0"
        gym.register(id=gym_id, entry_point=f"{name}:GoodEnv")          # Gymnasium's default: checker on
        try:
            env = envs.make(gym_id)
        finally:
            gym.registry.pop(gym_id, None)
    with pytest.raises(UnknownTaskError):
        env.reset(options={"task_id": "nope"})
    env.reset(options={"task_id": "a"})
    assert [env.step("x")[0] for _ in range(2)] == ["ok 1", "ok 2"]
    env.close()


@pytest.mark.parametrize("bad", [
    dict(options={"task_id": "zz"}), dict(options={"colour": "red"}), dict(options={"split": "dev"}),
    dict(options={"task_id": 3}),
], ids=["unknown-task", "unknown-option", "unknown-split", "task-not-str"])
def test_a_refused_reset_changes_nothing(bad):
    """A reset refused for its arguments was checked partly after the env reseeded its generator: a
    refused `reset(seed=7, options={"colour": ...})` left the generator reseeded. Now nothing changes
    before every argument is checked: the running episode goes on and the next plain reset samples
    the task it would have sampled."""
    twin, env = Good(), Good()
    for e in (twin, env):
        e.reset(seed=3)
        e.step("x")
    with pytest.raises((TypeError, ValueError, KeyError)):
        env.reset(**{"seed": 7, **bad})
    assert env.step("y")[0] == "ok"                       # the episode before it goes on (as it did before)
    assert env.reset()[1]["task_id"] == twin.reset()[1]["task_id"]
    assert [env.reset()[1]["task_id"] for _ in range(8)] == [twin.reset()[1]["task_id"] for _ in range(8)]
