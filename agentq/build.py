"""The composition root: the run's components built from the config (device, model path, tokenizer,
rollout backend, env pool, agent loop, sampling), shared by the trainer (`train`, `sft`, `pipeline`,
`sweep`), the evaluation library (`agentq eval`) and the benchmark scripts.

It sits above the component packages (agent, learner, pool, rollout, ...) and below `agentq.eval`
and `agentq.trainer`, so both build the same way without importing each other (ARCHITECTURE.md).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
import re
import os
import random
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import torch
from omegaconf import DictConfig, OmegaConf

from agentq.agent import ActionParser, AgentLoop, ChatFormat, EpisodeSpec, PromptConfig, episode_seed
from agentq.config import RUN_ONLY, UNSET, ConfigError, drop_dotted, run_folder_state
from agentq.config_schema import DTYPES, PLUGIN_BACKEND, ROLLOUT_BACKENDS
from agentq.envs.base import SplitRefused, TextEnv
from agentq.kernels.quant_spec import PRESETS, QuantSpec
from agentq.pool import POOL_TYPES, EnvPool, EnvResult, EnvSpec, make_pool
from agentq.rollout.backend import RolloutBackend, SamplingParams
from agentq.utils.errors import RunAborted, first_line, raised_at
from agentq.utils.logging import console

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def device_and_dtype(cfg: DictConfig) -> tuple[torch.device, torch.dtype]:
    """`device` (cpu | cuda | cuda:N | auto) and `dtype` (`auto`: bfloat16 on any CUDA device, else float32)."""
    dev = str(cfg.device)
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda"):
        _check_cuda(dev)
    dt = cfg.dtype
    if dt == "auto":
        dt = "bfloat16" if dev.startswith("cuda") else "float32"
    if dev == "cpu" and cfg.torch_threads:
        torch.set_num_threads(int(cfg.torch_threads))
    if dev == "cpu":
        cpu_int_gemm(cfg)
    if dt not in DTYPES:
        raise ConfigError(f"dtype={dt!r}; valid: {list(DTYPES)} or auto")
    return torch.device(dev), getattr(torch, dt)


def check_learner_dtype(cfg: DictConfig) -> None:
    """Refuse float16 for a command that trains: the learner keeps its weights and AdamW's moments in
    the run's dtype, and AdamW's eps (1e-8) rounds to 0 in float16, so the first optimizer step divides
    0 by 0 wherever a gradient is 0 and writes NaN into the weights (every episode of the next RL step
    then ended on a NaN log-prob). bfloat16 has float32's range.

    Raises:
        ConfigError: dtype is float16.
    """
    if str(cfg.dtype) == "float16":         # `auto` is never float16
        raise ConfigError("dtype=float16: the learner's AdamW keeps float16 weights and moments, whose eps (1e-8) "
                          "rounds to 0 in float16, so its first step writes NaN into the weights; use "
                          "dtype=bfloat16 (float32's range) or float32")


def _check_cuda(dev: str) -> None:
    """Refuse device=cuda / cuda:N when there is no such CUDA device."""
    if not torch.cuda.is_available():
        raise ConfigError(f"device={dev} but no CUDA device is available")
    index = int(dev.split(":", 1)[1]) if ":" in dev else 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device={dev} but only {torch.cuda.device_count()} CUDA device(s) are visible")


def cpu_int_gemm(cfg: DictConfig) -> str:
    """Fix the process's CPU int8 GEMM path from `cfg.cpu_int_gemm` (once; printed the first time)."""
    from agentq.kernels import cpu_gemm

    before = cpu_gemm.describe() if cpu_gemm.is_configured() else None
    path = cpu_gemm.configure(cfg.get("cpu_int_gemm"))
    info = cpu_gemm.describe()
    if info != before:
        console.print(f"CPU int8 GEMM: {path} ({info['source']}; torch CPU capability {info['cpu_capability']})")
    return path


def config_dict(node: Any) -> dict[str, Any]:
    """A config section (resolved) as a plain dict; a null section gives {}."""
    return cast(dict[str, Any], OmegaConf.to_container(node, resolve=True) or {}) if node is not None else {}


@contextlib.contextmanager
def learner_threads(cfg: DictConfig) -> Iterator[int]:
    """Run the learner's phase with `cfg.learner_threads` intra-op threads (null: the cores idle now),
    then go back to `torch_threads` for the rollout, where the env workers need the cores."""
    before = torch.get_num_threads()
    n = cfg.get("learner_threads")
    n = int(n) if n else idle_cores()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's cpuset), not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                      # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def idle_cores(window_s: float = 0.1) -> int:
    """Usable cores that are idle right now: the host's idle share over `window_s` (/proc/stat) times
    its core count, capped to `usable_cores()`, at least 1.

    Why: OpenMP threads spin at their barriers, so a learner with one thread per core on cores that
    other processes also want runs many times slower than with fewer threads (measured: learner
    phases of 140-500 s per step instead of ~40 s when another job shared a 2-core machine).
    Called when the learner phase starts, the run's own env workers are idle, so only others count."""
    n = usable_cores()
    try:
        a = _cpu_times()
        time.sleep(window_s)
        b = _cpu_times()
    except OSError:                             # no /proc/stat: trust the affinity
        return n
    busy, idle = b[0] - a[0], b[1] - a[1]
    if busy + idle <= 0:
        return n
    idle_now = (os.cpu_count() or n) * idle / (busy + idle)
    return max(1, min(n, int(idle_now + 0.5)))


