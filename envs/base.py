"""The text-environment contract every agentq environment implements.

A `TextEnv` is a Gymnasium `Env` whose observations and actions are strings:

    obs, info = env.reset(seed=0, options={"task_id": ..., "split": ...})
    obs, reward, terminated, truncated, info = env.step("take coin")

* `terminated` is True only when the task itself ended (won or failed);
  `truncated` is True when the step cap ran out first. A capped episode is never a win.
* `info` always carries `task` (goal text), `task_id`, `split`, `admissible_actions`
  (list of strings or None), `won` (bool) and `score` (float in [0, 1] unless the env says
  otherwise), plus `expert_action` when the env was made with `expert=True`.
* `list_tasks(split)` returns the split's task ids, stable across runs and machines.
* `options={"split": s}` sets that episode's split only (`info["split"]`); a reset without it
  (or with `"split": None`) samples the split the env was made with (`env.split`), whatever earlier
  episodes used. A split that is not one of `splits` ("" included) is a ValueError.
* An action the engines must not see (lone surrogates, i.e. text that was not valid UTF-8;
  control characters other than tab/newline; longer than `action_space.max_length`) never reaches
  the engine: the turn counts, the observation says why it was refused, reward 0, and
  `info["invalid_action"]` holds the reason.
* Documented exceptions (nothing else escapes `reset`/`step`, but for what an env's own
  `_reset_task`/`_step_task` raise, which passes through as is: see that env's documentation):
  `TypeError` (an action that is not a str, options that are not a dict, a non-str task id or
  split, a seed that is not an int),
  `ValueError` (unknown option or split, a negative seed), `UnknownTaskError` (a task id not in
  the split), `EpisodeOverError` (`step` on a finished episode, or before the first `reset` of an
  env class built directly; an env from `gymnasium.make` or `agentq.envs.make` raises Gymnasium's
  `gymnasium.error.ResetNeeded` there, from the order-enforcing wrapper `gymnasium.make` adds),
  `EnvClosedError` (`step` after `close()`) and `EnvCrashedError` (the engine died mid-episode). The
  last three are `RuntimeError`s; and `TypeError` for a hook that returned the wrong type, or a
  `TaskStep` with a field of the wrong type (an env bug, named with the hook), `ValueError` for a
  split whose `_tasks` is empty or repeats an id. `_expert_action` or `task_type` raising while the
  info is built (an env bug) is an `EnvCrashedError` naming the hook, chained to the original exception.
  A `step` (or `reset`) that raises ends the episode: the next `step` raises `EpisodeOverError`
  until a `reset`. A `reset` refused for its arguments (TypeError, ValueError, UnknownTaskError:
  checked before anything changes) is not one that raised there: the episode before it, if any, goes
  on, and the env's random generator is not reseeded.
* Constructor arguments: `split` one of `splits` (None: the first), `max_steps` an int >= 1 (None:
  `default_max_steps`), `expert` a bool; anything else is a ValueError naming the argument. agentq
  builds one instance per split before its model (to refuse bad arguments or missing data early), so
  a constructor checks data and stays cheap; engines start on the first `reset`.

* `resolved_kwargs(kwargs)` (a classmethod): constructor arguments the env would otherwise take from
  outside its arguments, i.e. an environment variable read when the argument is None, or a folder
  given relative to the working directory, as the values it would use now. agentq writes them into
  `env.kwargs` when it composes a config, so a run's config.yaml and an evaluation's folder name and
  eval.json say which data were played.
* `data_folder(split)`: the folder a split's tasks are read from (an env that reads data from a
  default folder names it, so a stopped evaluation notices a re-download there).

Subclasses implement three hooks (`_tasks`, `_reset_task`, `_step_task`) and, for experts,
`_expert_action`; the base class owns splits, task selection, the step cap and the `info`
keys, so every environment behaves the same at the edges. An expert that follows a fixed path
indexes it by `engine_steps` (the turns the engine saw), not `num_steps`: a refused turn
(`info["invalid_action"]`) leaves the game, and so the expert's next action, unchanged.
"""
from __future__ import annotations

