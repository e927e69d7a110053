"""TextWorldExpress (Jansen & Côté, 2022) as an agentq `TextEnv`.

Fast (sub-millisecond steps), offline, with gold paths: the CI workhorse and the template to
copy when adding an environment. A task id is "<game>/<seed>"; splits are the game's own
folds (train / dev / test seed ranges), so held-out seeds never appear in training.
"""
from __future__ import annotations

from typing import ClassVar

from .base import TaskStep, TextEnv

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")


class TextWorldExpressEnv(TextEnv):
    splits: ClassVar[tuple[str, ...]] = ("train", "dev", "test")
    default_max_steps: ClassVar[int] = 50

    def __init__(self, games: str | list[str] = ("coin",), game_params: dict[str, str] | None = None,
                 tasks_per_game: int | None = None, **kwargs):
        """
        games: one or several of GAMES; tasks of all of them are listed, interleaved by seed.
        game_params: per game, TextWorldExpress's gameParams string, e.g.
            {"coin": "numLocations=2,includeDoors=0,numDistractorItems=0"}.
        tasks_per_game: keep only the first N seeds of each fold (None = all 1,000).
        """
        super().__init__(**kwargs)
        games = [games] if isinstance(games, str) else list(games)
        bad = [g for g in games if g not in GAMES]
        if bad:
            raise ValueError(f"unknown TextWorldExpress game(s) {bad}; valid: {list(GAMES)}")
        self.games = games
        self.game_params = {g: (game_params or {}).get(g, "") for g in games}
        self.tasks_per_game = tasks_per_game
        self._env = None
        self._gold: list[str] = []

    def _engine(self):
        if self._env is None:
            from textworld_express import TextWorldExpressEnv as _TWX
            # The engine's own limit is set far above ours: the base class owns the step cap.
            self._env = _TWX(envStepLimit=10_000)
        return self._env

    def _tasks(self, split: str) -> list[str]:
        env = self._engine()
        # Seeds per fold are the same for every game; the engine wants a reset before queries.
        env.reset(seed=0, gameFold="train", gameName=self.games[0], gameParams=self.game_params[self.games[0]])
        seeds = {"train": env.getValidSeedsTrain, "dev": env.getValidSeedsDev, "test": env.getValidSeedsTest}[split]()
        if self.tasks_per_game is not None:
            seeds = seeds[: self.tasks_per_game]
        return [f"{g}/{s}" for s in seeds for g in self.games]

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        game, seed = task_id.rsplit("/", 1)
        env = self._engine()
        obs, info = env.reset(seed=int(seed), gameFold=split, gameName=game, gameParams=self.game_params[game],
                              generateGoldPath=self.expert)
        self._gold = list(env.getGoldActionSequence()) if self.expert else []
        self._score = 0.0
        return info["taskDescription"], self._to_step(obs, info, game=game)

    def _step_task(self, action: str) -> TaskStep:
        obs, _, _, info = self._engine().step(action.strip().lower())
        return self._to_step(obs, info, game=self._task_id.rsplit("/", 1)[0])

    def _to_step(self, obs: str, info: dict, game: str) -> TaskStep:
        score = max(0.0, float(info["score"]))
        reward, self._score = score - self._score, score
        won, failed = bool(info["tasksuccess"]), bool(info["taskfailure"])
        return TaskStep(obs=obs.strip(), reward=reward, done=won or failed, won=won, score=score,
                        admissible_actions=sorted(info["validActions"]), extra={"task_type": game})

    def _expert_action(self) -> str | None:
        # The gold path is a fixed sequence: correct as long as the agent followed it.
        i = self._steps
        return self._gold[i] if i < len(self._gold) else None

    def close(self):
        if self._env is not None:
            self._env.close()
            self._env = None