def _cpu_times() -> tuple[int, int]:
    """(busy, idle) jiffies of all cores together, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)       # idle + iowait
    return sum(v[:8]) - idle, idle


# ---------------------------------------------------------------------- environments
def env_spec(cfg: DictConfig, split: str, expert: bool = False) -> EnvSpec:
    kwargs = config_dict(cfg.env.kwargs)
    kwargs.update(split=split, max_steps=int(cfg.env.max_steps), expert=expert)
    return EnvSpec(cfg.env.name, kwargs)


def make_env(cfg: DictConfig, split: str, expert: bool = False, key: str | None = None) -> gym.Env:
    """One env of `cfg` in this process (task lists, the tiny model's corpus, task selection).
    `key`: the setting a refusal of the split names (default `split_key`'s; `agentq eval`: "split").

    Raises:
        ConfigError: the env refused its settings (a ValueError from its constructor: a bad
            env.kwargs value, a missing data folder; or an env.kwargs key no constructor takes), as
            one line naming the env (was a traceback); or refused the split (a `SplitRefused`: not
            one of its `splits`, its data missing), as `split_refused`'s `SplitError` naming `key`.
    """
    from agentq.pool.base import make_env as _make

    try:
        return _make(env_spec(cfg, split, expert))
    except ConfigError:
        raise
    except SplitRefused as e:       # not in its `splits`, or its data missing: the setting that gave it named
        raise split_refused(split, e, key or split_key(cfg, split)) from e
    except ValueError as e:
        # where it was raised, so that a bug (not a refusal) one line hides can still be found
        raise ConfigError(f"env={cfg.env.name}: {e} (raised at {raised_at(e)})") from e
    except TypeError as e:
        # an env.kwargs key no constructor takes: the config check can only warn of it when an
        # __init__ hands **kwargs on (it might pop the key itself); other TypeErrors are bugs
        m = re.search(r"(\S+\(\)) got an unexpected keyword argument '([^']+)'", str(e))
        if m is None:
            raise
        key = m[2] if m[2] in ("split", "max_steps", "expert") else f"env.kwargs.{m[2]}"
        raise ConfigError(f"env={cfg.env.name}: {m[1]} takes no argument {m[2]!r}, which {key} gives it "
                          f"(raised at {raised_at(e)})") from e


def text_env(env: gym.Env) -> TextEnv:
    """The agentq environment inside `env`'s wrappers (`agentq.envs.make` refuses any other kind)."""
    return cast(TextEnv, env.unwrapped)


def check_split_data(cfg: DictConfig, splits: list[str]) -> None:
    """Build one env of each split and list its task ids (`split_tasks`), before the model is built: an
    env that checks its data when built (ALFWorld's real games) refuses a missing one now, in one line
    (`make_env`), and one that refuses the split's task list (no task ids, a repeated id) too, not after
    the model build. Cheap: no episode is played (an env starts its engine on its first reset), and the
    run's own list (`split_tasks` again) is this listing, not a second one.

    A held-out split sharing task ids with env.train_split is said (a warning: an env may mean it, but
    its results would read as held-out ones)."""
    listed = {split: split_tasks(cfg, split) for split in dict.fromkeys(splits)}
    trained = listed.get(str(cfg.env.train_split), ())
    for split, ids in listed.items():
        warn_shared_tasks(cfg, split, ids, trained)


def warn_shared_tasks(cfg: DictConfig, split: str, ids: Sequence[str], trained: Collection[str]) -> None:
    """Say how many of `split`'s task ids are also ids of env.train_split (a warning: an env may mean it,
    but its results would read as held-out ones); nothing for the training split itself or disjoint ones.
    The start-up check (`check_split_data`) and `agentq eval` say it in these words.

    Args:
        cfg: the run's config (env.train_split, and the setting that gave `split`: `split_key`).
        split: the split evaluated.
        ids: its task ids (`split_tasks`).
        trained: the task ids of env.train_split.
    """
    train = str(cfg.env.train_split)
    trained = set(trained)
    shared = sum(task in trained for task in ids) if split != train else 0
    if shared:
        console.print(f"warning: {shared} of the {len(ids)} task ids of {split_key(cfg, split)}={split!r} are "
                      f"also ids of env.train_split={train!r}: evaluations there measure tasks training draws "
                      "from, not held-out ones (an env's _tasks gives each split its ids)", style="yellow",
                      markup=False, highlight=False, soft_wrap=True)


#: the task ids listed in this process, by `split_tasks`'s key (one listing per env setting)
_SPLIT_TASKS: dict[str, tuple[str, ...]] = {}


def split_tasks(cfg: DictConfig, split: str, key: str | None = None) -> tuple[str, ...]:
    """The task ids of `split`, listed once a process per env setting: the start-up check
    (`check_split_data`) and the run's own lists (the trainer's, SFT's, the evaluations'
    `choose_eval_tasks`) share one listing (ALFWorld's real splits read every game's files to list
    them). `key`: the setting a refusal names (default `split_key`'s; `agentq eval`: "split").

    The listing is kept under everything of `cfg` that reaches it, the env's name and the constructor
    arguments `env_spec` gives it (env.kwargs, the split, env.max_steps, expert), as sorted JSON: other
    settings list again. A refusal is not kept (every call raises it). What an env reads besides its
    arguments (an environment variable such as $ALFWORLD_DATA behind a null data_dir, its files) is
    taken as fixed for the process: `forget_split_tasks()` after changing it.

    Returns:
        the ids, as a tuple: no caller can change the list the next one gets.
    Raises:
        ConfigError: the env refused its settings (`make_env`) or the split (`split_refused`), naming
            the setting that gives `split` (`split_key`); was a traceback from the run's build, after
            the model's.
    """
    spec = env_spec(cfg, split)
    listing = json.dumps({"name": spec.name, "kwargs": spec.kwargs}, sort_keys=True, default=repr)
    if listing not in _SPLIT_TASKS:
        env = make_env(cfg, split, key=key)
        try:
            _SPLIT_TASKS[listing] = tuple(env_tasks(cfg, env, split, key))
        finally:
            env.close()
    return _SPLIT_TASKS[listing]


def forget_split_tasks() -> None:
    """Forget the task ids `split_tasks` listed in this process (after changing what an env reads
    besides its settings, e.g. $ALFWORLD_DATA or its data files)."""
    _SPLIT_TASKS.clear()


def env_tasks(cfg: DictConfig, env: gym.Env, split: str, key: str | None = None) -> list[str]:
    """The task ids of `split` of an env of `cfg` in hand (`split_tasks` lists them once a process);
    a refusal names `key` (default: `split_key`'s setting)."""
    try:
        return list(text_env(env).list_tasks(split))
    except ConfigError:
        raise
    except ValueError as e:
        raise split_refused(split, e, key or split_key(cfg, split)) from e


def split_key(cfg: DictConfig, split: str) -> str:
    """The setting that gives `split` to a run: env.train_split, env.eval_split, pipeline.eval_splits
    (a pipeline's or sweep's evaluations), else `split` (`agentq eval`'s)."""
    if str(OmegaConf.select(cfg, "env.train_split")) == split:
        return "env.train_split"
    # a pipeline evaluates its pipeline.eval_splits, each set as env.eval_split in turn
    if split in [str(s) for s in OmegaConf.select(cfg, "pipeline.eval_splits") or []]:
        return "pipeline.eval_splits"
    return "env.eval_split" if str(OmegaConf.select(cfg, "env.eval_split")) == split else "split"


class SplitError(ConfigError):
    """An env's refusal of a split, its message already naming the setting that gave the split
    (`split_refused`): a caller re-raises it as it is (`agentq eval` said "split='x': split='x': ...")."""


def split_refused(split: str, e: ValueError, key: str = "split") -> SplitError:
    """An env's refusal of `split` as the one-line error naming `key`, the setting that gave the split:
    a `SplitRefused` (the base class's: not one of its `splits`, no task ids, a repeated id; an env's
    own subclass, e.g. ALFWorld's missing games) and a one-line error already made as they read; any
    other ValueError of `list_tasks`, the env's own or a bug in its `_tasks`, with where it was raised."""
    where = "" if isinstance(e, (SplitRefused, ConfigError)) else f" (raised at {raised_at(e)})"
    return SplitError(f"{key}={split!r}: {e}{where}")


def ray_settings(cfg: DictConfig, placement: bool = True) -> list[str]:
    """The settings of `cfg` that run on Ray: env_pool=ray, and placement=colocated|split where the
    command places actors (`placement`: RL runs; `agentq eval` and `sft` never read placement.*)."""
    pool, mode = OmegaConf.select(cfg, "env_pool.type"), str(OmegaConf.select(cfg, "placement.mode", default="single"))
    return (["env_pool=ray"] if pool == "ray" else []) + ([f"placement={mode}"] if placement and mode != "single"
                                                          else [])


def check_logger_config(cfg: DictConfig) -> None:
    """Refuse a `logger` sink that cannot be built (an unknown name, wandb not installed) before a run
    folder is made: found when the sinks were built, it left config.yaml and tb/ behind, and the same
    command then found the folder holding a run. For `agentq train`, `pipeline` and `sft`.

    Raises:
        ConfigError: the sink and what to do, in one line.
    """
    from agentq.utils.logging import check_loggers
    try:
        check_loggers(cfg)
    except (ValueError, ImportError) as e:
        raise ConfigError(str(e)) from None


def check_ray_installed(cfg: DictConfig, placement: bool = True) -> None:
    """Refuse a config that runs on Ray where Ray is not installed, at start-up, before the model is
    built: `import_ray`'s one line, naming the first such setting (the pool and the placement raise
    the same line where they import Ray). `placement`: whether the command reads placement.* (an RL
    run; `agentq eval` / `sft` pass False: a train command line's placement= must not stop them).

    Raises:
        ConfigError: Ray is not installed.
    """
    from agentq.pool.ray_pool import import_ray

    for setting in ray_settings(cfg, placement)[:1]:
        import_ray(setting)


def env_pool(cfg: DictConfig, split: str, num_envs: int, expert: bool = False) -> EnvPool:
    p = cfg.env_pool
    if p.type not in POOL_TYPES:
        raise ConfigError(f"env_pool.type={p.type!r}; valid: {list(POOL_TYPES)}")
    kw: dict[str, Any] = {"address": p.address, "num_cpus": p.get("num_cpus")} if p.type == "ray" else {}
    if p.type in ("process", "ray"):
        kw["call_timeout_s"] = float(p.call_timeout_s)
    return make_pool(p.type, env_spec(cfg, split, expert), num_envs, num_workers=int(p.num_workers), **kw)


CORPUS_VERSION = 2      # 2: TextWorldExpress experts without detours


def env_corpus(cfg: DictConfig, n_episodes: int, seed: int = 0) -> list[str]:
    """Text of the env (prompts, observations, expert actions in the agent's format) for the tokenizer.

    Played in an env pool of one slot (`env_pool`), so that an env that hangs or crashes is caught by
    env_pool.call_timeout_s as in training (in this process, a hang froze the command with no output).

    Raises:
        RunAborted: an expert episode was lost (the env raised, hung or died), naming it and why.
    """
    parser = ActionParser(cfg.agent.action_tag)
    prompt = prompt_config(cfg)
    split = str(cfg.env.train_split)
    tasks = split_tasks(cfg, split)                   # an empty split: one line; the run's own listing
    rng = random.Random(seed)
    texts = [prompt.system, prompt.invalid_format]
    console.print(f"building the tiny model: its tokenizer reads {n_episodes} expert episodes of "
                  f"{cfg.env.name} ({split})", markup=False, highlight=False)

    def answer(r: EnvResult, episode: int, task: str) -> EnvResult:
        if not r.ok:
            raise RunAborted(f"building the tiny model's tokenizer corpus: expert episode {episode} ({task}) was "
                             f"lost: {first_line(r.error or '', 300)}")
        return r

    pool = env_pool(cfg, split, 1, expert=True)
    try:
        for i in range(n_episodes):
            task = tasks[rng.randrange(len(tasks))]
            r = answer(pool.reset([(0, {"seed": seed + i, "options": {"task_id": task}})])[0], i, task)
            prompt.check_fields(r.info)         # a template naming a key info lacks: one line, not a KeyError
            texts.append(prompt.render("first_turn", r.info["task"], r.obs, r.info.get("admissible_actions"), r.info))
            for turn in range(1, int(cfg.env.max_steps) + 1):
                action = r.info.get("expert_action")
                if action is None:
                    acts = r.info.get("admissible_actions") or ["look"]
                    action = acts[rng.randrange(len(acts))]
                texts.append(parser.format(action))
                r = answer(pool.step([(0, action)])[0], i, task)
                texts.append(prompt.render("next_turn", r.info["task"], r.obs, r.info.get("admissible_actions"),
                                           r.info, turn))
                if r.terminated or r.truncated:
                    break
    finally:
        pool.close()
    return texts


def setting_default(cfg: DictConfig, key: str) -> Any:
    """The value a setting under env.kwargs / algo.objective_params takes when a config leaves it
    out: the env class's constructor default, or the objective's parameter default (for comparing
    a run's saved config with one that spells the key out); `UNSET` when there is none to know."""
    from agentq.algos import objective_defaults
    from agentq.envs import constructor_defaults

    if key.startswith("env.kwargs."):
        found = constructor_defaults(str(cfg.env.name)).get(key.removeprefix("env.kwargs."), UNSET)
    elif key.startswith("algo.objective_params."):
        found = objective_defaults(str(cfg.algo.objective)).get(key.removeprefix("algo.objective_params."), UNSET)
    else:
        return UNSET
    return list(found) if isinstance(found, tuple) else found        # a config holds lists


# ---------------------------------------------------------------------- model
def check_model_path_set(cfg: DictConfig) -> None:
    """Refuse `model=hf` without `model.path` (it has no default), before anything else is probed or built."""
    if OmegaConf.is_missing(cfg.model, "path"):
        raise ConfigError("model.path is not set: give model.path=<HF checkpoint folder> (model=hf has no default)")


def model_path(cfg: DictConfig) -> str:
    """`model.path` if set (must exist), else the tiny model built for this environment."""
    check_model_path_set(cfg)
    if cfg.model.path:
        p = Path(cfg.model.path).expanduser()
        if not (p / "config.json").exists():
            if p.is_file():     # its config.json, or a weight file
                raise ConfigError(f"model.path={str(p)!r} is a file: give its folder, model.path={p.parent}")
            raise ConfigError(f"model.path={str(p)!r} is not an HF checkpoint folder (no config.json)"
                              + checkpoint_hint(p, "model.path"))
        check_architecture(cfg, str(p), "model.path")
        return str(p)
    from agentq.models.tiny import TinyModelConfig, ensure_tiny_model

    t = config_dict(cfg.model.tiny)
    n = int(t.pop("corpus_episodes"))
    # a model built here is trained at the env's lengths: its position limit is a label, not something
    # it learnt, so it covers the env's budget (WebShop's 6,144, ALFWorld's 12,288 warned at every run)
    t["max_position_embeddings"] = max(int(t["max_position_embeddings"]), int(cfg.env.max_context_tokens))
    tcfg = TinyModelConfig(**t)
    return str(ensure_tiny_model(tcfg, tiny_corpus_key(cfg), lambda: env_corpus(cfg, n, seed=tcfg.seed)))


#: where a folder that agentq wrote keeps the checkpoint a command would take: an RL run's (the last
#: step), a pipeline's RL stage's, an SFT run's, a pipeline's SFT stage's
CHECKPOINTS_INSIDE = ("checkpoints/step_*/config.json", "rl/checkpoints/step_*/config.json",
                      "checkpoint/config.json", "sft/checkpoint/config.json")


def checkpoint_hint(folder: Path, key: str) -> str:
    """The end of the error for `key`=<a folder that is no checkpoint>: the checkpoint inside it that
    was probably meant (a common slip: the run folder `agentq train`, `sft` or `pipeline` printed), or
    for a path that does not exist, that `key` takes a local folder (a hub id is not downloaded)."""
    for pattern in CHECKPOINTS_INSIDE:
        found = sorted(folder.glob(pattern))
        if found:
            return f"; a run folder? its last checkpoint is {key}={found[-1].parent}"
    if not folder.exists():
        return f"; no such folder ({key} takes a local folder: nothing is downloaded)"
    return no_checkpoint_yet(folder)


def no_checkpoint_yet(folder: Path) -> str:
    """`checkpoint_hint`'s end for a run folder with no checkpoint in it yet (the message said only
    "no config.json"): one in progress (another agentq process holds its lock) or one whose run
    stopped before saving one (its config.yaml); "" for any other folder."""
    found = run_folder_state(folder)
    if found is None:
        return ""
    kind, what = found
    state = (f"agentq process pid {what} holds it: a run in progress saves its first checkpoint later" if kind == "held"
             else "its run stopped before saving one")
    return (f"; a run folder with no checkpoint yet: {state} (an `agentq train` run saves checkpoints/step_N every "
            "trainer.save_every steps and at its end, an `agentq sft` run checkpoint/ at its end)")


def tiny_corpus_key(cfg: DictConfig) -> str:
    """What the tiny model's tokenizer corpus depends on (what env_corpus reads), as its cache key:
    not, e.g., reward penalties, which would otherwise swap the base model; the env class's source
    file (`env_code_digest`). Bump CORPUS_VERSION when an environment's text or expert changes
    outside that file (its engine, a data file). The corpus plays train_split only, so eval_split is
    left out: the pipeline, which points eval_split at its own split, gets the same base model; so are
    env.max_new_tokens (the corpus writes the expert's actions) and the `RUN_ONLY` env.kwargs (a JVM
    heap or timeout rebuilt a byte-identical model)."""
    env = config_dict(cfg.env)
    drop_dotted({"env": env}, ("env.eval_split", "env.max_new_tokens", *RUN_ONLY))
    return json.dumps({"env": env, "env_code": env_code_digest(str(cfg.env.name)),
                       "n": int(cfg.model.tiny.corpus_episodes), "action_tag": cfg.agent.action_tag,
                       "invalid_format": cfg.agent.invalid_format, "v": CORPUS_VERSION}, sort_keys=True)


def env_code_digest(name: str) -> str | None:
    """SHA-256 of the source file of the env's class (None when it cannot be found: a factory
    function, a class without a file): an env whose text or expert changed gets a new tiny model,
    where a key of its config alone kept the old tokenizer (a plugin's author edits that file)."""
    import hashlib
    import inspect

    from agentq.envs import env_class

    try:
        cls = env_class(name)
        path = inspect.getsourcefile(cls) if cls is not None else None
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except (OSError, TypeError):
        return None


def model_config(path: str | Path) -> dict[str, Any]:
    """The folder's config.json as a dict (read as JSON: no transformers class is built from it).

    Raises:
        ConfigError: config.json is not a JSON object.
    """
    f = Path(path) / "config.json"
    try:
        found = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{f} is not readable JSON ({e}): not an HF checkpoint's config") from None
    if not isinstance(found, dict):
        raise ConfigError(f"{f} holds a JSON {type(found).__name__}, not an object: not an HF checkpoint's config")
    return found


def check_architecture(cfg: DictConfig, path: str, key: str = "checkpoint") -> None:
    """Refuse, as one line naming `key`=`path` and its model_type, a checkpoint the run cannot serve,
    before anything is built: such a folder (e.g. GPT-2's) ended a run with a traceback from the
    aligned learner or the engine, with either backend.

    * rollout.backend=torch: a model_type other than Llama / Qwen2 / Qwen3, a non-SiLU MLP;
    * rollout.backend=vllm: a linear layer the aligned learner or the vLLM checkpoint export cannot
      place under the run's QuantSpecs (`check_vllm_architecture`; vLLM runs more architectures)."""
    if cfg.rollout.backend != "torch":
        if cfg.rollout.backend == "vllm":
            check_vllm_architecture(path, *quant_specs(cfg), key=key)
        # vLLM (or a backend of one's own) may run windows, dynamic RoPE and its own head tying; the
        # aligned learner does not follow it
        found = model_config(path)
        check_engine_attention(found, f"{key}={path!r}", "the aligned learner")
        check_tied_head(path, found, f"{key}={path!r}")
        return
    from agentq.rollout.torch_engine.model import SUPPORTED

    found = model_config(path)
    mt, arch = found.get("model_type"), found.get("architectures")
    if mt not in SUPPORTED:
        raise ConfigError(f"{key}={path!r} is a model_type={mt!r} checkpoint (architectures {arch}); the torch "
                          f"rollout engine runs model_type {sorted(SUPPORTED)} (the Llama / Qwen2 / Qwen3 families): "
                          "pick such a checkpoint, or rollout.backend=vllm for an architecture whose linears carry "
                          "Llama's names (q/k/v/o_proj, gate/up/down_proj), which the aligned learner quantizes "
                          "(docs/vllm.md)")
    act = found.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{key}={path!r} has hidden_act={act!r} in its config.json; the torch rollout engine "
                          "runs SiLU MLPs only (as Llama / Qwen2 / Qwen3 checkpoints have)")
    check_engine_attention(found, f"{key}={path!r}")
    check_tied_head(path, found, f"{key}={path!r}")


#: RoPE variants whose frequencies are fixed by config.json: the engine computes its cos / sin tables
#: once, transformers' dynamic variants recompute them from each sequence's length
STATIC_ROPE = (None, "default", "linear", "yarn", "llama3")


def check_engine_attention(found: dict[str, Any], said: str, who: str = "the torch rollout engine") -> None:
    """Refuse attention the rollout and the aligned learner would not compute alike: a sliding window
    (neither the torch engine nor the learner implements one; a Qwen2 folder with use_sliding_window
    ran with K3 3e-2 and no word; vLLM would run it, the learner not) and a RoPE whose frequencies
    follow the sequence length (`dynamic`: K3 1e-6 instead of 1e-14).

    Args:
        found: the folder's config.json.
        said: how the error names the folder (`key=path`).
        who: the side that cannot run it, for the message.
    """
    layers = found.get("layer_types") or []
    if found.get("use_sliding_window") or any(t != "full_attention" for t in layers):
        raise ConfigError(f"{said} uses sliding-window attention (use_sliding_window / layer_types in its "
                          f"config.json); {who} attends over the whole context: set "
                          "use_sliding_window false there if the model was trained without it (Qwen2.5 and "
                          "Qwen3 checkpoints are)")
    rope = found.get("rope_parameters") or found.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if kind not in STATIC_ROPE:
        raise ConfigError(f"{said} has RoPE type {kind!r} in its config.json; {who} runs "
                          f"{[k for k in STATIC_ROPE if k]} (frequencies fixed by the config), not ones that "
                          "change with the sequence length")


def check_tied_head(path: str, found: dict[str, Any], said: str) -> None:
    """Refuse a config.json that ties the LM head to the embedding over weights holding a different
    lm_head.weight: transformers then leaves them untied and the engine ties them, two models (K3 6e-2).
    An lm_head.weight equal to the embedding (some savers write both) is fine.

    Args:
        path: the checkpoint folder.
        found: its config.json.
        said: how the error names the folder (`key=path`).
    """
    if not found.get("tie_word_embeddings", False):
        return
    from safetensors import safe_open

    where = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            where.update({n: f for n in h.keys() if n in ("lm_head.weight", "model.embed_tokens.weight")})
    if "lm_head.weight" not in where or "model.embed_tokens.weight" not in where:
        return
    tensors = []
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        with safe_open(str(where[name]), framework="pt") as h:
            tensors.append(h.get_tensor(name))
    if not torch.equal(*tensors):
        raise ConfigError(f"{said}: its config.json ties the LM head to the embedding (tie_word_embeddings: true) "
                          "but its weights hold a different lm_head.weight; set tie_word_embeddings false in "
                          "config.json to use that head, or remove lm_head.weight from the weights")


def check_vllm_architecture(path: str, rollout: QuantSpec, learner: QuantSpec, key: str = "checkpoint") -> None:
    """Refuse, as one line naming `key`=`path`, its model_type and what agentq runs on vLLM, a model
    with a linear layer that the vLLM checkpoint export (`rollout`) or the aligned learner (`learner`)
    cannot place: their own audits (`QuantSpec.check_linears`) on the model built from config.json
    on the meta device (no weights read). Without it, `agentq train rollout.backend=vllm` at a GPT-2
    folder ended in the learner's ValueError traceback, before the export's one-line refusal."""
    from agentq.rollout.torch_engine.model import SUPPORTED

    found = model_config(path)
    said = f"{key}={path!r} is a model_type={found.get('model_type')!r} checkpoint (architectures " \
           f"{found.get('architectures')})"
    try:
        exported, learner_linears = model_linears(path)
    except (ValueError, KeyError) as e:       # transformers knows no such model_type, or no causal LM of it
        raise ConfigError(f"{said}, which transformers (the aligned learner's loader) cannot build as a causal "
                          f"LM: {first_line(e, 300)}") from None
    except (NotImplementedError, RuntimeError, ImportError) as e:
        # not buildable on the meta device (an op without a meta kernel, a missing optional package): the
        # learner and vLLM decide when they load its weights
        console.print(f"warning: {said}: its weight names were not checked before the start "
                      f"({type(e).__name__}: {first_line(e, 300)})", style="yellow", markup=False, highlight=False,
                      soft_wrap=True)
        return
    for spec, names in ((rollout, exported), (learner, learner_linears)):
        try:
            spec.check_linears(names)
        except ValueError:
            leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
            raise ConfigError(f"{said} whose weight matrices are {leaves}; with rollout.backend=vllm, agentq runs "
                              "models whose weight matrices all carry the names its QuantSpecs place ("
                              f"{[*spec.quantized_modules, *spec.ignored_modules]}: Llama's, as model_type "
                              f"{sorted(SUPPORTED)} have): pick such a checkpoint (docs/vllm.md)") from None


def model_linears(path: str) -> tuple[list[str], list[str]]:
    """(the modules the vLLM checkpoint export places as linears, the nn.Linear modules the aligned
    learner places) of the model in `path`, built from its config.json on the meta device, once per
    folder and config.json (`_linears_built`).

    Raises:
        ValueError, KeyError, NotImplementedError, RuntimeError, ImportError: the build's own error
            (`check_vllm_architecture` tells them apart), the same at every call.
    """
    found = _linears_built(str(Path(path).resolve()), (Path(path) / "config.json").read_bytes())
    if isinstance(found[0], type):          # the build's error, raised anew (a cached one kept its frames)
        raise _rebuilt(found[0], found[1])
    return list(found[0]), list(found[1])


#: what `_linears_built` catches (and `check_vllm_architecture` tells apart)
_BUILD_ERRORS = (ValueError, KeyError, NotImplementedError, RuntimeError, ImportError)


def _rebuilt(cls: type, args: tuple) -> Exception:
    """An error of `cls` from its `args`; one whose constructor takes other arguments (JSONDecodeError)
    as the first of `_BUILD_ERRORS` it is, with its text."""
    try:
        return cls(*args)
    except Exception:
        base = next(b for b in _BUILD_ERRORS if issubclass(cls, b))
        return base(f"{cls.__name__}: {args[0] if args else ''}")


@functools.lru_cache(maxsize=4)
def _linears_built(folder: str, config_json: bytes) -> tuple[tuple[str, ...], tuple[str, ...]] | tuple[type, tuple]:
    """`model_linears` of `folder`, or the error its build raised. Cached: a start checks a folder
    twice (`model_path`, then `make_backend`; `vllm_mismatch` once per preset), and each check built
    the meta model again (seconds for a large one). `config_json` (the file's bytes) is only part of
    the key: a folder rewritten with another config.json is built anew."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentq.learner.qat import linear_names
    from agentq.rollout.vllm_backend import exported_linears

    try:
        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except _BUILD_ERRORS as e:
        return type(e), e.args  # kept too: a model warned about is not built again by the next check
    tied = bool(getattr(config, "tie_word_embeddings", False))        # as `VLLMBackend` reads it
    named = ((n, p.dim()) for n, p in model.named_parameters())
    return tuple(exported_linears(named, tied)), tuple(linear_names(model))


def warn_past_positions(cfg: DictConfig, path: str) -> None:
    """Say so when env.max_context_tokens is past the model's max_position_embeddings: episodes then
    run on positions the model never saw (RoPE computes them, so nothing failed: it went on silently)."""
    n = model_config(path).get("max_position_embeddings")
    ctx = int(cfg.env.max_context_tokens)
    if isinstance(n, int) and ctx > n:
        console.print(f"warning: env.max_context_tokens={ctx} is past the model's max_position_embeddings={n} "
                      f"({path}/config.json): later turns run on positions it was not trained for; lower "
                      "env.max_context_tokens to keep episodes within them", style="yellow", markup=False,
                      highlight=False, soft_wrap=True)


def checkpoint_config(path: str) -> dict[str, Any] | None:
    """The model folder's config.json as a dict, for a command that loads the folder as a checkpoint.

    Returns:
        The dict, or None where the folder has no config.json.
    Raises:
        CheckpointError: config.json is not a JSON object (truncated, garbled), naming the file: a
            damaged checkpoint, which a resume's `reading_resume_checkpoint` completes with the way on.
    """
    from agentq.utils.checkpoint import CheckpointError

    f = Path(path) / "config.json"
    if not f.exists():
        return None
    try:
        found = json.loads(f.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        why = f"not JSON: {e}"
    else:
        if isinstance(found, dict):
            return found
        why = f"a JSON {type(found).__name__}, not an object"
    raise CheckpointError(f"config file {f} is damaged or truncated ({f.stat().st_size} bytes; {why})")


#: the files a tokenizer is loaded from (one of them at least); transformers builds an empty
#: tokenizer (one token) for a model folder without any of them, with no error
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "*.tiktoken")


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The model folder's tokenizer. Every command loads it first, so the folder is checked here:
    its weight files (a truncated one is named before anything is built), that it has a tokenizer
    at all, that the tokenizer's ids fit the model's vocabulary, and that its chat template can
    render agentq's turns (`ChatFormat`).

    Raises:
        CheckpointError: no weight or tokenizer files, a damaged weight file or config.json, or a
            tokenizer that does not load (a damaged tokenizer.json, a tokenizer_config.json without its files).
        ConfigError: a tokenizer with more ids than the model's vocab_size, or no usable chat template.
    """
    from transformers import AutoTokenizer

    from agentq.utils.checkpoint import CheckpointError, check_weight_files

    check_weight_files(path)
    # read here first: transformers reads config.json for the tokenizer's class, and a garbled one was
    # refused as "its tokenizer does not load", sending the user to the wrong file
    config = checkpoint_config(path)
    if not any(any(Path(path).glob(name)) for name in TOKENIZER_FILES):
        raise CheckpointError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save the "
                              "model's tokenizer beside its weights (tokenizer.save_pretrained(folder))")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:      # a damaged tokenizer.json, a tokenizer_config.json alone
        last = (str(e).strip().splitlines() or [""])[-1][:300]
        raise CheckpointError(f"{path}: its tokenizer does not load ({type(e).__name__}: {last}); save the "
                              "model's tokenizer again beside its weights (tokenizer.save_pretrained(folder))") from e
    vocab = config.get("vocab_size") if config is not None else None
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ConfigError(f"{path}: its tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab} "
                          "(config.json): ids past it have no embedding; is the tokenizer another model's?")
    from jinja2 import TemplateError

    try:
        ChatFormat.from_tokenizer(tokenizer)
    except TemplateError as e:      # a template that raises on agentq's messages (e.g. "System role not supported")
        raise ConfigError(f"{path}: its chat template refuses agentq's prompt, a system message and user / "
                          f"assistant turns ({type(e).__name__}: {first_line(e, 200)}); give the tokenizer a "
                          "template that takes a system message (tokenizer.chat_template) and save_pretrained it "
                          "into the folder") from None
    except ValueError as e:
        hint = (" (a base model's tokenizer may have none: set tokenizer.chat_template, e.g. ChatML, and "
                "save_pretrained it into the folder)" if getattr(tokenizer, "chat_template", None) is None else "")
        raise ConfigError(f"{path}: {e}{hint}") from None
    return tokenizer


