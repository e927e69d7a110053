"""Experts for ALFWorld: ALFWorld's handcoded agent, and a planner walkthrough.

* `HandcodedExpert` drives `alfworld.agents.expert.HandCodedTWAgent` the way ALFWorld's own
  `AlfredExpert` wrapper does (first action "look"; an action that is not admissible becomes
  "look"), with its random tie-breaks drawn from a generator seeded per task, so a task's expert
  trajectory is reproducible. It explores like a person and solves most real games.
* `PlannerExpert` follows a Fast Downward plan. The plan is computed on a *reduced* copy of the
  current state that keeps only what the task is about (the target and lamp objects, the
  receptacles holding them, receptacles of the goal class, the task's appliance, anything in hand)
  so the optimal search takes a fraction of a second where the full problem can take many minutes
  (pick_two_obj_and_place/FloorPlan8/0: unfinished after 15 min → 0.09 s). Object names come from the full game, so the plan's
  commands are the game's commands; the environment's own checks (admissible, won) verify it.
  The walkthrough from the initial state is cached on disk (keyed by the game's PDDL), and the
  expert replans from the current state when the agent leaves the plan.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .parse_cache import ONE_OFF_PROBLEM

_APPLIANCES = {"pick_clean_then_place_in_recep": "sinkbasintype", "pick_heat_then_place_in_recep": "microwavetype",
               "pick_cool_then_place_in_recep": "fridgetype"}
# Commands that never change the state: after one of them the plan still holds.
_NO_EFFECT_PREFIXES = ("look", "inventory", "examine", "help")


@contextmanager
def _random_state(rng: random.Random):
    """Run a block with the `random` module's global state taken from (and given back to) `rng`."""
    saved = random.getstate()
    random.setstate(rng.getstate())
    try:
        yield
    finally:
        rng.setstate(random.getstate())
        random.setstate(saved)


class HandcodedExpert:
    """ALFWorld's handcoded expert (needs the game's traj_data.json and the `facts` state info)."""

    name = "handcoded"

    def __init__(self, seed: int, max_steps: int = 200):
        self.seed, self.max_steps = seed, max_steps
        self._agent: Any = None      # alfworld's HandCodedTWAgent, built per episode
        self._rng = random.Random(seed)

    def reset(self, game_folder: Path, state) -> str | None:
        from alfworld.agents.expert import HandCodedTWAgent
        self._rng = random.Random(self.seed)
        self._agent = HandCodedTWAgent(max_steps=self.max_steps)
        self._agent.reset(str(Path(game_folder) / "game.tw-pddl"))   # reads traj_data.json beside it
        self._agent.observe(state["feedback"])
        return "look"

    def next_action(self, state, last_command: str) -> str | None:
        from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout
        try:
            with _random_state(self._rng):
                action = self._agent.act(state, 0, state["won"], last_command)
        except (HandCodedAgentFailed, HandCodedAgentTimeout):
            return None
        return action if action in state["admissible_commands"] else "look"


def _reduced_problem(pddl_state, goal: str, task_type: str, params: dict) -> str:
    """The current state as a PDDL problem, keeping only the objects the task needs."""
    facts = [f for f in pddl_state.facts if not f.name.startswith("new-axiom")]
    otype = {f.arguments[0].name: f.arguments[1].name for f in facts if f.name == "objecttype"}
    rtype = {f.arguments[0].name: f.arguments[1].name for f in facts if f.name == "receptacletype"}
    want_o = {params[k].lower() + "type" for k in ("object_target", "toggle_target") if params.get(k)}
    want_r = {params[k].lower() + "type" for k in ("parent_target",) if params.get(k)}
    want_r |= {_APPLIANCES[task_type]} if task_type in _APPLIANCES else set()
    keep = {o for o, t in otype.items() if t in want_o}
    held = {f.arguments[1].name for f in facts if f.name == "holds"}
    for o in held - keep:   # something else in hand must be put down first: keep where it may go
        keep.add(o)
        can = {(f.arguments[0].name, f.arguments[1].name) for f in facts if f.name == "cancontain"}
        keep |= {r for r, t in rtype.items() if (t, otype.get(o)) in can}
    keep |= {r for r, t in rtype.items() if t in want_r}
    keep |= {f.arguments[1].name for f in facts if f.name == "inreceptacle" and f.arguments[0].name in keep}
    entity_types = {"object", "receptacle"}

    def kept(name: str, type_: str) -> bool:
        return type_ not in entity_types or name in keep

    objects = [f"{o.name} - {o.type_name}" for o in pddl_state.task.objects if kept(o.name, o.type_name)]
    init = sorted("({} {})".format(f.name, " ".join(a.name for a in f.arguments)) for f in facts
                  if all(kept(a.name, a.type) for a in f.arguments))
    return "(define (problem " + ONE_OFF_PROBLEM + ")\n(:domain alfred)\n(:objects\n{}\n)\n(:init\n{}\n)\n{}\n".format(
        "\n".join(objects), "\n".join(init), goal)


