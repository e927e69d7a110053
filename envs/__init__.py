"""agentq's text environments, registered with Gymnasium under the `agentq/` namespace.

The top-level folder `envs/`, installed as `agentq.envs` (setup.py maps it); a low layer beside
`agentq.kernels`: it imports gymnasium, the env engines and `agentq.utils` (process helpers), nothing
else of agentq (ARCHITECTURE.md).

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
  5. "module:Id-vN" or "module:namespace/Id-vN", Gymnasium's own form: import `module` (which
     registers the id), then make it.
Classes (forms 3 and 4) are checked on registration: a value that is not a `TextEnv` subclass
implementing the hooks is a TypeError naming it, before any env is built. A plugin named like a
built-in or a registered id (form 1 or 2) is hidden by it: resolving the name warns, naming the
plugin's "module:Class", which picks the plugin.
Environments outside agentq: docs/adding-an-environment.md.
"""
from __future__ import annotations

import functools
import importlib
import re
import sys

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

# Gymnasium's passive env checker (a wrapper `gym.make` adds unless the registration or the call turns
# it off) is off for agentq's envs: in Gymnasium 1.4, once an env's first `reset()` raised (e.g. an
# unknown task id), every later `step()` raised "cannot unpack non-iterable NoneType object" after
# stepping the engine, good resets in between or not. `TextEnv` checks its own hooks' results;
# `gymnasium.utils.env_checker.check_env` is the full check.
for _name, (_id, _entry) in REGISTRY.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, disable_env_checker=True)


#: entry-point group of environment plugins: name → "module:Class" (a TextEnv subclass)
PLUGIN_GROUP = "agentq.envs"


def plugins() -> dict[str, str]:
    """Environment plugins of the installed packages (entry points of group `agentq.envs`).

    Scanned once per `sys.path` (a scan reads every installed package's metadata, ~4 ms, and
    `env_id` asks on every lookup, built-in names too): a folder added to the path later is scanned
    then; a package installed into a folder already scanned needs `refresh_plugins()`."""
    return dict(_scan_plugins(tuple(sys.path)))