def quant_specs(cfg: DictConfig) -> tuple[QuantSpec, QuantSpec]:
    """(rollout spec, learner spec): the learner mirrors the rollout's spec when aligned.

    `algo.learner_quant` is `aligned` (the rollout's spec), `none` (full precision), or a QuantSpec
    preset name for a partial alignment, e.g. `w8a8` against a `w8a8_kv8` rollout: the KV8 residual
    a learner that emulates only the linears cannot remove."""
    if cfg.rollout.quant not in PRESETS:
        raise ConfigError(f"rollout.quant={cfg.rollout.quant!r}; valid: {sorted(PRESETS)}")
    rollout = QuantSpec.preset(cfg.rollout.quant)
    lq = cfg.algo.learner_quant
    if lq == "aligned":
        return rollout, rollout
    if lq not in PRESETS:
        raise ConfigError(f"algo.learner_quant={lq!r}; valid: {['aligned', *sorted(PRESETS)]}")
    return rollout, QuantSpec.preset(lq)


def learner_batching(cfg: DictConfig) -> dict[str, int | None]:
    """The `Learner`'s micro-batching arguments from `cfg.trainer` (absent optional keys: None)."""
    t = cfg.trainer
    out: dict[str, int | None] = {"micro_batch_size": int(t.micro_batch_size)}
    for key in ("pack_tokens", "logprob_micro_batch_size", "logprob_pack_tokens"):
        out[key] = None if t.get(key) is None else int(t[key])
    return out


