"""Loading the Hydra config (conf/) with errors that list the valid choices."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    pass


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
    keys = sorted(node.keys()) if isinstance(node, DictConfig) else []
    return ".".join(path) or "<root>", keys


def load_config(overrides: list[str] | None = None, config_name: str = "config") -> DictConfig:
    """Compose conf/<config_name>.yaml (config.yaml, or pipeline.yaml for `agentq pipeline`) with
    `key=value` overrides (Hydra syntax); struct mode on."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    with initialize_config_module(config_module="agentq.conf", version_base=None):
        try:
            cfg = compose(config_name=config_name, overrides=overrides)
        except (HydraException, OmegaConfBaseException) as e:
            msg = str(e)
            if "Could not override" in msg or "Key '" in msg:
                base = compose(config_name=config_name, overrides=[o for o in overrides if "=" in o and
                                                                _is_group_choice(o)])
                bad = _bad_key(msg, overrides)
                where, keys = _valid_keys(base, bad) if bad else ("<root>", sorted(base.keys()))
                raise ConfigError(f"unknown config key {bad!r}; valid keys under {where}: {keys}") from None
            raise ConfigError(msg.split("\nConfig search path")[0]) from None
    OmegaConf.set_struct(cfg, True)
    check_config(cfg)
    return cfg


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError naming every key whose value has the wrong type or range."""
    from agentq.config_schema import config_problems

    problems = config_problems(cfg)
    if problems:
        raise ConfigError("invalid config value" + ("s" if len(problems) > 1 else "") + ":\n  "
                          + "\n  ".join(problems))


_GROUPS = ("env", "model", "rollout", "algo", "trainer", "env_pool")


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
