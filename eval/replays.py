"""Held-out tasks that begin exactly as a training task does: the same first prompt (task, first
observation, admissible actions, rendered by the env's first-turn template), so the policy cannot
tell them from that training task at its first turn. TextWorldExpress coin at its default size has 24
distinct training openings, and test seeds 20480-20999 (about half of any sample of `test`) replay
them; an evaluation's success rate over such tasks measures training games.

    openings = train_openings(cfg, kwargs)           # first-prompt key → a train task (cached), or None
    record = replays_record(trajs, openings, train)  # eval.json's "replays_train", None when none replay

Only envs whose class says listing every training task's opening is cheap are checked
(`TextEnv.openings_listable`: one reset per training task); the others report nothing.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import DictConfig

from agentq import build
from agentq.agent.trajectory import Trajectory
from agentq.envs import env_class
from agentq.envs.base import TextEnv
from agentq.models.tiny import cache_dir
from agentq.utils.files import write_text_replacing
from agentq.utils.logging import console

#: bumped when what a key covers changes, so older cache files are not read
VERSION = 1


def opening_key(first_prompt: str) -> str:
    """The key of an episode's first user message (what the policy reads at its first turn)."""
    return hashlib.sha256(first_prompt.encode()).hexdigest()[:20]


def train_openings(cfg: DictConfig, kwargs: dict[str, Any]) -> dict[str, str] | None:
    """Every training task's first-prompt key → the first training task with it, for envs whose class
    sets `openings_listable` (None for the others, and with eval.check_replays=false). Listed once per
    env settings and template, then read from the cache folder (`$AGENTQ_CACHE/openings/`).

    Args:
        cfg: the evaluation's config (env, its train split, its first-turn template).
        kwargs: the env's kwargs as eval.json records them (`env_kwargs_record`): part of the cache key.
    Raises:
        ConfigError: the env refused its settings or the split (as `build.make_env` says).
    """
    cls = env_class(str(cfg.env.name))
    if not cfg.eval.get("check_replays", True) or cls is None or not getattr(cls, "openings_listable", False):
        return None
    prompt = build.prompt_config(cfg)
    split = str(cfg.env.train_split)
    what = {"version": VERSION, "env": str(cfg.env.name), "split": split, "kwargs": kwargs,
            "first_turn": prompt.first_turn, "actions": prompt.actions, "max_obs_chars": prompt.max_obs_chars}
    path = cache_dir() / "openings" / f"{cfg.env.name}-{opening_key(json.dumps(what, sort_keys=True))}.json"
    try:
        return dict(json.loads(path.read_text())["openings"])
    except (OSError, ValueError, KeyError, TypeError):      # none yet, or cut short: listed again
        pass
    env = build.make_env(cfg, split)
    try:
        base = env.unwrapped
        assert isinstance(base, TextEnv)       # env_class said so
        tasks = base.list_tasks(split)
        console.print(f"held-out check: listing the first turns of the {len(tasks)} {split} tasks (once; kept in "
                      f"{path.parent})", markup=False, highlight=False, soft_wrap=True)
        openings: dict[str, str] = {}
        for task in tasks:
            obs, info = env.reset(options={"task_id": task, "split": split})
            first = prompt.render("first_turn", info.get("task", ""), obs, info.get("admissible_actions"), info)
            openings.setdefault(opening_key(first), task)
    finally:
        env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_replacing(path, json.dumps({**what, "openings": openings}))
    return openings


def replays_record(trajs: list[Trajectory], openings: dict[str, str] | None, train_split: str) -> dict | None:
    """eval.json's `replays_train`: the evaluated tasks whose first prompt is a training task's, and the
    success rate over them and over the others (None when no opening was listed or none replays).

    Args:
        trajs: the evaluation's episodes (their transcript's first entry is the first user message;
            an episode that errored before it has none and is counted with the others).
        openings: `train_openings`.
        train_split: the split the openings are of.
    """
    if not openings:
        return None
    replay = {t.task_id: openings[k] for t in trajs
              if t.transcript and (k := opening_key(t.transcript[0].get("user", ""))) in openings}
    if not replay:
        return None
    on = [t for t in trajs if t.task_id in replay]
    off = [t for t in trajs if t.task_id not in replay]
    return {"train_split": train_split, "tasks": len(replay), "of_tasks": len({t.task_id for t in trajs}),
            "episodes": len(on), "success_rate": sum(t.won for t in on) / len(on),
            "other_episodes": len(off), "other_success_rate": sum(t.won for t in off) / len(off) if off else None,
            "examples": dict(sorted(replay.items())[:5])}


def replays_text(r: dict) -> str:
    """The warning an evaluation with replayed training openings ends with."""
    other = (f", {100 * r['other_success_rate']:.1f} % over the other {r['other_episodes']}"
             if r["other_success_rate"] is not None else "")
    return (f"warning: {r['tasks']} of the {r['of_tasks']} tasks begin exactly as a {r['train_split']} task does "
            f"(the same first prompt; e.g. {next(iter(r['examples'].items()))[0]} as "
            f"{next(iter(r['examples'].items()))[1]}): success {100 * r['success_rate']:.1f} % over their "
            f"{r['episodes']} episodes{other} (eval.json: replays_train)")