def learner_temperature(cfg: DictConfig) -> float:
    """The rollout temperature the learner scores with, so δ = log π_old − log μ compares the same
    distribution. Top-k / top-p truncation is refused for training: the learner would have to
    reproduce the engine's kept set exactly, and a token the engine kept may fall outside the
    learner's own top-k (log-prob −inf). Evaluation samples however it likes (it does not train)."""
    r = cfg.rollout
    if not float(r.temperature) > 0:
        raise ConfigError(f"rollout.temperature={r.temperature}: RL needs a sampling temperature > 0 "
                          "(greedy rollouts have no behaviour log-probs); eval.temperature=0 is fine")
    if int(r.top_k) > 0 or float(r.top_p) < 1.0:
        raise ConfigError(f"rollout.top_k={r.top_k}, rollout.top_p={r.top_p}: RL training supports "
                          "temperature-only sampling (top_k=-1, top_p=1.0), so the learner scores the exact "
                          "distribution the engine sampled from; truncation is allowed for evaluation only")
    return float(r.temperature)


def make_backend(cfg: DictConfig, path: str, device: torch.device, dtype: torch.dtype,
                 tokenizer: PreTrainedTokenizerBase | None, max_slots: int | None = None) -> RolloutBackend:
    """The rollout backend `rollout.backend` names (torch | vllm), serving the weights in `path`."""
    backend = cfg.rollout.backend
    check_rollout_backend(cfg)
    spec, _ = quant_specs(cfg)
    slots = int(max_slots or cfg.rollout.max_slots)
    check_architecture(cfg, path)           # `agentq eval checkpoint=...` meets no earlier check
    if backend not in ROLLOUT_BACKENDS:
        return plugin_backend(cfg, path, spec, device=device, dtype=dtype, tokenizer=tokenizer, max_slots=slots)
    if backend == "vllm":
        from agentq.rollout.vllm_backend import VLLMBackend

        v = cfg.rollout.vllm
        return VLLMBackend.from_pretrained(path, spec, max_slots=slots, max_len=int(cfg.env.max_context_tokens),
                                           dtype=dtype, seed=int(cfg.seed), sync=str(v.sync),
                                           gpu_memory_utilization=float(v.gpu_memory_utilization))
    from agentq.rollout.torch_engine.engine import TorchEngine

    warn_past_positions(cfg, path)
    return TorchEngine.from_pretrained(path, spec, max_slots=slots, tokenizer=tokenizer,
                                       **torch_engine_kwargs(cfg, device, dtype))