import copy
import math
import numbers
import string
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

INFO_KEYS = ("task", "task_id", "split", "admissible_actions", "won", "score")
#: what `TextSpace.sample()` draws from: printable ASCII that `action_problem` accepts
SAMPLE_CHARSET = "".join(c for c in string.printable if c not in "\x0b\x0c")


class TextSpace(spaces.Text):
    """`spaces.Text` that admits any Unicode string up to `max_length` characters.

    Gymnasium's Text space checks every character against a fixed charset; environment text
    (WebShop's "›", ScienceWorld's "°C") is open-ended, so membership only checks type and length.
    `sample()` still draws from printable ASCII, without the vertical tab and form feed that
    `string.printable` holds: `action_problem` refuses them, so a sampled action would be an invalid turn.
    """

    def __init__(self, max_length: int = 100_000):
        super().__init__(max_length=max_length, min_length=0, charset=SAMPLE_CHARSET)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"


@dataclass
class TaskStep:
    """What an environment engine reports after a reset or a step (subclass → base class)."""

    obs: str
    reward: float = 0.0
    done: bool = False          # the task ended (success or failure); never the step cap
    won: bool = False
    score: float = 0.0
    admissible_actions: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # merged into info (e.g. task_type)


class SplitRefused(ValueError):
    """A split the env cannot give: not one of its `splits`, or whose `_tasks` returned no task ids or
    a repeated one. (A ValueError `_tasks` raises itself is the env's own, perhaps a bug.)"""


class UnknownTaskError(KeyError):
    """reset() was given a task id that is not in the split."""

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument: the message would print inside quotes
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class EpisodeOverError(RuntimeError):
    """step() was called on a finished (or, on an env not made by gymnasium.make, never started)
    episode; call reset() first."""


class EnvClosedError(RuntimeError):
    """step() was called after close(); call reset() to start over."""


def action_problem(action: str, max_length: int) -> str | None:
    """Why `action` must not reach an engine (None: it may). Engines talk over sockets and pipes
    (py4j, JSON): a lone surrogate cannot be encoded (py4j then desynchronises and the JVM stops
    answering), control characters break line-based protocols, and huge strings are echoed back."""
    if len(action) > max_length:
        return f"the action is {len(action)} characters long (limit {max_length})"
    try:
        action.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"the action is not valid Unicode text ({e.reason} at position {e.start})"
    bad = next((c for c in action if (ord(c) < 32 and c not in "\t\n\r") or 127 <= ord(c) < 160), None)
    if bad is not None:
        return f"the action contains the control character {bad!r}"
    return None


class EnvCrashedError(RuntimeError):
    """The environment's engine died (e.g. its JVM or subprocess exited) mid-episode.

    Raised by `step()`/`reset()`; the episode in flight is lost and is reported as errored by the
    pool. The next `reset()` must bring the engine back up (restart it), so a crash costs one
    episode, never the run.
    """