class PlannerExpert:
    """Fast Downward on a reduced problem; initial walkthroughs cached under `cache_dir/walkthroughs`."""

    name = "planner"

    def __init__(self, cache_dir: str | os.PathLike | None):
        self.cache_dir = Path(cache_dir) / "walkthroughs" if cache_dir else None
        self._planner = None      # a PddlEnv of its own (its own copy of the Fast Downward library)
        self.plan: list[str] = []
        self._i = 0
        self.last_plan_seconds = 0.0
        self.last_error: str | None = None

    def _engine(self):
        if self._planner is None:
            import textworld
            from textworld.envs.pddl import PddlEnv
            self._planner = PddlEnv(textworld.EnvInfos())
        return self._planner

    def solve(self, engine, game: dict, task_type: str, params: dict) -> list[str]:
        """A plan from `engine`'s current state (engine: the game's PddlEnv, names demangled)."""
        problem = game["pddl_problem"]
        goal = problem[problem.index("(:goal"):]
        reduced = _reduced_problem(engine._pddl_state, goal, task_type, params)
        t = time.perf_counter()
        try:
            planner = self._engine()
            planner.load({"pddl_domain": game["pddl_domain"], "grammar": game["grammar"], "pddl_problem": reduced})
            plan = list(planner._pddl_state.replan(engine._entity_infos))
            self.last_error = None
        except Exception as e:     # no plan is "no expert action", never a failed episode
            plan, self.last_error = [], repr(e)
            self._planner = None
        self.last_plan_seconds = time.perf_counter() - t
        return plan

    def _cache_path(self, game: dict) -> Path | None:
        if self.cache_dir is None:
            return None
        key = hashlib.sha256((game["pddl_domain"] + "\0" + game["pddl_problem"]).encode()).hexdigest()
        return self.cache_dir / key[:2] / f"{key}.json"

    def walkthrough(self, engine, game: dict, task_type: str, params: dict) -> list[str]:
        """The plan from the initial state: from the cache, else solved now and stored."""
        path = self._cache_path(game)
        if path is not None and path.exists():
            return json.loads(path.read_text())["walkthrough"]
        plan = self.solve(engine, game, task_type, params)
        if path is not None and plan:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"walkthrough": plan, "plan_seconds": round(self.last_plan_seconds, 3)}))
            os.replace(tmp, path)
        return plan

    def reset(self, engine, game: dict, task_type: str, params: dict, state) -> str | None:
        self._game, self._task_type, self._params = game, task_type, params
        self.plan, self._i = self.walkthrough(engine, game, task_type, params), 0
        return self._current(engine, state)

    def next_action(self, engine, state, last_command: str) -> str | None:
        if self._i < len(self.plan) and last_command == self.plan[self._i] and state["feedback"] != "Nothing happens.":
            self._i += 1
        elif not (last_command.startswith(_NO_EFFECT_PREFIXES) or state["feedback"] == "Nothing happens."):
            self.plan, self._i = [], 0          # the agent changed the state off-plan: replan
        return self._current(engine, state)

    def _current(self, engine, state) -> str | None:
        if state["won"]:
            return None
        if self._i >= len(self.plan) or self.plan[self._i] not in state["admissible_commands"]:
            self.plan, self._i = self.solve(engine, self._game, self._task_type, self._params), 0
        return self.plan[self._i] if self.plan else None

    def close(self):
        self._planner = None


def play_expert(env, task_id: str, split: str | None = None) -> dict:
    """Play one episode of `task_id` following `info["expert_action"]` (env made with expert=True).

    Returns won, steps, the commands played and the task type. A missing expert action ends the
    episode as a loss.
    """
    options = {"task_id": task_id} | ({"split": split} if split else {})
    _, info = env.reset(options=options)
    actions: list[str] = []
    while True:
        action = info.get("expert_action")
        if action is None:
            break
        _, _, terminated, truncated, info = env.step(action)
        actions.append(action)
        if terminated or truncated:
            break
    return {"task_id": task_id, "task_type": info["task_type"], "won": bool(info["won"]),
            "steps": len(actions), "actions": actions}