def check_rollout_backend(cfg: DictConfig) -> Any:
    """Judge `rollout.backend` without building it: torch | vllm, or a "module:Class" that imports and
    names a `RolloutBackend` subclass with `from_config` (`check_rl_config` runs it, so `agentq sweep`
    and `agentq pipeline` refuse a bad one before their SFT stage, not after it).

    Args:
        cfg: the run's composed config.
    Returns:
        The plugin's class (a RolloutBackend subclass), or None for a built-in backend.
    Raises:
        ConfigError: no such backend, a module:Class that does not import or is no such class, in one line.
    """
    name = str(cfg.rollout.backend)
    if name in ROLLOUT_BACKENDS:
        return None
    if not re.fullmatch(PLUGIN_BACKEND, name):
        raise ConfigError(f"rollout.backend={name!r}; valid: {list(ROLLOUT_BACKENDS)} or 'module:Class'")
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"rollout.backend={name!r} does not import: {type(e).__name__}: {e}") from None
    # the protocol has data members: issubclass() refuses it, the MRO says it
    if not (isinstance(cls, type) and RolloutBackend in cls.__mro__ and hasattr(cls, "from_config")):
        raise ConfigError(f"rollout.backend={name!r} is not a RolloutBackend subclass with a from_config classmethod "
                          "(docs/configuration.md, \"A rollout backend of one's own\")")
    return cls