class TextEnv(gym.Env[str, str]):
    """Base class of agentq's text environments (see the module docstring for the contract)."""

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}   # gymnasium declares it per instance
    action_space: TextSpace
    observation_space: TextSpace
    #: split names this environment offers; the first is the default training split.
    splits: ClassVar[tuple[str, ...]] = ("train", "dev", "test")
    #: default step cap (can be overridden per instance with `max_steps=`)
    default_max_steps: ClassVar[int] = 50
    #: whether a reset of every training task is cheap (milliseconds): an evaluation then lists their
    #: first prompts once and says which held-out tasks begin exactly as a training task does
    openings_listable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        # every subclass's close() marks the env closed, so step() after close() is one clear error
        # (not, e.g., an engine's "not initialized" text returned as an observation)
        super().__init_subclass__(**kwargs)
        if "close" in cls.__dict__:
            close = cls.__dict__["close"]

            def marked_close(self, _close=close):
                self._closed, self._done = True, True
                return _close(self)
            marked_close.__doc__, marked_close.__name__ = close.__doc__, "close"
            cls.close = marked_close

    def __init__(self, split: str | None = None, max_steps: int | None = None, expert: bool = False,
                 render_mode: str | None = None):
        self.observation_space = TextSpace()
        self.action_space = TextSpace(max_length=10_000)
        self.split = self._check_split(self.splits[0] if split is None else split)
        self.max_steps = self.default_max_steps if max_steps is None else positive_int("max_steps", max_steps)
        if not isinstance(expert, (bool, np.bool_)):
            raise ValueError(f"expert must be a bool (True: info['expert_action'] holds the expert's next action), "
                             f"got {type(expert).__name__} ({expert!r:.60})")
        self.expert = bool(expert)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self._task_cache: dict[str, list[str]] = {}
        self._task_id: str | None = None
        self._episode_split: str = self.split     # the split of the episode in flight (info["split"])
        self._task_text: str = ""
        self._steps = 0
        self._engine_steps = 0                    # the turns of this episode that reached `_step_task`
        self._done = True
        self._lost: str | None = None             # what raised and ended the last episode, if something did
        self._closed = False
        self._last_obs = ""
        self._last_step = TaskStep(obs="")

    # ------------------------------------------------------------------ hooks for subclasses
    def _tasks(self, split: str) -> list[str]:
        """Stable task ids of `split` (called once per split, then cached); str ids only, else a TypeError."""
        raise NotImplementedError

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        """Load `task_id`.

        Args:
            task_id: one of `_tasks(split)`'s ids.
            split: the episode's split.
        Returns:
            (goal text, first `TaskStep`); anything else is a TypeError naming this hook.
        """
        raise NotImplementedError

    def _step_task(self, action: str) -> TaskStep:
        """Play `action` in the engine.

        Args:
            action: the agent's action (valid Unicode, no control characters, within the length limit).
        Returns:
            A `TaskStep` (not Gymnasium's 5-tuple: the base class builds that); anything else is a TypeError.
        """
        raise NotImplementedError

    def _expert_action(self) -> str | None:
        """The next action of this environment's expert, or None when it has none."""
        return None

    def task_type(self, task_id: str) -> str | None:
        """The task type of `task_id` without loading it (held-out evals stratify by it), or None
        when the environment has no task types. It fills `info["task_type"]` unless a hook's
        `TaskStep.extra` sets that key (which must then agree with it)."""
        return None

    @classmethod
    def resolved_kwargs(cls, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments of `kwargs` that the env would take from outside them (an
        environment variable behind a None, a path relative to the working directory), as the
        values it would use in this process. Called on the class, before any env is built; it must
        not raise for arguments the constructor would refuse (the constructor says why).

        Args:
            kwargs: the constructor arguments agentq will pass (env.kwargs).
        Returns:
            {argument: value} to record in env.kwargs (plain JSON values); {} by default.
        """
        return {}

    def data_folder(self, split: str) -> str | None:
        """The folder whose files decide the tasks of `split`, for the fingerprint that lets a stopped
        `agentq eval` go on (`eval/partial.py`): a folder changed in place under the same path holds
        other games, and the finished episodes are then not taken.

        Args:
            split: one of `splits`.
        Returns:
            An absolute folder, or None: the env names none, and the evaluation fingerprints
            `env.kwargs.data_dir` where that is set (the default).
        """
        return None

    # ------------------------------------------------------------------ public API
    def list_tasks(self, split: str | None = None) -> list[str]:
        split = self._check_split(self.split if split is None else split)
        if split not in self._task_cache:
            tasks = list(self._tasks(split))
            bad = next((t for t in tasks if not isinstance(t, str)), None)
            if bad is not None:     # reset(options={"task_id": ...}) takes str ids only
                raise TypeError(f"{type(self).__name__}._tasks({split!r}) must return str task ids, got "
                                f"{type(bad).__name__} ({bad!r:.60})")
            # no tasks: training sampled from nothing (numpy's "high <= 0"), evaluation played 0 episodes;
            # a repeated id: evaluation played that task twice and paired tests over tasks mixed them
            if not tasks:
                raise SplitRefused(f"{type(self).__name__}._tasks({split!r}) returned no task ids; every split in "
                                 f"`splits` {list(self.splits)} needs at least one")
            if len(set(tasks)) < len(tasks):
                twice = next(t for t, n in Counter(tasks).items() if n > 1)
                raise SplitRefused(f"{type(self).__name__}._tasks({split!r}) returned the task id {twice!r} more than "
                                 "once; task ids must be unique within a split")
            self._task_cache[split] = tasks
        return self._task_cache[split]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset(options=...) must be a dict like {{'task_id': ..., 'split': ...}} or None, "
                            f"got {type(options).__name__}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"reset(seed=...) must be an int or None, got {type(seed).__name__}")
        if seed is not None:
            seed = int(seed)        # Gymnasium's seeding takes Python ints only (not np.int64)
            if seed < 0:
                raise ValueError(f"reset(seed=...) must be >= 0 or None, got {seed}")
        options = dict(options or {})
        unknown = [k for k in options if k not in ("task_id", "split")]
        if unknown:
            raise ValueError(f"unknown reset option(s) {unknown!r}; valid: ['split', 'task_id']")
        for key in ("task_id", "split"):
            if options.get(key) is not None and not isinstance(options[key], str):
                raise TypeError(f"reset option {key!r} must be a str, got {type(options[key]).__name__} "
                                f"({options[key]!r:.80})")
        # an episode's split is its own: `self.split` (the configured split) stays what plain resets
        # sample, so one held-out episode does not turn later training resets into held-out ones
        split = self._check_split(self.split if options.get("split") is None else options["split"])
        task_id = options.get("task_id")
        tasks = self.list_tasks(split)         # refuses an empty split
        if task_id is not None and task_id not in self._task_set(split):
            raise UnknownTaskError(
                f"unknown task_id {task_id!r} for split {split!r} of {type(self).__name__} "
                f"({len(tasks)} tasks, e.g. {tasks[:3]}); see env.unwrapped.list_tasks({split!r})")
        super().reset(seed=seed)               # the arguments are good: from here the reset counts
        if task_id is None:
            task_id = tasks[int(self.np_random.integers(len(tasks)))]
        self._done, self._lost = True, None   # a reset that raises leaves the env needing another reset
        self._closed = False
        self._episode_split, self._task_id, self._steps, self._engine_steps = split, task_id, 0, 0
        try:
            self._task_text, first = _checked_reset(self, self._reset_task(task_id, split))
            self._last_obs, self._last_step = first.obs, first
            info = self._info(first, done=False)
        except BaseException as e:
            self._lost = f"its reset raised {type(e).__name__}"
            raise
        self._done = False
        return first.obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._closed:
            raise EnvClosedError(f"step() called after close() on {type(self).__name__}; call reset() to start over")
        if self._done:
            lost = f" (lost: {self._lost})" if self._lost else ""
            raise EpisodeOverError(f"step() called on a finished episode{lost}; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        self._steps += 1
        problem = action_problem(action, self.action_space.max_length)
        # a step that raises (e.g. EnvCrashedError, or an expert that fails while the info is built)
        # loses the episode: the engine's state is unknown, so the next step must not reach it (a
        # restarted engine would answer it as if the game were running); only a reset starts over
        self._done, self._lost = True, None
        try:
            if problem is None:
                self._engine_steps += 1
                res = self._last_step = _checked_step(self, self._step_task(action))
            else:           # a handled turn: the engine never sees it, the state is unchanged
                last = self._last_step
                # copies: infos returned to the caller never share objects (Gymnasium's check_env)
                res = TaskStep(obs=f"Invalid action: {problem}.", won=last.won, score=last.score,
                               admissible_actions=copy.deepcopy(last.admissible_actions),
                               extra={**copy.deepcopy(last.extra), "invalid_action": problem})
            terminated = bool(res.done)
            truncated = not terminated and self._steps >= self.max_steps
            self._last_obs = res.obs
            info = self._info(res, done=terminated or truncated)
        except BaseException as e:
            self._lost = f"its last step raised {type(e).__name__}"
            raise
        self._done = terminated or truncated
        return res.obs, float(res.reward), terminated, truncated, info

    def close(self) -> None:
        """Release the engine (subclasses override; every close() marks the env closed)."""
        self._closed, self._done = True, True

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    @property
    def task_id(self) -> str | None:
        return self._task_id

    @property
    def num_steps(self) -> int:
        """The turns of this episode, refused ones (`info["invalid_action"]`) included."""
        return self._steps

    @property
    def engine_steps(self) -> int:
        """The turns of this episode that reached the engine (`_step_task`): what an expert that
        follows a fixed path indexes it by."""
        return self._engine_steps

    # ------------------------------------------------------------------ internals
    def _task_set(self, split: str) -> set[str]:
        key = f"__set__{split}"
        if key not in self._task_cache:
            self._task_cache[key] = set(self.list_tasks(split))  # type: ignore[assignment]
        return self._task_cache[key]  # type: ignore[return-value]

    def _check_split(self, split: str) -> str:
        if split not in self.splits:
            raise SplitRefused(f"unknown split {split!r} for {type(self).__name__}; valid: {list(self.splits)}")
        return split

    def _info(self, res: TaskStep, done: bool) -> dict:
        """The info of `res`; `done`: the episode ends with it (no expert action then)."""
        info = dict(res.extra)
        if "task_type" not in info and self._task_id is not None:
            task_id = self._task_id                  # unless the env's TaskStep.extra sets it
            kind = _hook_call(self, "task_type", lambda: self.task_type(task_id))
            if kind is not None:
                info["task_type"] = _returned_str_or_none(self, "task_type", kind)
        info.update(task=self._task_text, task_id=self._task_id, split=self._episode_split,
                    admissible_actions=res.admissible_actions, won=bool(res.won),
                    score=float(res.score), steps=self._steps)
        if self.expert:
            info["expert_action"] = None if done else _returned_str_or_none(
                self, "_expert_action", _hook_call(self, "_expert_action", self._expert_action))
        return info


def _returned_str_or_none(env: TextEnv, hook: str, value: Any) -> str | None:
    """`value`, what `hook` returned, if a str or None; else a TypeError naming the hook (an expert's
    int was written as the action "<action>8</action>" into demonstrations, or failed in a later step)."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{type(env).__name__}.{hook} must return a str or None, got {type(value).__name__} "
                    f"({value!r:.60})")


