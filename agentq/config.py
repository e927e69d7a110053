"""Loading the Hydra config (conf/) with errors that list the valid choices."""
from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from agentq.utils.errors import first_line
from agentq.utils.folder_lock import lock_holder


class ConfigError(ValueError):
    pass


def make_setting_dir(folder: str | Path, key: str, what: str = "output folder",
                     error: type[ConfigError] = ConfigError) -> Path:
    """`folder` (named by the setting `key`), created with its parents.

    Raises:
        `error`: it cannot be created (a file in the way, no permission), as one line naming `key`,
        so the command line says which value to change instead of a traceback.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"{key}: cannot create the {what} {str(folder)!r} ({type(e).__name__}: "
                    f"{e.strerror or e}); set {key} to a writable folder") from None
    return folder


def _valid_keys(cfg: DictConfig, dotted: str) -> tuple[str, list[str]]:
    """For an override key a.b.c, the deepest existing parent and its keys."""
    parts = dotted.lstrip("+~").split(".")
    node, path = cfg, []
    for p in parts[:-1]:
        if isinstance(node, DictConfig) and p in node:
            node = node[p]
            path.append(p)
        else:
            break
    keys = sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []
    return ".".join(path) or "<root>", keys


#: entry-point group of config folders shipped by plugins: value = a Python package holding e.g. env/<name>.yaml
CONF_GROUP = "agentq.conf"


def plugin_searchpath() -> list[str]:
    """Hydra search-path entries (pkg://...) of the config packages installed plugins declare."""
    from importlib.metadata import entry_points

    return [f"pkg://{ep.value}" for ep in sorted(entry_points(group=CONF_GROUP), key=lambda e: e.name)]


def with_searchpath(overrides: list[str], extra: list[str]) -> list[str]:
    """`overrides` with `extra` appended to hydra.searchpath (a user's own `hydra.searchpath=[...]`
    entries come first: a config folder given on the command line wins over a plugin's)."""
    if not extra:
        return overrides
    user = [o for o in overrides if o.startswith("hydra.searchpath=")]
    rest = [o for o in overrides if not o.startswith("hydra.searchpath=")]
    entries = []
    for o in user:
        entries += [e.strip() for e in o.split("=", 1)[1].strip().strip("[]").split(",") if e.strip()]
    return rest + [f"hydra.searchpath=[{','.join(entries + extra)}]"]


def load_config(overrides: list[str] | None = None, config_name: str = "config",
                command: str | None = None, pin_env: bool = True) -> DictConfig:
    """Compose conf/<config_name>.yaml (config.yaml, or pipeline.yaml for `agentq pipeline`) with
    `key=value` overrides (Hydra syntax); struct mode on. Config folders outside agentq join the
    search path from `hydra.searchpath=[file:///abs/conf]` and from plugins (entry points of group
    `agentq.conf`), so `env=<their name>` finds their conf/env/<name>.yaml. `command`: the agentq
    command that runs on it, which refuses the keys it does not read (`check_command_keys`);
    `pin_env`: write into env.kwargs what the env would read from outside them (`pin_env_kwargs`;
    False: the defaults as written, which an evaluation's folder name is told against)."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_override_syntax(list(overrides or []))
    overrides = with_searchpath(list(overrides or []), plugin_searchpath())
    with initialize_config_module(config_module="agentq.conf", version_base=None):
        try:
            cfg = compose(config_name=config_name, overrides=overrides)
        except (HydraException, OmegaConfBaseException) as e:
            msg = str(e)
            if msg.startswith("Could not delete from config. '"):      # `~key` of a key that is not there
                raise removal_error(_base_config(config_name, overrides), msg) from None
            if "Could not override" in msg or "Key '" in msg:
                raise unknown_key_error(_base_config(config_name, overrides), _bad_key(msg, overrides),
                                        objective_set=any(_override_key(o) == "algo.objective" for o in overrides)
                                        ) from None
            raise ConfigError(_one_line(msg.split("\nConfig search path")[0])) from None
        except ValueError as e:         # e.g. `trainer=3`: "Config group override must be a string or a list"
            raise ConfigError(str(e)) from None
        check_added_keys(overrides, config_name)
        check_removed_keys(overrides)
        if command is not None:
            check_command_keys(command, cfg, overrides, config_name)
            warn_unread_placement(command, cfg, overrides)
    expand_user_paths(cfg)
    OmegaConf.set_struct(cfg, True)
    try:
        OmegaConf.to_container(cfg, resolve=True)       # an interpolation that does not resolve, named now
        check_env_keys(cfg, overrides)
        check_config(cfg)
        check_env_name(cfg, renamed=any(o.split("=", 1)[0].lstrip("+") == "env.name" for o in overrides))
        if pin_env:
            pin_env_kwargs(cfg)
    except ConfigError:
        raise
    except (OmegaConfBaseException, ValueError) as e:
        key = getattr(e, "full_key", None)
        raise ConfigError((f"{key}: " if key else "") + str(e).split("\n    full_key")[0]) from None
    return cfg


def _base_config(config_name: str, overrides: list[str]) -> DictConfig:
    """The config of the command line's group choices (and `hydra.` settings) alone: the keys that
    exist for its other overrides to set. Call inside `initialize_config_module`."""
    from hydra import compose

    return compose(config_name=config_name, overrides=[o for o in overrides if "=" in o and
                                                       (_is_group_choice(o) or o.startswith("hydra."))])


def unknown_key_error(base: DictConfig, bad: str | None, why: str = "", objective_set: bool = False) -> ConfigError:
    """The error for an override of a key `base` lacks: the key and the keys of its deepest existing
    section (`why`: a sentence added at the end). Call inside `initialize_config_module`.

    Args:
        base: the config of the command line's group choices (`_base_config`).
        bad: the dotted key (None: unknown, the root's keys are listed).
        why: a sentence added at the end.
        objective_set: the command line sets algo.objective itself (then a parameter the preset's
            objective lacks may be the other objective's, which `+` adds).
    Returns:
        The ConfigError (one line).
    """
    where, keys = _valid_keys(base, bad) if bad else ("<root>", sorted(str(k) for k in base.keys()))
    if not why and where in OPEN_SECTIONS and bad and bad.count(".") == where.count(".") + 1:
        if where == "algo.objective_params" and not objective_set:
            # the preset lists every parameter of its objective: `+` would only reach the objective's refusal
            return ConfigError(f"unknown config key {bad!r}; {_objective_param_hint(base, bad.rpartition('.')[2])}")
        # a new argument for the env's constructor or the objective: Hydra adds a key only with `+`
        why = f"; `+{bad}=...` adds it (agentq hands {where} on to the {'env class' if where == 'env.kwargs' else 'objective'})"
    return ConfigError(f"unknown config key {bad!r}; valid keys under {where}: {keys}{why}")


def _override_key(override: str) -> str:
    """An override's dotted key, without its `+`/`++`/`~` and value."""
    return override.split("=", 1)[0].lstrip("+~")


def _objective_param_hint(base: DictConfig, param: str) -> str:
    """For `param` under algo.objective_params that the chosen preset's objective does not take: the
    preset, its objective and its parameters, and the presets whose objective takes `param`. Each
    preset (conf/algo/, a plugin's algo/) lists all its objective's parameters. Call inside
    `initialize_config_module`."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    takers = []
    for option in loader.get_group_options("algo"):
        preset = OmegaConf.select(loader.repository.load_config(f"algo/{option}").config, "algo")   # type: ignore[attr-defined]
        if isinstance(preset, DictConfig) and param in (preset.get("objective_params") or {}):
            takers.append(option)
    params = [str(k) for k in (OmegaConf.select(base, "algo.objective_params") or {})]
    found = f"presets whose objective takes {param}: {takers}" if takers else f"no preset's objective takes {param}"
    return (f"algo={OmegaConf.select(base, 'algo.name')}'s objective {str(OmegaConf.select(base, 'algo.objective'))!r} "
            f"takes no parameter {param} (its parameters: {params}); {found}")


def removal_error(base: DictConfig, msg: str) -> ConfigError:
    """The error for Hydra's "Could not delete from config. 'key' does not exist." (a `~key` override;
    Hydra says so of a key whose value is null too): the keys of its section, as for a misspelt key."""
    key = msg.split("'")[1]
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(base, parent) if parent else base
    if isinstance(node, DictConfig) and leaf in node.keys():
        return ConfigError(f"'~{key}': Hydra does not remove a key whose value is null, as {key} is; set the value "
                           f"you want instead ({key}=<value>)")
    return unknown_key_error(base, key, " (`~` removes a key that is there)")


#: the sections whose keys agentq hands on without reading them itself: the environment class's
#: constructor arguments and the objective's parameters (make_objective refuses a name it does not
#: take). Only there may a `+key=value` override add a key; anywhere else nothing would read it
OPEN_SECTIONS = ("env.kwargs", "algo.objective_params")


def check_added_keys(overrides: list[str], config_name: str) -> None:
    """Refuse a `+key=value` (or `++key=value`) override that adds a key outside `OPEN_SECTIONS`:
    Hydra adds it, and the run then ignored it silently (`+trainer.lerning_rate=1e-5`). A group's
    `+group=option` and Hydra's own `hydra.` keys are Hydra's to check. Call inside
    `initialize_config_module`.

    Raises:
        ConfigError: naming the key and the valid keys of its section, as a misspelt plain override.
    """
    base = None
    for o in overrides:
        key = o.split("=", 1)[0]
        name = key.lstrip("+")
        if (not key.startswith("+") or name in _GROUPS or name.startswith("hydra.")
                or any(name.startswith(s + ".") for s in OPEN_SECTIONS)):
            continue
        base = base if base is not None else _base_config(config_name, overrides)
        parent, _, leaf = name.rpartition(".")
        node = OmegaConf.select(base, parent) if parent else base
        # keys(): `in` leaves out a key whose value is ??? (model=hf's model.path)
        if not (isinstance(node, DictConfig) and leaf in node.keys()):
            raise unknown_key_error(base, name, f" (`+` adds a key only under {' or '.join(OPEN_SECTIONS)}, whose "
                                                "keys agentq hands on to the env class and the objective)")


def check_removed_keys(overrides: list[str]) -> None:
    """Refuse a `~key` override outside `OPEN_SECTIONS` (Hydra's own `hydra.` keys aside): agentq reads
    every other key, and a removed one was omegaconf's "Key 'steps' is not in struct" traceback at its
    first read. Under `OPEN_SECTIONS` the env class or the objective takes its own default.

    Raises:
        ConfigError: naming the override and the key.
    """
    for o in overrides:
        name = o[1:].split("=", 1)[0]
        if (not o.startswith("~") or name.startswith("hydra.")
                or any(name.startswith(s + ".") for s in OPEN_SECTIONS)):
            continue
        instead = f"pick another option instead ({name}=<option>)" if name in _GROUPS else "set another value instead"
        raise ConfigError(f"{o!r}: {name} cannot be removed: agentq reads it (`~` removes a key only under "
                          f"{' or '.join(OPEN_SECTIONS)}); {instead} (`agentq config` prints every key)")


def check_command_keys(command: str, cfg: DictConfig, overrides: list[str], config_name: str) -> None:
    """Refuse a key of `config_schema.READ_BY` that `command` does not read, set on the command line
    away from its default: it was dropped without a word, while config.yaml recorded it
    (`agentq train checkpoint=<SFT checkpoint>` trained from the base model). `agentq config` prints
    every key. Call inside `initialize_config_module`.

    Raises:
        ConfigError: one line naming each such key, the commands that read it and what was likely meant.
    """
    from agentq.config_schema import READ_BY

    if command == "config":
        return
    ignored = [e for e, readers in READ_BY.items() if command not in readers]
    keys = [o.split("=", 1)[0].lstrip("+") for o in overrides if "=" in o and not o.startswith(("~", "hydra."))]
    touched = [k for k in keys if any(in_sections(k, (e,)) or in_sections(e, (k,)) for e in ignored)]
    if not touched:         # the common case: no second composition
        return
    base = _base_config(config_name, overrides)
    problems = {}
    for key in touched:
        now = config_leaves(OmegaConf.select(cfg, key), key + ".")
        default = config_leaves(OmegaConf.select(base, key, default=None), key + ".")
        problems.update({k: v for k, v in now.items() if v != default.get(k, UNSET)
                         and command not in READ_BY.get(_read_by_entry(k) or "", (command,))})
    if problems:
        raise ConfigError("; ".join(_not_read(command, k, v) for k, v in problems.items()))


#: what a command that reads no placement.* runs instead (a train command line's placement= must not stop it)
ONE_PROCESS = {"eval": "agentq eval runs one engine", "sft": "agentq sft trains in this process"}


def warn_unread_placement(command: str, cfg: DictConfig, overrides: list[str]) -> None:
    """Say (not refuse) when a Ray placement on `command`'s line is not read: `agentq eval` and
    `agentq sft` run one engine / learner whatever placement= says."""
    touched = any(o.lstrip("+").split("=", 1)[0].split(".")[0] == "placement" for o in overrides if "=" in o)
    mode = OmegaConf.select(cfg, "placement.mode", default="single")
    if command not in ONE_PROCESS or not touched or mode == "single":
        return
    from agentq.utils.logging import console

    console.print(f"warning: placement={mode} is read by agentq train / pipeline only; {ONE_PROCESS[command]}",
                  style="yellow", markup=False, highlight=False, soft_wrap=True)


def _read_by_entry(key: str) -> str | None:
    """The `READ_BY` entry that governs dotted `key`: the longest one that holds it."""
    from agentq.config_schema import READ_BY

    return max((e for e in READ_BY if in_sections(key, (e,))), key=len, default=None)


def _not_read(command: str, key: str, value: Any) -> str:
    """`key`={value}: `command` does not read it, who does, and what the user likely meant (`INSTEAD`)."""
    import shlex

    from agentq.config_schema import INSTEAD, READ_BY

    readers = READ_BY[_read_by_entry(key) or ""]
    who = (f"agentq {', '.join(readers[:-1])} and {readers[-1]} do" if len(readers) > 1
           else f"agentq {readers[0]} does")
    sections = [key.rsplit(".", i)[0] for i in range(key.count(".") + 1)]      # the key, its section, ...
    hint = next((INSTEAD[(e, c)] for c in (command, None) for e in sections if (e, c) in INSTEAD), None)
    shown = shlex.quote(value) if isinstance(value, str) else value
    return (f"{key}={value!r}: agentq {command} does not read it (only {who})"
            + (f"; {hint.format(value=shown)}" if hint else ""))


#: settings that name a file or folder. A leading ~ in them is expanded when the config is loaded:
#: Hydra takes ~ only quoted ('model.path="~/x"'), and a path from Python's pathlib never expands it
#: ("~/runs" became a folder named ~ in the working directory)
PATH_KEYS = ("model.path", "checkpoint", "trainer.out_dir", "trainer.resume", "sft.out_dir", "sft.demos",
             "eval.out_dir", "pipeline.out_dir", "sweep.out_dir")


def expand_user_paths(cfg: DictConfig) -> None:
    """Expand a leading ~ (~user) in `cfg`'s `PATH_KEYS`, in place (before struct mode is set)."""
    import os

    for key in PATH_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str) and value.startswith("~"):
            OmegaConf.update(cfg, key, os.path.expanduser(value))


def check_override_syntax(overrides: list[str]) -> None:
    """ConfigError for an argument that is not a Hydra override: a flag (`--steps=3`, `-x`), a
    key without a value, or a value with an unquoted ~ (`model.path=~/x`: the shell leaves a ~ after
    `key=` as it is). Hydra's own parse error is three lines of grammar around a caret."""
    for o in overrides:
        key, _, value = o.partition("=")
        if "~" in value and not _parses(o):
            example = f"'{key}=\"{value}\"'" if value[:1] not in "[{" else "each item that holds ~ in double quotes"
            raise ConfigError(f"{o!r}: Hydra reads ~ in a value only inside quotes: write {example} (single quotes "
                              "around the whole keep the shell from removing the double ones); agentq expands a "
                              "leading ~ in its path settings")
        if o.startswith("-"):
            hint = o.lstrip("-")
            if hint.split("=", 1)[0] in ("cfg", "c", "info", "resolve"):     # Hydra's own flags to show the config
                raise ConfigError(f"{o!r}: agentq takes section.key=value overrides, not Hydra's flags; "
                                  "`agentq config <overrides>` prints the composed config")
            raise ConfigError(f"{o!r}: agentq takes section.key=value overrides, not flags"
                              + (f" (e.g. {hint}, with its section: `agentq config` lists the keys)" if "=" in hint else ""))
        if "=" not in o and not o.startswith("~"):      # `~key` (delete a key) takes no value
            raise ConfigError(f"{o!r} has no value: write {o}=<value> (section.key=value)")


def _parses(override: str) -> bool:
    """Whether Hydra's override grammar reads `override`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException:
        return False
    return True


def _one_line(msg: str) -> str:
    """Hydra's "Could not find 'env/x'" with its option list one per line, as one line."""
    head, sep, options = msg.partition("\n\nAvailable options in ")
    if not sep:
        return " ".join(line.strip() for line in msg.splitlines() if line.strip())
    group, _, names = options.partition(":")
    return f"{head.strip()}. Available options in {group}: {names.split()}"


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError naming every key whose value has the wrong type or range."""
    from agentq.config_schema import config_problems

    problems = config_problems(cfg)
    if problems:
        raise ConfigError("invalid config value" + ("s" if len(problems) > 1 else "") + ":\n  "
                          + "\n  ".join(problems))


#: the keys of every env config (conf/env/<name>.yaml, a plugin's env/<name>.yaml), and of its `prompt`
ENV_KEYS = ("name", "kwargs", "max_steps", "train_split", "eval_split", "max_context_tokens", "max_new_tokens",
            "prompt")
PROMPT_KEYS = ("system", "first_turn", "next_turn", "actions", "max_obs_chars")


#: env.kwargs keys that choose which of an env's tasks are played (TextWorldExpress's games, ALFWorld's
#: task types, ScienceWorld's tasks): where two env configs of one `name` differ (env=textworld_express_mapreader)
TASK_KWARGS = ("games", "task_types", "tasks")


def quant_name(quant: str) -> str:
    """A rollout quantization as the user chose it: rollout=bf16 (conf/rollout/bf16.yaml) is
    rollout.quant=none, and evaluation folders, titles and tables read "bf16"."""
    return {"none": "bf16"}.get(quant, quant)


def env_label(env: Any) -> str:
    """An env config as a title names it: `name`, with the tasks its kwargs choose ("textworld_express
    [mapreader]"); the name alone read the same for both TextWorldExpress configs. "?" without a name."""
    if not env or env.get("name") is None:
        return "?"
    kwargs = env.get("kwargs") or {}
    chosen = [v if isinstance(v, str) else ", ".join(map(str, v)) for k in TASK_KWARGS if (v := kwargs.get(k))]
    return f"{env['name']}" + "".join(f"[{c}]" for c in chosen)


def check_env_keys(cfg: DictConfig, overrides: list[str]) -> None:
    """Refuse an env config that lacks a key of `ENV_KEYS` / `PROMPT_KEYS` or has one besides them: a
    missing key was an omegaconf traceback from deep inside the first build, an extra one (a typo,
    `max_step`) was ignored.

    Raises:
        ConfigError: naming the env= choice, the missing and the unknown keys, and the keys wanted.
    """
    env = cfg.get("env")
    if not isinstance(env, DictConfig):
        return
    prompt = env.get("prompt")
    have = [str(k) for k in env.keys()]
    have += ["prompt." + str(k) for k in prompt.keys()] if isinstance(prompt, DictConfig) else []
    want = [*ENV_KEYS, *(f"prompt.{k}" for k in PROMPT_KEYS)]
    missing = [k for k in want if k not in have]
    unknown = [k for k in have if k not in want]
    if not missing and not unknown:
        return
    choice = next((o.split("=", 1)[1] for o in reversed(overrides) if o.split("=", 1)[0].lstrip("+") == "env"), None)
    where = f"env={choice}: its config (env/{choice}.yaml)" if choice else "the env config"
    why = "; ".join(([f"lacks {missing}"] if missing else []) + ([f"has keys agentq does not read {unknown}"]
                                                                  if unknown else []))
    raise ConfigError(f"{where} {why}. Every env config has the keys {list(ENV_KEYS)}, with prompt's "
                      f"{list(PROMPT_KEYS)}, as conf/env/textworld_express.yaml (docs/adding-an-environment.md)")


def check_env_name(cfg: DictConfig, renamed: bool = False) -> None:
    """Resolve `env.name` now (a built-in name, plugin, `module:Class`, ...: agentq.envs.env_id).

    Args:
        renamed: the command line set env.name (on another env's config: its splits and kwargs stay
            that env's), which a refusal of the env's settings then explains.

    Raises:
        ConfigError: it names no environment, or not a TextEnv, as one line naming the key; else
        a misspelled name was a traceback from deep inside the first env's construction.
    """
    import gymnasium as gym

    from agentq.envs import env_id

    name = (cfg.get("env") or {}).get("name")
    if name is None:
        return
    try:
        env_id(str(name))
    except (gym.error.Error, TypeError, ImportError) as e:
        raise ConfigError(f"env.name={name!r}: {e}") from None
    check_env_settings(cfg, renamed)


def pin_env_kwargs(cfg: DictConfig) -> None:
    """Write into env.kwargs, in place, what the env class would otherwise read from outside them
    (`TextEnv.resolved_kwargs`: $WEBSHOP_DATA or $ALFWORLD_DATA behind a null data_dir, a relative
    folder), so config.yaml, the tiny model's cache key and an evaluation's folder name and eval.json
    say which data a run played (an evaluation on WebShop's real catalog replaced one on the generated
    catalog in the same folder). A resume keeps the run's config.yaml, so its data stay the run's.

    Raises:
        ConfigError: the class's `resolved_kwargs` raised or returned something other than a dict.
    """
    from agentq.envs import env_class

    name = (cfg.get("env") or {}).get("name")
    cls = env_class(str(name)) if name is not None else None
    if cls is None:                     # no env section, or a factory function builds it
        return
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) if cfg.env.get("kwargs") is not None else {}
    assert isinstance(kwargs, dict)
    try:
        pinned = cls.resolved_kwargs({str(k): v for k, v in kwargs.items()})
    except Exception as e:              # a plugin's hook: one line naming it, not a traceback
        raise ConfigError(f"env.kwargs: {cls.__name__}.resolved_kwargs raised {type(e).__name__}: {e}") from None
    if not isinstance(pinned, dict):
        raise ConfigError(f"env.kwargs: {cls.__name__}.resolved_kwargs returned a {type(pinned).__name__}, not a dict")
    if not pinned:
        return
    if cfg.env.get("kwargs") is None:
        with open_dict(cfg.env):
            cfg.env.kwargs = {}
    with open_dict(cfg.env.kwargs):
        for key, value in pinned.items():
            cfg.env.kwargs[key] = value


def check_env_settings(cfg: DictConfig, renamed: bool = False) -> None:
    """The env's splits and constructor arguments, judged from its class without building one (a
    JVM env takes seconds to start, and its error would come from inside a worker).

    Args:
        renamed: env.name was set on the command line; a split refusal then says that the splits are
            another env config's (the user set none: `env.name=my_env:MyEnv` alone kept the default
            config's eval_split 'test').

    Raises:
        ConfigError: env.train_split / env.eval_split is not one of the class's `splits`, or
        env.kwargs names an argument its constructors do not take, or leaves out one they need.
    """
    from agentq.envs import env_class, kwargs_problem

    env = cfg.env
    cls = env_class(str(env.name))
    if cls is not None:
        for key in ("train_split", "eval_split"):
            split = env.get(key)
            if split is not None and split not in cls.splits:
                fix = "set env.train_split / env.eval_split to its splits"
                why = f" ({_other_envs_config('splits', fix)})" if renamed else ""
                raise ConfigError(f"env.{key}={split!r}: not a split of {env.name}; valid: {list(cls.splits)}{why}")
    kwargs = OmegaConf.to_container(env.kwargs, resolve=True) if env.get("kwargs") is not None else {}
    assert isinstance(kwargs, dict)
    found = kwargs_problem(str(env.name), {**kwargs, "split": env.get("train_split"),
                                           "max_steps": env.get("max_steps"), "expert": False})
    if found is None:
        return
    problem, certain = found
    if not certain:             # an __init__ that takes **kwargs may use it (kwargs.pop): say, do not refuse
        from agentq.utils.logging import console

        console.print(f"warning: env.kwargs: {problem}; fine if your env takes it from **kwargs itself",
                      style="yellow", markup=False, highlight=False, soft_wrap=True)
        return
    raise ConfigError(f"env.kwargs: {problem}. env.kwargs come with the env= config "
                      f"({_other_envs_config('kwargs')})")


def _other_envs_config(what: str, fix: str = "") -> str:
    """Why an env's `what` (its splits, its kwargs) do not fit the class env.name names: env.name set on
    another env's config (the default TextWorldExpress one) leaves the rest of that config as it was.

    Args:
        what: the settings refused, as the message names them.
        fix: how to set them on the command line, said before the other way (the env's own config).

    Returns:
        The explanation, for a refusal's parentheses.
    """
    return (f"where env.name was set on another env's config, its {what} reached this class: "
            f"{fix + ', or ' if fix else ''}pick your env's own config, env=<name>: a conf/env/<name>.yaml of its "
            "own, docs/adding-an-environment.md")


_GROUPS = ("env", "model", "rollout", "algo", "trainer", "env_pool", "placement")


def _is_group_choice(override: str) -> bool:
    return override.split("=", 1)[0] in _GROUPS


def _bad_key(msg: str, overrides: list[str]) -> str | None:
    import re

    m = re.search(r"Could not override '([^']+)'", msg) or re.search(r"Key '([^']+)'", msg)
    if m:
        key = m.group(1)
        for o in overrides:
            k = o.split("=", 1)[0].lstrip("+~")
            if k == key or k.endswith("." + key):
                return k
        return key
    return None


def resolved(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def config_leaves(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """A config's resolved values by dotted key ('env.kwargs.games': [...]); lists are leaves. Two
    configs compare setting by setting through it (a key only one side has is for the caller)."""
    node = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    if isinstance(node, dict):
        return {k: v for key, sub in node.items() for k, v in config_leaves(sub, f"{prefix}{key!s}.").items()}
    return {prefix[:-1]: node}


def in_sections(key: str, sections: tuple[str, ...]) -> bool:
    """Whether dotted `key` is one of `sections` or inside one ('env.kwargs' holds 'env.kwargs.games';
    a section ending in '.' is a prefix: 'wandb.' holds every wandb key)."""
    return any(key == s or key.startswith(s if s.endswith(".") else s + ".") for s in sections)


def drop_dotted(tree: dict, keys: Iterable[str]) -> dict:
    """`tree` (a plain nested dict, changed in place) without each dotted key of `keys` that it holds;
    keys whose sections are missing are skipped.

    Returns:
        `tree`, for chaining.
    """
    for key in keys:
        *parents, last = key.split(".")
        section: Any = tree
        for name in parents:
            section = section.get(name) if isinstance(section, dict) else None
        if isinstance(section, dict):
            section.pop(last, None)
    return tree


class _Unset:
    """A setting one of two configs does not have (its repr reads as such in messages)."""

    def __repr__(self) -> str:
        return "unset"


UNSET = _Unset()


def differing_settings(saved: Any, now: Any, compared: Callable[[str], bool],
                       default: Callable[[str], Any] | None = None) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for each `compared` setting the two configs hold
    differently, by key. A key only one side has counts inside `OPEN_SECTIONS`, where `+key=` adds
    what an env or objective reads: the other side holds `default(key)` there (what the env or
    objective takes when the config leaves it out; `UNSET` when unknown), so a key a newer config
    spells out at its default is no difference. Elsewhere it is a newer or older agentq's key and is
    not compared."""
    old, new = config_leaves(saved), config_leaves(now)
    keys = (old.keys() & new.keys()) | {k for k in old.keys() ^ new.keys() if in_sections(k, OPEN_SECTIONS)}
    out = []
    for k in sorted(keys):
        if not compared(k):
            continue
        fallback = default(k) if default is not None and not (k in old and k in new) else UNSET
        a, b = old.get(k, fallback), new.get(k, fallback)
        if a != b:
            out.append((k, a, b))
    return out


def load_yaml(path: Path) -> tuple[DictConfig | ListConfig | None, str | None]:
    """(the file's YAML, None), or (None, why it holds no YAML mapping or list); an OSError reading it
    is raised as it is."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    try:
        return OmegaConf.load(io.StringIO(text)), None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        return None, f"not YAML: {getattr(e, 'problem', None) or first_line(e)}" + (
            f" at line {mark.line + 1}" if mark is not None else "")
    except OSError:     # no file is read here: OmegaConf's "Invalid loaded object type" of a single value
        return None, "a single value, not a mapping of settings"


#: config.yaml's first and last lines (comments to YAML): a file that starts with the first and lacks
#: the last was cut short, which YAML alone cannot tell where the cut falls between two settings
CONFIG_HEADER = "# agentq run settings (written by agentq; the last line says the file is whole)"
CONFIG_FOOTER = "# end of agentq run settings"

#: the top-level keys of every config.yaml an agentq run wrote (conf/config.yaml's first version), and
#: those of them that are sections: a file without one was cut short or edited
RUN_CONFIG_KEYS = ("env", "model", "rollout", "algo", "trainer", "env_pool", "seed", "device", "dtype", "agent", "eval")
RUN_CONFIG_SECTIONS = ("env", "model", "rollout", "algo", "trainer", "env_pool", "agent", "eval")
#: where a run folder holds such a config.yaml: written at the run's start, before its first step or
#: checkpoint (a pipeline's in its stages' folders)
RUN_CONFIG_FILES = ("config.yaml", "rl/config.yaml", "sft/config.yaml")


#: env settings that say how an env runs, not what it plays (heap, timeouts, a cache folder): an
#: evaluation's folder name and trained-otherwise check and the tiny model's cache key leave them out
RUN_ONLY = ("env.kwargs.jvm_heap", "env.kwargs.jvm_opts", "env.kwargs.call_timeout_s", "env.kwargs.cache_dir")


def run_folder_state(folder: Path) -> tuple[str, str] | None:
    """What a folder with no results or checkpoint yet is, for the messages that would otherwise call
    it "not a run folder": ("held", pid) while another agentq process holds its lock (a run in
    progress), ("stopped", the run's config.yaml, relative) when a run wrote its settings and stopped
    before more, None for any other folder."""
    if not folder.is_dir():
        return None
    if (pid := lock_holder(folder)) is not None:
        return "held", pid
    settings = next((name for name in RUN_CONFIG_FILES if (folder / name).is_file()), None)
    return ("stopped", settings) if settings else None


def cut_short(path: Path) -> str | None:
    """'cut short (...)' for a run's config.yaml that starts with `CONFIG_HEADER` and has no
    `CONFIG_FOOTER` line, else None (also for files from before the two lines, or restored with
    `agentq config`, which cannot tell). Blank lines or CRLF endings after the marker are fine."""
    text = path.read_text(errors="replace")
    if text.startswith(CONFIG_HEADER) and CONFIG_FOOTER not in (line.strip() for line in text.splitlines()):
        return "cut short: its last line, the end marker, is missing"
    return None


def config_damage(saved: DictConfig | ListConfig, needs: tuple[str, ...]) -> str | None:
    """What makes a loaded config.yaml no run's (`read_run_config`), else None."""
    if not isinstance(saved, DictConfig):
        return "a list, not a mapping of settings"
    if not saved:
        return "empty"
    lacks = [k for k in needs if k not in saved]
    if lacks:
        return f"it lacks {', '.join(lacks)}"
    bad = [k for k in needs if k in RUN_CONFIG_SECTIONS and not isinstance(saved.get(k), DictConfig)]
    return f"{', '.join(bad)} not a section of settings" if bad else None


def settings_damage(path: Path, needs: tuple[str, ...]) -> tuple[DictConfig | ListConfig | None, str | None]:
    """(the file's YAML, why it is no whole run config or None): `load_yaml`, then `config_damage`
    for `needs` and `cut_short`; an OSError reading it is raised as it is."""
    saved, why = load_yaml(path)
    if saved is not None:
        why = config_damage(saved, needs) or cut_short(path)
    return saved, why


def read_settings(path: Path, needs: tuple[str, ...] = ()) -> tuple[DictConfig | None, str | None]:
    """A run's config.yaml for a reader that only warns: (its settings, None), or (None, why it is
    damaged: `load_yaml`, `config_damage` for `needs`, `cut_short`, or unreadable)."""
    try:
        saved, why = settings_damage(path, needs)
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"
    if why or not isinstance(saved, DictConfig):
        return None, why or "a list, not a mapping of settings"
    return saved, None