def plugin_backend(cfg: DictConfig, path: str, spec: QuantSpec, **kw: Any) -> RolloutBackend:
    """The backend `rollout.backend="module:Class"` names: `Class.from_config(cfg, path, spec, device=,
    dtype=, tokenizer=, max_slots=)` of a `RolloutBackend` subclass, refused in one line where it does
    not import, is no such class, or serves other numerics than the run's rollout spec (`quant`)."""
    name = str(cfg.rollout.backend)
    cls = check_rollout_backend(cfg)
    assert cls is not None          # make_backend calls it for a module:Class name only
    backend = cls.from_config(cfg, path, spec, **kw)
    quant = getattr(backend, "quant", None)
    if quant != spec:
        said = repr(quant.describe() if isinstance(quant, QuantSpec) else quant)
        raise ConfigError(f"rollout.backend={name!r} serves quant {said}, not the run's "
                          f"rollout.quant={cfg.rollout.quant!r}: the learner would align to numerics the rollouts "
                          "do not have")
    return backend


def torch_engine_kwargs(cfg: DictConfig, device: torch.device | str, dtype: torch.dtype) -> dict:
    """`TorchEngine` arguments from the config besides the weights, slots and tokenizer (one home for
    the in-process backend and the Ray rollout workers)."""
    from agentq.rollout.torch_engine.prefill_graphs import DEFAULT_MAX_GRAPHS, DEFAULT_MAX_TOKENS

    r = cfg.rollout
    return {"max_len": int(cfg.env.max_context_tokens), "dtype": dtype, "device": device,
            "prefill_chunk": int(r.prefill_chunk), "sampler": str(r.get("sampler", "auto")),
            "cuda_graphs": bool(r.get("cuda_graphs", True)), "run_ahead": bool(r.get("run_ahead", True)),
            "share_prefill": bool(r.get("share_prefill", True)),
            "prefill_graph_tokens": int(r.get("prefill_graph_tokens", DEFAULT_MAX_TOKENS)),
            "prefill_graph_max": int(r.get("prefill_graph_max", DEFAULT_MAX_GRAPHS))}