def _hook_call(env: TextEnv, hook: str, fn: Callable[[], Any]) -> Any:
    """`fn()`, a call of `env`'s `hook` while an info is built; an exception it raises becomes an
    EnvCrashedError naming the hook (a documented exception: the pool reports the episode as errored),
    chained to the original. An EnvCrashedError (an expert whose engine died) passes as it is."""
    try:
        return fn()
    except EnvCrashedError:
        raise
    except Exception as e:
        raise EnvCrashedError(f"{type(env).__name__}.{hook} raised {type(e).__name__}: {e}; the episode is lost "
                              "(an env bug; reset() starts a new one)") from e


def positive_int(name: str, value: Any, none_means: str = "the default") -> int:
    """`value` (a constructor argument) as an int >= 1, else a ValueError naming the argument (a
    max_steps of 2.7 was 2, 0 the default, -2 a cap that truncated the first step)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 (or None for {none_means}), got {type(value).__name__} "
                         f"({value!r:.60})")
    return int(value)


def positive_number(name: str, value: Any) -> float:
    """`value` (a constructor argument) as a finite float > 0, else a ValueError naming the argument
    (a call_timeout_s of 0 or -1 timed the JVM's start out at once at the first reset; inf overflowed
    a socket timeout)."""
    if isinstance(value, (bool, np.bool_)) or not _finite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {type(value).__name__} ({value!r:.60})")
    return float(value)


def _checked_reset(env: TextEnv, result: Any) -> tuple[str, TaskStep]:
    """`_reset_task`'s result, or a TypeError naming the hook (not an AttributeError deep in `reset`).

    Args:
        env: the environment whose hook returned `result` (named in the error).
        result: what `_reset_task` returned.
    Returns:
        (goal text, first step).
    """
    if (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], str)
            and isinstance(result[1], TaskStep)):
        _check_fields(env, "_reset_task", result[1])
        return result[0], result[1]
    raise TypeError(f"{type(env).__name__}._reset_task must return (goal: str, TaskStep(obs=...)), got "
                    f"{returned_types(result)}")


def returned_types(value: Any) -> str:
    """What a method returned, as its refusal says it: a tuple's or list's item types ("(str, TaskStep,
    int)": the slip is in the arity or an item), else the value's type ("str").

    Args:
        value: what the method returned.
    Returns:
        the type names.
    """
    if isinstance(value, (tuple, list)):
        return f"({', '.join(type(x).__name__ for x in value)})"
    return type(value).__name__


def _checked_step(env: TextEnv, result: Any) -> TaskStep:
    """`_step_task`'s result, or a TypeError naming the hook (a Gymnasium 5-tuple is a common slip).

    Args:
        env: the environment whose hook returned `result` (named in the error).
        result: what `_step_task` returned.
    Returns:
        The step.
    """
    if isinstance(result, TaskStep):
        _check_fields(env, "_step_task", result)
        return result
    got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
    raise TypeError(f"{type(env).__name__}._step_task must return a TaskStep(obs=..., reward=..., done=..., "
                    f"won=...), got {got}")


def _check_fields(env: TextEnv, hook: str, step: TaskStep) -> None:
    """A TypeError naming the hook and the field when `step` holds what the agent loop cannot use: an
    obs that is not a str (it crashed the trainer's process, not the episode), a reward or score that
    is not a finite number, admissible actions that are not a list of str (a str was shown and
    compared one character at a time), an `extra` that is not a dict."""
    acts = step.admissible_actions
    acts_ok = acts is None or (isinstance(acts, (list, tuple)) and all(isinstance(a, str) for a in acts))
    problems = {
        "obs": None if isinstance(step.obs, str) else "a str",
        "reward": None if _finite(step.reward) else "a finite number",
        "score": None if _finite(step.score) else "a finite number",
        "admissible_actions": None if acts_ok else "None or a list of str",
        "extra": None if isinstance(step.extra, Mapping) else "a dict",
    }
    for name, want in problems.items():
        if want is not None:
            value = getattr(step, name)
            raise TypeError(f"{type(env).__name__}.{hook} returned a TaskStep whose {name} is "
                            f"{type(value).__name__} ({value!r:.60}); it must be {want}")


def _finite(x: Any) -> bool:
    return isinstance(x, numbers.Real) and math.isfinite(x)


def sample_tasks(tasks: Sequence[str], n: int, rng) -> list[str]:
    """n task ids drawn without replacement while possible (then with), from a numpy Generator."""
    if n <= len(tasks):
        return [tasks[i] for i in rng.choice(len(tasks), size=n, replace=False)]
    return [tasks[i] for i in rng.integers(len(tasks), size=n)]
