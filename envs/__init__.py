"""agentq's text environments, registered with Gymnasium under the `agentq/` namespace.

The top-level folder `envs/`, installed as `agentq.envs` (setup.py maps it); the lowest layer with
`agentq.kernels`: it imports gymnasium and the env engines, nothing else of agentq (ARCHITECTURE.md).

    import gymnasium as gym, agentq.envs
    env = gym.make("agentq/TextWorldExpress-v0", split="test")

Entry points are lazy "module:Class" strings, so importing this package does not import the
environment engines (the JVM-backed or PDDL-backed ones are heavy).

`env.name` (and `make`) accept, in this order:
  1. a built-in name of `REGISTRY` ("alfworld"),
  2. a registered Gymnasium id ("agentq/ALFWorld-v0", or one your own code registered),
  3. the name of an environment plugin: an entry point of group `agentq.envs` in an installed
     package (`guess = "guess_env:GuessEnv"` → id "plugin/guess"),
  4. "module:Class", a `TextEnv` subclass importable everywhere the envs run (→ id "ext/module.Class"),
  5. "module:Id-vN", Gymnasium's own form: import `module` (which registers Id-vN), then make Id-vN.
Environments outside agentq: docs/adding-an-environment.md.
"""
from __future__ import annotations

import importlib
import re

import gymnasium as gym

from .base import (INFO_KEYS, EnvClosedError, EnvCrashedError, EpisodeOverError, TaskStep, TextEnv, TextSpace,
                   UnknownTaskError, action_problem)

#: config name (conf/env/<name>.yaml) → (Gymnasium id, entry point)
REGISTRY: dict[str, tuple[str, str]] = {
    "textworld_express": ("agentq/TextWorldExpress-v0", "agentq.envs.textworld_express.env:TextWorldExpressEnv"),
    "alfworld": ("agentq/ALFWorld-v0", "agentq.envs.alfworld.env:ALFWorldEnv"),
    "scienceworld": ("agentq/ScienceWorld-v0", "agentq.envs.scienceworld.env:ScienceWorldEnv"),
    "webshop": ("agentq/WebShop-v0", "agentq.envs.webshop.env:WebShopEnv"),
}

for _name, (_id, _entry) in REGISTRY.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)


#: entry-point group of environment plugins: name → "module:Class" (a TextEnv subclass)
PLUGIN_GROUP = "agentq.envs"


def plugins() -> dict[str, str]:
    """Environment plugins of the installed packages (entry points of group `agentq.envs`)."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}


def _register(gym_id: str, entry: str) -> str:
    if gym_id not in gym.registry:
        gym.register(id=gym_id, entry_point=entry)
    return gym_id


def env_id(name_or_id: str) -> str:
    """The Gymnasium id of `name_or_id` (any of the five forms in the module docstring),
    registering plugins and "module:Class" environments on first use."""
    if name_or_id in REGISTRY:
        return REGISTRY[name_or_id][0]
    if name_or_id in gym.registry:
        return name_or_id
    found = plugins()
    if name_or_id in found:
        return _register(f"plugin/{name_or_id}", found[name_or_id])
    module, sep, attr = name_or_id.partition(":")
    if sep and module and attr:
        if re.fullmatch(r"[\w.-]+-v\d+", attr):            # Gymnasium's "module:Id-vN"
            importlib.import_module(module)
            if attr in gym.registry:
                return attr
            raise gym.error.NameNotFound(f"importing {module!r} did not register the Gymnasium id {attr!r}")
        if attr.isidentifier():
            cls = getattr(importlib.import_module(module), attr, None)
            if cls is None:
                raise gym.error.NameNotFound(f"module {module!r} has no attribute {attr!r} (env.name={name_or_id!r})")
            return _register(f"ext/{module}.{attr}", name_or_id)
    raise gym.error.NameNotFound(
        f"unknown environment {name_or_id!r}; valid names: {sorted(REGISTRY)} (built in), plugins: "
        f"{sorted(found)} (entry points of group {PLUGIN_GROUP!r}), or 'module:Class' (a TextEnv subclass), "
        f"'module:Id-vN', a registered Gymnasium id")


def make(name_or_id: str, **kwargs) -> gym.Env:
    """`gymnasium.make` that also accepts agentq's names, plugins and "module:Class"; the result must
    be a `TextEnv` (agentq's agent loop needs its task lists and info keys)."""
    env = gym.make(env_id(name_or_id), **kwargs)
    if not isinstance(env.unwrapped, TextEnv):
        env.close()
        raise TypeError(f"environment {name_or_id!r} is a {type(env.unwrapped).__name__}, not an agentq TextEnv "
                        "subclass (see docs/adding-an-environment.md)")
    return env


__all__ = ["EnvClosedError", "EnvCrashedError", "EpisodeOverError", "INFO_KEYS", "PLUGIN_GROUP", "REGISTRY", "TaskStep",
           "TextEnv", "TextSpace", "UnknownTaskError", "action_problem", "env_id", "make", "plugins"]