# ---------------------------------------------------------------------- agent loop
def prompt_config(cfg: DictConfig) -> PromptConfig:
    p = cfg.env.prompt
    return PromptConfig(system=p.system, first_turn=p.first_turn, next_turn=p.next_turn, actions=p.actions,
                        max_obs_chars=int(p.max_obs_chars), invalid_format=cfg.agent.invalid_format)


def sampling_params(cfg: DictConfig, chat: ChatFormat, temperature: float | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=float(r.temperature if temperature is None else temperature),
                          top_p=float(r.top_p), top_k=int(r.top_k), max_new_tokens=int(cfg.env.max_new_tokens),
                          stop_token_ids=chat.stop_token_ids, stop=action_stop(cfg))


def action_stop(cfg: DictConfig) -> tuple[str, ...]:
    """The closing action tag as a stop string (agent.stop_at_action_end): the turn ends with its
    action, so nothing the policy writes after it enters the history."""
    return (ActionParser(cfg.agent.action_tag).close,) if cfg.agent.stop_at_action_end else ()


def agent_loop(cfg: DictConfig, pool: EnvPool, chat: ChatFormat, sampling: SamplingParams, max_concurrent: int,
               run_seed: int) -> AgentLoop:
    return AgentLoop(pool, chat, prompt_config(cfg), ActionParser(cfg.agent.action_tag), sampling,
                     max_turns=int(cfg.env.max_steps), max_context_tokens=int(cfg.env.max_context_tokens),
                     max_concurrent=max_concurrent, invalid_action_penalty=float(cfg.agent.invalid_action_penalty),
                     inadmissible_action_penalty=float(cfg.agent.inadmissible_action_penalty),
                     run_seed=run_seed)


def episode_specs(tasks: list[str], split: str, seed: int, first_id: int = 0, group_size: int = 1) -> list[EpisodeSpec]:
    """The episodes that play `tasks`: `group_size` of each task in a row (one GRPO group per task),
    numbered from `first_id`, each seeded from (`seed`, its id) so a replay plays the same episode.

    Args:
        tasks: task ids, one group each (repeat a task in `tasks` to give it several groups).
        split: the split every episode resets into.
        seed: the run's seed (`episode_seed(seed, episode_id)` is the episode's).
        first_id: the first episode id (ids are unique across a run's calls).
        group_size: episodes per task.

    Returns:
        `len(tasks) * group_size` specs, `group_id` = the task's index in `tasks`.
    """
    return [EpisodeSpec(eid, task, split, group_id=g, seed=episode_seed(seed, eid))
            for g, task in enumerate(tasks)
            for eid in range(first_id + g * group_size, first_id + (g + 1) * group_size)]
