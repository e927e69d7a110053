"""agentq's text environments, registered with Gymnasium under the `agentq/` namespace.

    import gymnasium as gym, agentq.envs
    env = gym.make("agentq/TextWorldExpress-v0", split="test")

Entry points are lazy "module:Class" strings, so importing this package does not import the
environment engines (the JVM-backed or PDDL-backed ones are heavy). To add an environment:
write a `TextEnv` subclass (see `base.py` and `textworld_express.py`), add one line to
`REGISTRY` below, and add `conf/env/<name>.yaml`.
"""
from __future__ import annotations

import gymnasium as gym

from .base import (INFO_KEYS, EnvClosedError, EnvCrashedError, EpisodeOverError, TaskStep, TextEnv, TextSpace,
                   UnknownTaskError, action_problem)

#: config name (conf/env/<name>.yaml) → (Gymnasium id, entry point)
REGISTRY: dict[str, tuple[str, str]] = {
    "textworld_express": ("agentq/TextWorldExpress-v0", "agentq.envs.textworld_express:TextWorldExpressEnv"),
    "alfworld": ("agentq/ALFWorld-v0", "agentq.envs.alfworld.env:ALFWorldEnv"),
    "scienceworld": ("agentq/ScienceWorld-v0", "agentq.envs.scienceworld.env:ScienceWorldEnv"),
    "webshop": ("agentq/WebShop-v0", "agentq.envs.webshop.env:WebShopEnv"),
}

for _name, (_id, _entry) in REGISTRY.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)


def env_id(name_or_id: str) -> str:
    """Resolve a config name ("alfworld") or a Gymnasium id ("agentq/ALFWorld-v0")."""
    if name_or_id in REGISTRY:
        return REGISTRY[name_or_id][0]
    ids = {i for i, _ in REGISTRY.values()}
    if name_or_id in ids or name_or_id in gym.registry:
        return name_or_id
    raise gym.error.NameNotFound(
        f"unknown environment {name_or_id!r}; valid names: {sorted(REGISTRY)}, "
        f"valid ids: {sorted(ids)}")


def make(name_or_id: str, **kwargs) -> gym.Env:
    """`gymnasium.make` that also accepts agentq's short names and lists valid choices on error."""
    return gym.make(env_id(name_or_id), **kwargs)


__all__ = ["EnvClosedError", "EnvCrashedError", "EpisodeOverError", "INFO_KEYS", "REGISTRY", "TaskStep", "TextEnv", "TextSpace", "UnknownTaskError", "action_problem", "env_id",
           "make"]
