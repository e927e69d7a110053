"""ALFWorld (Shridhar et al., 2021) as an agentq `TextEnv`: `gymnasium.make("agentq/ALFWorld-v0")`.

Games play on ALFWorld's own text engine: textworld's `PddlEnv` wrapped in ALFWorld's
`AlfredDemangler` (object names "cabinet 1") and `AlfredInfos`, with the alfworld 0.4.2 wheel's
domain and grammar everywhere ("move X to Y", `help`). Splits:

* `gen_train`, `gen_seen`, `gen_unseen`: generated games (`generator.py`), written on first use
  into `cache_dir`; `gen_unseen` holds out ALFRED's unseen rooms. Offline; `gen_train` is the
  default and the only split meant for training.
* `valid_seen`, `valid_unseen`, `valid_train`, `train`: real games under
  `$ALFWORLD_DATA/json_2.1.1/<split>` (`data.py`). Evaluation only (except `train`).

Reward `reward_scale` on the step that wins, 0 otherwise; `terminated` on a win (the engine never
reports a loss); `info["won"]` is the engine's goal check. Invalid commands are ordinary turns
("Nothing happens."). `expert=True` adds `info["expert_action"]`: ALFWorld's handcoded expert on
real games, a planner walkthrough on generated ones (`expert_type` overrides).

One engine per env instance is kept across resets: resetting the game already loaded skips the
load, and the PDDL translation memo (`parse_cache.py`, installed on import) makes resetting any
recently played game cheap.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from ..base import EnvCrashedError, TaskStep, TextEnv
from . import generator as gen
from . import interning, parse_cache
from .data import REAL_SPLITS, data_root, list_real_games, load_real_game, split_dir, task_type_of
from .experts import HandcodedExpert, PlannerExpert

if os.environ.get("AGENTQ_ALFWORLD_PARSE_CACHE", "1") != "0":
    parse_cache.install()

EXPERT_TYPES = ("auto", "handcoded", "planner")
_TASK_RE = re.compile(r"Your task is to: (.*)")


def _normalize(command: str) -> str:
    """Commands are lower-case words separated by single spaces, as the engine lists them."""
    return " ".join(command.strip().lower().split())


class ALFWorldEnv(TextEnv):
    splits: ClassVar[tuple[str, ...]] = gen.GEN_SPLITS + REAL_SPLITS
    default_max_steps: ClassVar[int] = 50

    def __init__(self, data_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                 gen_sizes: Mapping[str, int] | int | None = None, task_types: Sequence[str] | None = None,
                 reward_scale: float = 1.0, expert_type: str = "auto", **kwargs):
        """
        data_dir: folder holding `json_2.1.1/` (default $ALFWORLD_DATA, else ~/.cache/alfworld).
        cache_dir: where generated games and planner walkthroughs are stored (default
            $AGENTQ_ALFWORLD_CACHE, else ~/.cache/agentq/alfworld).
        gen_sizes: games per task type in each generated split, an int or e.g. {"gen_train": 1000}
            (defaults: gen_train 500, gen_seen 25, gen_unseen 25, i.e. 3,000/150/150 games).
        task_types: keep only these task types (default: all six) in every split.
        reward_scale: reward of a win.
        expert_type: "auto" (handcoded on real games, planner on generated), "handcoded" or "planner".
        """
        super().__init__(**kwargs)
        self.data_dir = data_dir
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else gen.default_cache_dir()
        self.gen_sizes = gen.gen_sizes(gen_sizes)
        if task_types is None:
            task_types = gen.TASK_TYPES
        elif isinstance(task_types, str):
            task_types = [task_types]
        if not task_types:      # [] kept every type, as null does: almost surely not what was meant
            raise ValueError(f"task_types is empty; give null (all six) or some of {list(gen.TASK_TYPES)}")
        self.task_types = tuple(gen.check_task_type(t) for t in task_types)
        if isinstance(reward_scale, bool) or not isinstance(reward_scale, (int, float)) or not 0 < reward_scale < math.inf:
            raise ValueError(f"reward_scale must be a positive finite number (the reward of a win; verl-agent uses 10), "
                             f"got {reward_scale!r}")
        self.reward_scale = float(reward_scale)
        if expert_type not in EXPERT_TYPES:
            raise ValueError(f"unknown expert_type {expert_type!r}; valid: {list(EXPERT_TYPES)}")
        self.expert_type = expert_type
        if self.split in REAL_SPLITS:
            split_dir(self.split, data_dir)        # fail at construction, with how to get the data
        self._env: Any = None                      # AlfredInfos(AlfredDemangler(PddlEnv))
        self._pddl: Any = None                     # the PddlEnv inside
        self._loaded: tuple[str, str] | None = None
        self._game: dict | None = {}
        self._traj: dict = {}
        self._folder: Path | None = None
        self._state: Any = None                    # the engine's last state (a textworld GameState)
        self._expert: HandcodedExpert | PlannerExpert | None = None
        self._planner: PlannerExpert | None = None

    @classmethod
    def resolved_kwargs(cls, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """data_dir as an absolute folder: the one given, or `$ALFWORLD_DATA`'s behind a None; {} for
        alfworld's default folder (where `alfworld-download` writes), which a None keeps meaning."""
        given = kwargs.get("data_dir")
        if given is not None and not isinstance(given, (str, os.PathLike)):
            return {}                   # the constructor refuses it, saying why
        root, source = data_root(given)
        return {"data_dir": str(root.absolute())} if given or source == "$ALFWORLD_DATA" else {}

    def data_folder(self, split: str) -> str | None:
        """A real split's game folder (`json_2.1.1/<split>` under data_dir, $ALFWORLD_DATA or
        alfworld's default ~/.cache/alfworld, which env.kwargs leaves unnamed); None for a generated
        split, which reads no files."""
        if split in gen.GEN_SPLITS:
            return None
        return str(split_dir(split, self.data_dir).absolute())

    # ------------------------------------------------------------------ engine
    def _engine(self):
        if self._env is None:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
            from textworld.envs.pddl import PddlEnv
            # the handcoded expert reads the state's facts; nothing else needs them
            infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"],
                                       facts=self.expert and self.expert_type != "planner")
            self._pddl = PddlEnv(infos)
            self._env = AlfredInfos(AlfredDemangler(self._pddl, shuffle=False))
            self._loaded = None
        return self._env

    def _drop_engine(self):
        self._env = self._pddl = self._loaded = self._state = None

    # ------------------------------------------------------------------ TextEnv hooks
    def _tasks(self, split: str) -> list[str]:
        if split in gen.GEN_SPLITS:
            return [t for t in gen.list_gen_tasks(split, self.gen_sizes[split]) if t.split("/", 1)[0] in self.task_types]
        return list_real_games(split, self.data_dir, self.task_types)

    def task_type(self, task_id: str) -> str:
        return task_id.split("/", 1)[0] if "/FloorPlan" in task_id else task_type_of(task_id)

    def _load(self, task_id: str, split: str) -> tuple[Path, dict | None, dict]:
        if split in gen.GEN_SPLITS:
            path = gen.ensure_game(self.cache_dir, task_id)
            return path.parent, json.loads(path.read_text()), json.loads((path.parent / "traj_data.json").read_text())
        return load_real_game(split, task_id, self.data_dir)

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        try:
            env = self._engine()
            if self._loaded != (split, task_id):
                self._loaded = None
                interning.forget_interned()          # the last game's logic objects (else ~0.85 MB a game, kept)
                self._folder, self._game, self._traj = self._load(task_id, split)
                env.load(self._game)
                self._loaded = (split, task_id)
            self._state = env.reset()
        except (OSError, ValueError):
            raise
        except Exception as e:     # the engine itself failed: start a fresh one next time
            self._drop_engine()
            raise EnvCrashedError(f"ALFWorld engine failed to reset {split}:{task_id}: {e!r}") from e
        m = _TASK_RE.search(self._state.feedback)
        goal = m.group(1).strip() if m else ""
        step = self._to_step(self._state, task_id)
        if self.expert:
            self._start_expert(task_id, split)
        return goal, step

    def _step_task(self, action: str) -> TaskStep:
        command = _normalize(action)
        try:
            self._state, _, _ = self._env.step(command)
        except Exception as e:
            self._drop_engine()
            raise EnvCrashedError(f"ALFWorld engine failed on {command!r} in {self._task_id}: {e!r}") from e
        self._last_command = command
        assert self._task_id is not None                  # step() checks an episode is running
        return self._to_step(self._state, self._task_id)

    def _to_step(self, state, task_id: str) -> TaskStep:
        won = bool(state["won"])
        return TaskStep(obs=state.feedback, reward=self.reward_scale if won else 0.0, done=won, won=won,
                        score=1.0 if won else 0.0, admissible_actions=list(state["admissible_commands"]),
                        extra={"task_type": self.task_type(task_id)})

    # ------------------------------------------------------------------ experts
    def _expert_kind(self, split: str) -> str:
        if self.expert_type != "auto":
            return self.expert_type
        return "planner" if split in gen.GEN_SPLITS else "handcoded"

    def _start_expert(self, task_id: str, split: str) -> None:
        self._last_command = ""
        if self._expert_kind(split) == "handcoded":
            self._expert = HandcodedExpert(seed=gen.stable_seed("expert", task_id))
            assert self._folder is not None               # _reset_task loaded the game first
            self._next_expert = self._expert.reset(self._folder, self._state)
        else:
            if self._planner is None:
                self._planner = PlannerExpert(self.cache_dir)
            self._expert = self._planner
            assert self._game is not None                 # the planner reads the game document
            self._next_expert = self._planner.reset(self._pddl, self._game, self._traj["task_type"],
                                                    self._traj["pddl_params"], self._state)
        self._expert_at = 0

    def _expert_action(self) -> str | None:
        # advance the expert once per engine step, on demand (a turn the base class refused never
        # reached the engine: the expert's action stands, and it is not fed a stale last command)
        if self._expert_at != self._engine_steps:
            self._expert_at = self._engine_steps
            if isinstance(self._expert, HandcodedExpert):
                self._next_expert = self._expert.next_action(self._state, self._last_command)
            else:
                assert self._expert is not None           # _start_expert ran at reset
                self._next_expert = self._expert.next_action(self._pddl, self._state, self._last_command)
        return self._next_expert

    # ------------------------------------------------------------------ misc
    def close(self):
        # The engine's copy of the Fast Downward library stays mapped: dlclose()-ing it
        # (fast_downward.close_lib) was seen to crash the interpreter at exit.
        self._drop_engine()
        self._game, self._traj, self._expert = {}, {}, None
        if self._planner is not None:
            self._planner.close()
            self._planner = None