@functools.lru_cache(maxsize=8)
def _scan_plugins(path: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(name, "module:Class") of each plugin; `path` (sys.path's) only keys the cache."""
    from importlib.metadata import entry_points

    return tuple((ep.name, ep.value) for ep in entry_points(group=PLUGIN_GROUP))


def refresh_plugins() -> None:
    """Forget the plugin scans and which hidden plugins were warned of (after installing a package
    in this process, e.g. a test's)."""
    _scan_plugins.cache_clear()
    _warn_hidden_plugin.cache_clear()


#: the hooks a concrete TextEnv implements (TextEnv's own raise NotImplementedError)
_HOOKS = ("_tasks", "_reset_task", "_step_task")
#: Gymnasium's `[namespace/]Name-vN` (and an unversioned `namespace/Name`), after "module:"
_GYM_ID = re.compile(r"(?:[\w.-]+/)?[\w.-]+-v\d+|[\w.-]+/[\w.-]+")


def _check_text_env(obj, name_or_id: str) -> None:
    """TypeError unless `obj` is a concrete TextEnv subclass (checked on registration, so a wrong
    `env.name` fails at once, not inside an env worker at the first construction)."""
    if not (isinstance(obj, type) and issubclass(obj, TextEnv)):
        what = obj.__name__ if isinstance(obj, type) else f"{obj!r:.60} (of type {type(obj).__name__})"
        raise TypeError(f"environment {name_or_id!r} is {what}, not an agentq TextEnv subclass "
                        "(see docs/adding-an-environment.md)")
    missing = [h for h in _HOOKS if getattr(obj, h) is getattr(TextEnv, h)]
    if missing:
        raise TypeError(f"environment {name_or_id!r} is {obj.__name__}, which does not implement the TextEnv "
                        f"hook(s) {missing}; a concrete TextEnv implements {list(_HOOKS)}")


def _register(gym_id: str, entry: str, name_or_id: str) -> str:
    if gym_id not in gym.registry:
        from gymnasium.envs.registration import load_env_creator

        _check_text_env(load_env_creator(entry), name_or_id)
        gym.register(id=gym_id, entry_point=entry, disable_env_checker=True)   # (see REGISTRY's loop)
    return gym_id


def env_id(name_or_id: str) -> str:
    """The Gymnasium id of `name_or_id` (any of the five forms in the module docstring),
    registering plugins and "module:Class" environments on first use."""
    found = plugins()
    if name_or_id in REGISTRY or name_or_id in gym.registry:
        gym_id = REGISTRY[name_or_id][0] if name_or_id in REGISTRY else name_or_id
        if name_or_id in found:
            _warn_hidden_plugin(name_or_id, gym_id, found[name_or_id])
        return gym_id
    if name_or_id in found:
        return _register(f"plugin/{name_or_id}", found[name_or_id], name_or_id)
    module, sep, attr = name_or_id.partition(":")
    if sep and module and attr:
        if _GYM_ID.fullmatch(attr):                     # Gymnasium's "module:[namespace/]Id-vN"
            _import(module)
            if attr not in gym.registry:
                raise gym.error.NameNotFound(f"importing {module!r} did not register the Gymnasium id {attr!r}")
            _check_gym_class(attr, name_or_id)
            return attr
        if attr.isidentifier():
            mod = _import(module)
            cls = getattr(mod, attr, None)
            if cls is None:
                raise gym.error.NameNotFound(f"module {module!r} has no attribute {attr!r}{_did_you_mean(mod, attr)}")
            return _register(f"ext/{module}.{attr}", name_or_id, name_or_id)
    raise gym.error.NameNotFound(
        f"unknown environment {name_or_id!r}; valid names: {sorted(REGISTRY)} (built in), plugins: "
        f"{sorted(found)} (entry points of group {PLUGIN_GROUP!r}), or 'module:Class' (a TextEnv subclass), "
        f"'module:[namespace/]Id-vN', a registered Gymnasium id")


def _import(module: str):
    """`module` of a "module:..." env.name, imported.

    Raises:
        ModuleNotFoundError: saying how to make `module` importable when it is the one not found (or a
            package above it), else where the user's code imported the missing one (file:line).
    """
    from agentq.utils.errors import raised_at

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            hint = "; put its folder on PYTHONPATH or pip install its package (docs/adding-an-environment.md)"
        else:
            hint = f" (raised at {raised_at(e)})"
        raise ModuleNotFoundError(f"{e}{hint}", name=e.name, path=e.path) from e


@functools.cache
def _warn_hidden_plugin(name: str, gym_id: str, entry: str) -> None:
    """A plugin whose name a built-in (or registered id) takes first would be ignored silently: an
    `env.name=alfworld` run would train on agentq's ALFWorld while the user meant the plugin's.
    Once per process for each (cached): a config load resolves the name several times."""
    import warnings

    where = "agentq's built-in environment" if name in REGISTRY else "the registered Gymnasium id"
    warnings.warn(f"environment {name!r} is {where} {gym_id}; the installed plugin of that name ({entry}, entry "
                  f"point of group {PLUGIN_GROUP!r}) is not used: set env.name={entry} to use the plugin", UserWarning)


def _did_you_mean(module, attr: str) -> str:
    """", did you mean 'X'?" for the module's TextEnv subclass spelled closest to `attr` (a typo in
    `module:Class`), else ", its TextEnv subclasses: [...]" or ""."""
    import difflib

    classes = sorted(k for k, v in vars(module).items()
                     if isinstance(v, type) and issubclass(v, TextEnv) and v is not TextEnv)
    close = difflib.get_close_matches(attr, classes, n=1)
    if close:
        return f"; did you mean {module.__name__}:{close[0]}?"
    return f"; its TextEnv subclasses: {classes}" if classes else ""


def _entry_class(gym_id: str) -> type | None:
    """The class a registered id's entry point names, or None for a factory function (whose env
    is only known once built)."""
    from gymnasium.envs.registration import load_env_creator

    entry = gym.spec(gym_id).entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    return creator if isinstance(creator, type) else None


def _check_gym_class(gym_id: str, name_or_id: str) -> None:
    """A registered id whose entry point is a class must name a TextEnv; a factory function is
    only known by what it returns (`make` checks that)."""
    cls = _entry_class(gym_id)
    if cls is not None:
        _check_text_env(cls, name_or_id)


def env_class(name_or_id: str) -> type[TextEnv] | None:
    """The TextEnv class behind any env name (`env_id`'s forms), without building one (its
    `splits`, say); None when a factory function builds it."""
    cls = _entry_class(env_id(name_or_id))
    return cls if cls is not None and issubclass(cls, TextEnv) else None


#: what gymnasium.make takes for itself rather than handing to the env
_MAKE_OWN = ("max_episode_steps", "disable_env_checker", "autoreset", "apply_api_compatibility")


def _constructor_chain(cls: type) -> tuple[list, bool] | None:
    """(the named parameters of each `__init__` up `cls`'s chain while it hands `**kwargs` on, most
    derived first, as lists of inspect.Parameter; whether the chain ended at one without **kwargs),
    or None when a signature cannot be read."""
    import inspect

    chain: list[list[inspect.Parameter]] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return chain, False                           # every __init__ took **kwargs
        try:
            params = list(inspect.signature(init).parameters.values())[1:]      # without self
        except (TypeError, ValueError):
            return None
        chain.append([p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)])
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return chain, True
    return chain, False


def constructor_defaults(name_or_id: str) -> dict:
    """The default of each constructor argument of the env's class (the most derived `__init__`
    that names it wins); {} when the class cannot be known (a factory function)."""
    cls = env_class(name_or_id)
    found = _constructor_chain(cls) if cls is not None else None
    out: dict = {}
    for params in (found[0] if found else []):
        for p in params:
            if p.default is not p.empty:
                out.setdefault(p.name, p.default)
    return out


def kwargs_problem(name_or_id: str, kwargs: dict) -> tuple[str, bool] | None:
    """What is wrong with building the env with `kwargs`, judged from its constructors' signatures
    (each `__init__` up the class chain while it hands `**kwargs` on) and the keyword arguments its
    Gymnasium registration adds, without building one.

    Args:
        name_or_id: any env name `env_id` takes.
        kwargs: what agentq passes to `gymnasium.make` (env.kwargs, split, max_steps, expert).
    Returns:
        None when they fit, or when the signatures cannot tell (a factory function, `**kwargs` all
        the way up); else (a sentence naming the unknown or missing arguments, whether it is
        certain). An argument no `__init__` names is only probably unknown when one of them takes
        `**kwargs` (it may pop it for itself): certain for agentq's own envs, which hand theirs on.
    """
    import difflib

    gym_id = env_id(name_or_id)
    cls = env_class(gym_id)
    found = _constructor_chain(cls) if cls is not None else None
    if cls is None or found is None:
        return None
    chain, closed = found
    kwargs = {**(gym.spec(gym_id).kwargs or {}), **kwargs}
    accepted = {p.name for params in chain for p in params}
    # the class's own required arguments (a parent's may be filled in by the class itself)
    missing = [p.name for p in (chain[0] if chain else []) if p.default is p.empty and p.name not in kwargs]
    if missing:
        return f"{cls.__name__} needs {missing}, which nothing sets", True
    unknown = sorted(k for k in kwargs if k not in accepted and k not in _MAKE_OWN) if closed else []
    if unknown:
        close = {k: difflib.get_close_matches(k, sorted(accepted), n=1) for k in unknown}
        hints = "".join(f"; did you mean {c[0]} for {k}?" for k, c in close.items() if c)
        certain = len(chain) == 1 or cls.__module__.startswith("agentq.envs.")
        return f"{cls.__name__} takes no argument {unknown}{hints} (it takes {sorted(accepted)})", certain
    return None


def make(name_or_id: str, **kwargs) -> gym.Env:
    """`gymnasium.make` that also accepts agentq's names, plugins and "module:Class"; the result must
    be a `TextEnv` (agentq's agent loop needs its task lists and info keys). Gymnasium's passive env
    checker is off unless `disable_env_checker=False` is passed (see REGISTRY's loop: it broke every
    `step` after a first `reset` that raised), ids registered elsewhere included."""
    kwargs.setdefault("disable_env_checker", True)
    env = gym.make(env_id(name_or_id), **kwargs)
    if not isinstance(env.unwrapped, TextEnv):
        env.close()
        raise TypeError(f"environment {name_or_id!r} is a {type(env.unwrapped).__name__}, not an agentq TextEnv "
                        "subclass (see docs/adding-an-environment.md)")
    return env


__all__ = ["EnvClosedError", "EnvCrashedError", "EpisodeOverError", "INFO_KEYS", "PLUGIN_GROUP", "REGISTRY", "TaskStep",
           "TextEnv", "TextSpace", "UnknownTaskError", "action_problem", "constructor_defaults", "env_class", "env_id",
           "kwargs_problem", "make", "plugins", "refresh_plugins"]
