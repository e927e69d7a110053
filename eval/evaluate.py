"""Evaluating a policy on a held-out split: `agentq eval checkpoint=<dir> env=<env> split=<split>`.

Plays every task of the split, or a seeded sample of `eval.num_tasks` stratified by task type
(`selection.py`; the report's `task_selection` says which), with the rollout numerics of the config (so W8A8-KV8 and bf16 deployment can be compared), and reports
success rate (with a 95 % interval), mean score, mean turns of successful episodes, the share of
episodes that hit the step cap, and per-task-type success.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from pathlib import Path
from typing import IO, Any, Callable

from omegaconf import DictConfig, OmegaConf

from agentq import build
from agentq.agent import AgentLoop, BackendPolicy, ChatFormat
from agentq.agent.loop import Policy
from agentq.agent.trajectory import Trajectory
from agentq.config import (RUN_CONFIG_KEYS, RUN_ONLY, ConfigError, differing_settings, drop_dotted, in_sections,
                           load_config, load_yaml, make_setting_dir, quant_name, read_settings)
from agentq.pool import EnvPool
from agentq.rollout.backend import RolloutBackend, SamplingParams
from agentq.utils.errors import first_line, says_where_on_stop
from agentq.utils.folder_lock import lock_folder, removed_if_left_empty
from agentq.utils.logging import console, progress
from agentq.utils.run_folders import folder_owners, whose_run

from .episodes import EPISODES_SHA256, recover_eval_pair, write_eval_pair
from .metrics import counts_since, summarize, worker_counts
from .partial import PartialEpisodes, fingerprint
from .replays import replays_record, replays_text, train_openings
from .selection import TaskSelection, select_tasks


def choose_eval_tasks(cfg: DictConfig, split: str, num_tasks: int | None, key: str | None = None) -> TaskSelection:
    """The tasks of `split` an evaluation plays: all, or `num_tasks` stratified by task type
    (`eval.selection`, seeded by `seed`, so every evaluation of a run plays the same tasks). The ids
    are `build.split_tasks`'s (a run's start-up check listed them already); `key`: the setting a
    refusal names (`build.split_tasks`)."""
    tasks = list(build.split_tasks(cfg, split, key))
    env = build.make_env(cfg, split)            # its task_type (an env is built without listing)
    try:
        u = build.text_env(env)
        selection = select_tasks(tasks, num_tasks, getattr(u, "task_type", None),
                                 seed=int(cfg.seed), method=str(cfg.eval.get("selection", "stratified")))
        selection.data_folder = u.data_folder(split)
        return selection
    finally:
        env.close()


#: the first episode id of every evaluation: clear of a run's training ids, which share the
#: trainer's engine (it keeps per-episode state by id until an episode is released)
EVAL_FIRST_ID = 10**9


def eval_seed(cfg: DictConfig) -> int:
    """The seed of every evaluation of `cfg` (episode seeds and the agent loop's): `seed` + 1, apart
    from the training episodes' seeds. `agentq eval`, the trainer's and the pipeline's evaluations
    all use it with `EVAL_FIRST_ID`, so an evaluation inside training and `agentq eval` of its
    checkpoint play the same episodes, sampling seeds included (temperature > 0)."""
    return int(cfg.seed) + 1


def repeat_tasks(tasks: list[str], repeats: int = 1) -> list[str]:
    return [t for t in tasks for _ in range(int(repeats))]


def run_episodes(loop: AgentLoop, policy: Policy, tasks: list[str], split: str, seed: int, first_id: int = 0,
                 description: str = "eval", partial: PartialEpisodes | None = None) -> list[Trajectory]:
    """One episode of each task (ids from `first_id`), with a progress bar counting the wins (a plain
    line every so often where the output is not a terminal, `progress`); with `partial`, the episodes
    a stopped run finished are taken from it and each new one is added to it."""
    specs = build.episode_specs(tasks, split, seed, first_id)
    earlier = partial.done if partial is not None else {}
    with progress(transient=True) as prog:
        won, played = [sum(t.won for t in earlier.values())], [len(earlier)]
        task = prog.add_task(description, total=len(specs), completed=played[0], info=won_text(won[0], played[0]))

        def done(t: Trajectory) -> None:
            if partial is not None:
                partial.append(t)
            won[0] += int(t.won)
            played[0] += 1
            prog.update(task, advance=1, info=won_text(won[0], played[0]))
        new = loop.run([s for s in specs if s.episode_id not in earlier], policy, on_done=done)
    return sorted([*earlier.values(), *new], key=lambda t: t.episode_id)


def won_text(won: int, played: int) -> str:
    """The wins so far of an evaluation's progress bar, e.g. "won 12 (40 %)" of 30 episodes played."""
    return f"won {won}" + (f" ({100 * won / played:.0f} %)" if played else "")


def evaluate_policy(cfg: DictConfig, backend: RolloutBackend, pool: EnvPool, chat: ChatFormat, selection: TaskSelection, split: str,
                    out: Path, *, seed: int, max_concurrent: int, first_id: int = EVAL_FIRST_ID, repeats: int = 1,
                    description: str = "eval", warn_replays: bool = True, partial: PartialEpisodes | None = None,
                    **header: Any) -> dict:
    """Play the selected tasks of `split` with `backend` (sampling at `eval.temperature`), write
    `eval.json` and `episodes.jsonl` to `out`, and return the report. The one evaluation of
    `agentq eval`, the trainer's periodic and final evaluations and the pipeline's.

    Args:
        backend: the rollout backend that plays (its current weights).
        pool: env workers whose resets may name `split` (the trainer passes its training pool).
        selection: the tasks (`choose_eval_tasks`), each played `repeats` times.
        warn_replays: print the warning for held-out tasks that open as a training task does (eval.json
            records them either way; the trainer says it at the first evaluation of a selection only).
        partial: the finished episodes of a stopped `agentq eval` with these settings (`eval/partial.py`),
            taken as they are, and where each new one is added.
        seed: the evaluation's seed (episode seeds and the agent loop's; `eval_seed(cfg)`).
        max_concurrent: episodes in flight at most (also capped by the number of episodes).
        first_id: the first episode id (`EVAL_FIRST_ID`: clear of the training ids).
        header: leading report keys (e.g. `step`, `checkpoint`).

    Returns:
        The report: header, env, split, numerics, `sampling` (`sampling_record`), `task_selection` and
        `metrics.summarize`'s keys (an episode that errored counts as lost, in its task type's row too)
        and `episodes_sha256` (of its episodes.jsonl: `episodes.read_eval` checks the pair); in memory
        also `out_dir` (the paired tests read every episode from its episodes.jsonl), which eval.json
        leaves out; and the env and rollout workers restarted while it played, with the episodes whose
        reset was retried on a restarted env worker (`metrics.worker_counts`: the pool's and backend's
        counts are the run's, this is their growth during the evaluation).
    """
    tasks = repeat_tasks(selection.tasks, repeats)
    sampling = build.sampling_params(cfg, chat, cfg.eval.temperature)
    loop = build.agent_loop(cfg, pool, chat, sampling, min(max_concurrent, len(tasks)), run_seed=seed)
    before = worker_counts(pool, backend)
    trajs = run_episodes(loop, BackendPolicy(backend), tasks, split, seed, first_id, description, partial)
    restarts = counts_since(before, worker_counts(pool, backend))
    for t in trajs:     # errored at reset: no info from the env, but its task's type is known
        if t.info.get("task_type") is None and t.task_id in selection.types:
            t.info["task_type"] = selection.types[t.task_id]
    report = {**header, "env": cfg.env.name, "split": split, "rollout_quant": cfg.rollout.quant,
              "rollout_backend": cfg.rollout.backend, "temperature": float(cfg.eval.temperature),
              "sampling": sampling_record(sampling, seed, repeats), "limits": limits_record(cfg),
              "env_kwargs": env_kwargs_record(cfg),
              "task_selection": selection.to_dict(), **summarize(trajs), **restarts}
    add_replays(cfg, report, trajs, split, warn_replays)
    write_eval(out, report, trajs)
    return report


def add_replays(cfg: DictConfig, report: dict, trajs: list[Trajectory], split: str, warn: bool) -> None:
    """The held-out tasks that open as a training task does (TextWorldExpress coin's test seeds
    20480-20999) into `report["replays_train"]`, said where `warn`."""
    replays = (replays_record(trajs, train_openings(cfg, report["env_kwargs"]), str(cfg.env.train_split))
               if split != str(cfg.env.train_split) else None)
    if replays is not None:
        report["replays_train"] = replays
        if warn:
            console.print(replays_text(replays), style="yellow", markup=False, highlight=False, soft_wrap=True)


def sampling_record(sampling: SamplingParams, seed: int, repeats: int) -> dict:
    """How an evaluation's actions were decoded, for eval.json: temperature (0: greedy, whatever top_p
    and top_k say), top_p and top_k (the rollout's: `eval.temperature` alone is the evaluation's own, and
    a truncated sampler is another policy), the turn's token budget, the evaluation seed every episode's
    sampling seed derives from (with its episode id) and the episodes per task."""
    return {"temperature": float(sampling.temperature), "greedy": sampling.temperature == 0,
            "top_p": float(sampling.top_p), "top_k": int(sampling.top_k), "max_new_tokens": int(sampling.max_new_tokens),
            "seed": int(seed), "repeats": int(repeats)}


def env_kwargs_record(cfg: DictConfig) -> dict:
    """What the episodes played, for eval.json: env.kwargs as the run resolved them (a data folder
    from $WEBSHOP_DATA or $ALFWORLD_DATA included: `pin_env_kwargs`), without `RUN_ONLY`'s keys (how
    the env ran: JVM heap, timeouts, a cache folder)."""
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) if cfg.env.get("kwargs") is not None else {}
    assert isinstance(kwargs, dict)
    return {str(k): v for k, v in kwargs.items() if not in_sections(f"env.kwargs.{k!s}", RUN_ONLY)}


def limits_record(cfg: DictConfig) -> dict:
    """What bounded an evaluation's episodes, for eval.json: the step cap (`cap_rate` is the share that
    reached it; a checkpoint may be evaluated under another cap than it trained with) and the context
    budget (an episode past it ends with end_reason "context")."""
    return {"max_steps": int(cfg.env.max_steps), "max_context_tokens": int(cfg.env.max_context_tokens)}


def evaluate(cfg: DictConfig, overrides: list[str] | None = None) -> dict:
    """`agentq eval`: the checkpoint (or the model) on `split` (default env.eval_split); prints the report.
    `overrides`: the command line (None when another command evaluates, e.g. the pipeline's stages)."""
    build.check_ray_installed(cfg, placement=False)   # env_pool=ray without Ray: one line before anything is built
    split = cfg.split or cfg.env.eval_split
    chosen = cfg.checkpoint or cfg.model.get("path")
    if overrides is not None and chosen:        # before any split is listed: one of the env it would not play
        refuse_another_env_unasked(cfg, Path(str(chosen)).expanduser(), overrides)
    if overrides is not None:   # a pipeline's or sweep's start-up check (`build.check_split_data`) said it
        warn_if_sharing_training_tasks(cfg, split)
    # listed first where the default folder's name needs it: "-nN" only for a sample smaller than the split
    selection = eval_tasks(cfg, split) if cfg.eval.num_tasks is not None and not cfg.eval.out_dir else None
    out, out_key = eval_out_path(cfg, split, overrides, selection)
    if cfg.eval.out_dir:
        check_not_a_run_folder(out, out_key)
    # taken by `_evaluate` before its recovery of an existing folder, which must not undo another eval's write
    held = OutputLock(out, chosen=bool(cfg.eval.out_dir), own_command=overrides is not None)
    try:
        return _evaluate(cfg, overrides, split, out, out_key, held, selection)
    finally:
        held.close()


def eval_tasks(cfg: DictConfig, split: str) -> TaskSelection:
    """`choose_eval_tasks` of `agentq eval` (`eval.num_tasks`), a refusal of the split naming `split`.

    Raises:
        ConfigError: the env refused the split (unknown, empty, its data missing: a `build.SplitError`
            naming `split=`) or its settings (`build.make_env`'s, naming the env: "split=" in front of
            it blamed the split for, e.g., a bad env.kwargs value).
    """
    return choose_eval_tasks(cfg, split, cfg.eval.num_tasks, key="split")


def check_not_a_run_folder(out: Path, out_key: str) -> None:
    """Refuse an output folder that holds another command's run (`agentq.utils.run_folders.MARKERS`): an
    evaluation wrote its eval.json and episodes.jsonl beside a train run's or a pipeline's files.

    Raises:
        ConfigError: naming the command whose folder it is and what says so.
    """
    for owners, names in folder_owners(out):
        if "eval" not in owners:
            raise ConfigError(f"{out_key}={str(out)!r} holds an {whose_run(owners)} run ({', '.join(names)}), not an "
                              f"`agentq eval` one: pick another {out_key}")


class OutputLock:
    """`agentq eval`'s hold on its output folder (`lock_folder`), taken once the folder exists: two
    evaluations with the same settings wrote the same temporary files, and the start-up recovery of
    one could undo the other's renames."""

    def __init__(self, out: Path, chosen: bool = False, own_command: bool = True) -> None:
        """`out`: the folder; `chosen`: given as eval.out_dir (then anything may hold it, not only an
        evaluation with the same settings, whose default folder name this is otherwise);
        `own_command`: `agentq eval` itself, which reads eval.out_dir (a pipeline's or sweep's
        evaluation refuses it: its message only says to wait)."""
        self.out, self.chosen, self.own_command = out, chosen, own_command
        self.file: IO | None = None

    def take(self) -> None:
        """Lock the folder if it exists and is not held yet.

        Raises:
            ConfigError: another agentq process holds it (naming its pid).
        """
        if self.file is None and self.out.is_dir():
            holder = "it holds the folder" if self.chosen else "an evaluation with the same settings is writing there"
            advice = "wait for it, or give eval.out_dir=<another folder>" if self.own_command else "wait for it"
            self.file = lock_folder(self.out, lambda pid: ConfigError(
                f"{self.out} is in use by another agentq process (pid {pid}): {holder}; {advice}"),
                what="output folder", fix="set eval.out_dir to a writable folder")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _evaluate(cfg: DictConfig, overrides: list[str] | None, split: str, out: Path, out_key: str,
              held: OutputLock, selection: TaskSelection | None) -> dict:
    """`evaluate` with its output folder held (`held`, taken again once the folder is made); `selection`:
    the tasks, where `evaluate` listed them already."""
    # first, the pair a kill cut short put back (`recover_eval_pair`): this command writes the folder, and
    # until its write readers (`agentq report`) found no eval.json there; the folder held first
    held.take()
    if out.is_dir():
        recover_eval_pair(out)
    path = evaluated_model(cfg, out, overrides or [])
    device, dtype = build.device_and_dtype(cfg)
    warn_if_trained_otherwise(cfg, Path(path))
    warn_if_training_split(cfg, split)
    if selection is None:
        selection = eval_tasks(cfg, split)
    chat = ChatFormat.from_tokenizer(build.load_tokenizer(path))
    n_episodes = len(selection.tasks) * int(cfg.eval.repeats)
    n_conc = min(n_episodes, int(cfg.rollout.max_slots), int(cfg.trainer.max_concurrent))
    engine = build.make_backend(cfg, path, device, dtype, chat.tokenizer, max_slots=n_conc)
    pool = build.env_pool(cfg, split, n_conc)
    # a stop (Ctrl-C, a worker given up on) says that an earlier evaluation there is kept; a folder this
    # one made and wrote nothing into goes
    partial: PartialEpisodes | None = None
    try:
        with says_where_on_stop(lambda: stopped_text(out, partial)), removed_if_left_empty(out):
            # made once nothing can refuse the evaluation (an unknown split or unreadable weights left an
            # empty eval-<env>-<split> folder in the checkpoint), before anything is played: a path that
            # cannot be made fails now
            make_setting_dir(out, out_key, "evaluation's output folder")
            held.take()
            note_replaced(out, same_settings=not cfg.eval.out_dir)
            # `agentq eval`'s own command only: a pipeline's stage starts over with the pipeline
            partial = open_partial(cfg, out, path, selection, (device, dtype)) if overrides is not None else None
            # the trainer's seeding (eval_seed, EVAL_FIRST_ID): the same episodes as its evaluations
            report = evaluate_policy(cfg, engine, pool, chat, selection, split, out, seed=eval_seed(cfg),
                                     max_concurrent=n_conc, repeats=int(cfg.eval.repeats),
                                     description=f"eval {cfg.env.name}/{split}", partial=partial,
                                     checkpoint=str(Path(path).resolve()))
            if partial is not None:
                partial.discard()
    finally:
        pool.close()
        if partial is not None:
            partial.close()
    print_report(report)
    console.print(f"eval.json and episodes.jsonl in {out}", markup=False, highlight=False, soft_wrap=True)
    check_errors(cfg, report)
    check_unplayed(cfg, report)
    return report


def evaluated_model(cfg: DictConfig, out: Path, overrides: list[str]) -> str:
    """The folder `agentq eval` loads: `checkpoint`, else the model of `model.path` (or the tiny model),
    said in one line with where the results go (the table alone did not say an untrained model played).

    Args:
        overrides: the command line: `checkpoint=` and `model.path=` both on it are refused (a model
            preset's path, or the pipeline evaluating its SFT checkpoint of a model.path run, are not).
    Raises:
        ConfigError: not an HF checkpoint folder (with the checkpoint probably meant), or both
            `checkpoint` and a `model.path` given (the second was ignored without a word).
    """
    given = None if OmegaConf.is_missing(cfg.model, "path") else cfg.model.path
    typed = {o.split("=", 1)[0].lstrip("+") for o in overrides if "=" in o}
    if cfg.checkpoint and given and {"checkpoint", "model.path"} <= typed:
        raise ConfigError(f"checkpoint={str(cfg.checkpoint)!r} and model.path={str(given)!r} both given: agentq eval "
                          "evaluates the checkpoint and would ignore model.path; give one of them")
    path = cfg.checkpoint or build.model_path(cfg)
    if not (Path(path) / "config.json").exists():
        raise ConfigError(f"checkpoint={path!r} is not an HF checkpoint folder (no config.json)"
                          + latest_checkpoint_hint(Path(path)))
    if not cfg.checkpoint:
        what = (f"the model of model.path={str(given)!r}" if given else
                f"the untrained (random-init) tiny model built for this environment, {path}")
        console.print(f"no checkpoint= given: evaluating {what}; eval.json and episodes.jsonl go to {out}",
                      markup=False, highlight=False, soft_wrap=True)
    return str(path)


#: settings that say how an evaluation runs, not what it plays (episodes are seeded by their ids, in
#: any env pool): a stopped evaluation continues under others
HOW_IT_RUNS = ("env_pool", "logger", "wandb", *RUN_ONLY)
#: where the results go (eval.out_dir) and the checkpoint as written, relative or not (`fingerprint`
#: takes its resolved path) are not fingerprinted either
NOT_FINGERPRINTED = ("eval.out_dir", "checkpoint", *HOW_IT_RUNS)


def run_settings(cfg: DictConfig) -> dict:
    """The resolved settings that decide an evaluation's episodes (`partial.fingerprint`): all of them
    but `NOT_FINGERPRINTED`."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(settings, dict)
    return drop_dotted(settings, NOT_FINGERPRINTED)


def open_partial(cfg: DictConfig, out: Path, path: str, selection: TaskSelection, device: tuple[Any, Any]
                 ) -> PartialEpisodes:
    """The finished episodes of a stopped `agentq eval` of these settings in `out` (`eval/partial.py`),
    keyed by the resolved settings and device, the env class's source file (an env fixed between the
    stop and the rerun plays other episodes: `build.env_code_digest`), the checkpoint `path`, the tasks
    as played and the files of the folder the env reads them from (`TextEnv.data_folder`, else
    env.kwargs.data_dir)."""
    folder = selection.data_folder or OmegaConf.select(cfg, "env.kwargs.data_dir", default=None)
    settings = {**run_settings(cfg), "device": [str(d) for d in device],
                "env_code": build.env_code_digest(str(cfg.env.name))}
    key = fingerprint(settings, path, repeat_tasks(selection.tasks, int(cfg.eval.repeats)), folder)
    return PartialEpisodes(out, key, resume=resume_text(cfg, out))


def resume_text(cfg: DictConfig, out: Path) -> str:
    """How to go on with a stopped evaluation: its folder is named by its settings, or (no checkpoint=,
    no eval.out_dir) by the time it started, which a rerun does not find."""
    return ("the same command plays the rest" if cfg.eval.out_dir or cfg.checkpoint else
            f"the same command with eval.out_dir={out} plays the rest")


def stopped_text(out: Path, partial: PartialEpisodes | None) -> str:
    """A stopped `agentq eval`'s last words: the earlier evaluation kept, the finished episodes kept."""
    return "; ".join(x for x in (kept_text(out), partial.kept_text() if partial is not None else "") if x)


def kept_text(out: Path) -> str:
    """What a stopped evaluation left in `out`: an earlier one's pair, which it replaces only once it
    has played every episode (`note_replaced` said it would)."""
    return f"the earlier evaluation in {out} is kept as it was" if (out / "eval.json").is_file() else ""


def note_replaced(out: Path, same_settings: bool) -> None:
    """Say when `out` holds an earlier evaluation, which this one's eval.json and episodes.jsonl replace
    (a rerun replaced its own without a word: the earlier numbers were gone before the user knew).

    Args:
        same_settings: `out` is the default folder of these settings (else eval.out_dir named it).
    """
    if not (out / "eval.json").is_file():
        return
    try:
        episodes = f"{int(json.loads((out / 'eval.json').read_text())['episodes'])} episodes, "
    except (OSError, ValueError, TypeError, KeyError):        # unreadable or not agentq's: replaced all the same
        episodes = ""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime((out / "eval.json").stat().st_mtime))
    console.print(f"this evaluation replaces the earlier one{' with the same settings' if same_settings else ''} in "
                  f"{out} ({episodes}written {when}); eval.out_dir=<another folder> keeps both",
                  markup=False, highlight=False, soft_wrap=True)


def check_errors(cfg: DictConfig, report: dict) -> None:
    """Say when episodes errored (the environment failed, not the policy; they count as lost), and
    refuse an evaluation whose every episode errored: its 0 % is the environment's, and a run that
    ends well would pass it off as the policy's.

    Args:
        cfg: the evaluation's config (its env.name is named).
        report: `evaluate_policy`'s report (`errors`, `episodes`, `first_error`, `out_dir`).
    Raises:
        ConfigError: every episode errored (after eval.json and episodes.jsonl were written).
    """
    def messages(n_err: int, n: int) -> tuple[str, str]:
        first = first_line(report.get("first_error"), 300) or "?"
        where = (f"first: {first}; every error's traceback is under \"error\" in "
                 f"{Path(report['out_dir']) / 'episodes.jsonl'}")
        return (f"env.name={cfg.env.name!r}: all {n} episodes errored, so the evaluation says nothing about the "
                f"policy; {where}",
                f"warning: {n_err} of {n} episodes errored (the environment failed; they count as lost in the "
                f"success rate); {where}")
    _refuse_or_warn(report, "errors", 0, messages)


def check_unplayed(cfg: DictConfig, report: dict) -> None:
    """Say when episodes ended before their first turn because the first prompt does not fit
    env.max_context_tokens (they count as lost; the table alone read as a policy that wins nothing),
    and refuse an evaluation where no episode was played.

    Raises:
        ConfigError: no episode played a turn (after eval.json and episodes.jsonl were written).
    """
    def messages(n_out: int, n: int) -> tuple[str, str]:
        why = (f"their first prompt does not fit env.max_context_tokens={cfg.env.max_context_tokens} (raise it, or "
               "shorten env.prompt / env.prompt.max_obs_chars)")
        return (f"none of the {n} episodes played a turn ({n_out} ended before it: {why})",
                f"warning: {n_out} of {n} episodes ended before their first turn (counted as lost): {why}")
    # the episodes that errored played no turn either (`check_errors` warned of them)
    _refuse_or_warn(report, "unplayed", int(report.get("errors") or 0), messages)


def _refuse_or_warn(report: dict, key: str, also_lost: int, messages: Callable[[int, int], tuple[str, str]]) -> None:
    """What `check_errors` and `check_unplayed` share. Nothing when no episode of the report is
    counted under `key`; a ConfigError when those and `also_lost` other lost episodes are all the
    report's episodes (the evaluation says nothing about the policy); else a warning.

    Args:
        messages: (the refusal, the warning), of the `key` count and the episodes; called only
            when the count is not 0.
    """
    n_lost, n = int(report.get(key) or 0), int(report["episodes"])
    if not n_lost:
        return
    refusal, warning = messages(n_lost, n)
    if n_lost + also_lost == n:
        raise ConfigError(refusal)
    console.print(warning, style="yellow", markup=False, highlight=False, soft_wrap=True)


#: settings that define the task and the turn's format: a checkpoint evaluated under others than it
#: trained with plays another game or reads another prompt (budgets such as env.max_steps or
#: env.max_new_tokens, and the splits, are left out: evaluating with others is a choice)
TRAINED_WITH = ("env.name", "env.kwargs", "env.prompt", "agent.action_tag", "agent.stop_at_action_end")
#: the rollout numerics an RL run sampled its episodes with (its config.yaml; its checkpoints' agentq.json
#: records rollout.quant as "rollout_quant"): a checkpoint evaluated on another engine is measured under
#: numerics it never trained with, which may be the point (a QAT policy in bf16) but is said. An SFT
#: checkpoint sampled nothing: not compared there
SAMPLED_WITH = ("rollout.quant", "rollout.backend")


#: env.kwargs that say how an environment runs, not what it plays (memory, timeouts, a cache folder):
#: another value at evaluation is no other task, and warning of it sent the user to the run's config


def trained_otherwise(cfg: DictConfig, checkpoint: Path) -> tuple[Path | None, list[str]]:
    """(the config.yaml of the run `checkpoint` belongs to, 'key: trained A, now B' for each
    `TRAINED_WITH` setting it holds otherwise than `cfg`, `RUN_ONLY` left out). Another env.name is
    said alone (every env.kwargs and env.prompt key of two environments differs). Outside a run
    folder, the environment the checkpoint's agentq.json names (`trained_env`); (None, []) when
    neither is known; a damaged config.yaml is said so (in a warning) and read as none."""
    rl = checkpoint.parent.name == "checkpoints"
    run_cfg = run_config_of(checkpoint)
    if run_cfg is None:
        return trained_env(cfg, checkpoint)
    saved, why = read_settings(run_cfg, RUN_CONFIG_KEYS)
    if saved is None:
        console.print(f"warning: {run_cfg} is damaged ({why}): the settings this checkpoint was trained with are "
                      "not compared with this evaluation's", style="yellow", markup=False, highlight=False,
                      soft_wrap=True)
        return trained_env(cfg, checkpoint)
    compared = TRAINED_WITH + (SAMPLED_WITH if rl else ())
    diffs = differing_settings(saved, cfg, lambda k: in_sections(k, compared) and not in_sections(k, RUN_ONLY),
                               default=lambda k: build.setting_default(cfg, k))
    other_env = [f"env.name: trained {then!r}, now {now!r} (another environment: its env.kwargs and env.prompt "
                 "differ too)" for k, then, now in diffs if k == "env.name" and not same_env_class(then, now)]
    # two names of one class (`module:Class` in training, its preset's name now): what else differs
    said = [f"{k}: trained {then!r}, now {now!r}" for k, then, now in diffs
            if k != "env.name" and (not other_env or in_sections(k, SAMPLED_WITH))]
    return run_cfg, other_env + said


def run_config_of(checkpoint: Path) -> Path | None:
    """The config.yaml of the run `checkpoint` is in: an RL run's <run>/checkpoints/step_N, an SFT run's
    <run>/checkpoint; None for a checkpoint elsewhere (copied out) or a run folder without the file."""
    run = (checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else
           checkpoint.parent if checkpoint.name == "checkpoint" else None)
    return run / "config.yaml" if run is not None and (run / "config.yaml").is_file() else None


def checkpoint_meta(checkpoint: Path) -> dict:
    """What agentq wrote into a checkpoint's agentq.json (env, algo, step, an RL checkpoint's
    rollout_quant); {} for a plain HF checkpoint, or a file that is unreadable or not an object."""
    try:
        meta = json.loads((checkpoint / "agentq.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def trained_env_name(checkpoint: Path) -> tuple[Path, str] | None:
    """(where it is written, the env.name) of the environment `checkpoint` was trained on: its run's
    config.yaml, else its agentq.json; None where neither says (a damaged file says nothing)."""
    run_cfg = run_config_of(checkpoint)
    saved = read_settings(run_cfg, RUN_CONFIG_KEYS)[0] if run_cfg is not None else None
    name = OmegaConf.select(saved, "env.name", default=None) if saved is not None else None
    if run_cfg is not None and name is not None:
        return run_cfg, str(name)
    env = checkpoint_meta(checkpoint).get("env")
    return (checkpoint / "agentq.json", str(env)) if env is not None else None


def refuse_another_env_unasked(cfg: DictConfig, checkpoint: Path, overrides: list[str]) -> None:
    """`agentq eval` of another environment's checkpoint with no env chosen on the command line played
    the config's default environment (a review: a plugin env's checkpoint scored on TextWorldExpress,
    with a tokenizer of the plugin's words; only a warning said so): refused, naming the env config to
    give. A command line that chose an env (env=, env.name=) evaluates wherever it says, warned.

    Raises:
        ConfigError: the checkpoint's run (or agentq.json) names another environment class than
            cfg.env.name and `overrides` choose no env.
    """
    if any(o.split("=", 1)[0].lstrip("+~") in ("env", "env.name") for o in overrides if "=" in o):
        return
    trained = trained_env_name(checkpoint)
    if trained is None or same_env_class(trained[1], str(cfg.env.name)):
        return
    where, name = trained
    import agentq.conf

    configs = [p.stem for conf in agentq.conf.__path__ for p in sorted(Path(conf, "env").glob("*.yaml"))
               if isinstance(conf_env := load_yaml(p)[0], DictConfig) and conf_env.get("name") == name]
    give = (f"env={configs[0]}" if len(configs) == 1 else
            f"the env config it trained with ({', '.join(f'env={c}' for c in configs)})" if configs else
            "env=<the env config it trained with> (and the hydra.searchpath that finds it)")
    raise ConfigError(f"checkpoint={str(checkpoint)!r} was trained on env.name={name!r} ({where}), and this command "
                      f"line names no env: agentq eval would play {str(cfg.env.name)!r}, the default. Give {give} "
                      "to evaluate what it trained on, or env=<an env config> to evaluate it on another environment on "
                      "purpose")


def same_env_class(a: object, b: object) -> bool:
    """Whether env names `a` and `b` (a preset's, a Gymnasium id, "module:Class") build the same TextEnv
    class; False when either is unknown here (a plugin not installed now)."""
    from agentq.envs import env_class

    if a == b:
        return True
    try:
        cls = env_class(str(a))
        return cls is not None and cls is env_class(str(b))
    except Exception:           # an unknown name, a module that does not import: not known to be the same
        return False


def trained_env(cfg: DictConfig, checkpoint: Path) -> tuple[Path | None, list[str]]:
    """A checkpoint away from its run folder (copied, or the run's config.yaml gone): (its agentq.json,
    ['env.name: trained A, now B', 'rollout.quant: trained C, now D']) for the environment and the
    rollout numerics (an RL checkpoint's) agentq wrote there that are not `cfg`'s, else (None, []). A
    WebShop checkpoint copied out of its run played TextWorldExpress without a word."""
    meta = checkpoint / "agentq.json"
    saved = checkpoint_meta(checkpoint)
    env, quant = saved.get("env"), saved.get("rollout_quant")      # rollout_quant: an RL checkpoint's
    said = [] if env is None or same_env_class(str(env), str(cfg.env.name)) else [
        f"env.name: trained {env!r}, now {str(cfg.env.name)!r}"]
    if quant is not None and str(quant) != str(cfg.rollout.quant):
        said.append(f"rollout.quant: trained {quant!r}, now {str(cfg.rollout.quant)!r}")
    return (meta, said) if said else (None, [])


def warn_if_training_split(cfg: DictConfig, split: str, key: str = "split") -> None:
    """`split=<env.train_split>` evaluates the tasks training draws from: say so, since the report
    reads like a held-out one. `key`: the setting that chose `split` (the trainer's: env.eval_split)."""
    if split == cfg.env.get("train_split"):
        also = f" (env.eval_split is {cfg.env.eval_split!r})" if key == "split" else ""
        console.print(f"warning: {key}={split!r} is env.train_split, the split training draws its tasks from: "
                      f"this evaluation measures training tasks, not held-out ones{also}", style="yellow",
                      markup=False, highlight=False, soft_wrap=True)


def warn_if_sharing_training_tasks(cfg: DictConfig, split: str) -> None:
    """`agentq eval`'s word (`build.warn_shared_tasks`, as `agentq train` says it at start-up) on a
    held-out split sharing task ids with env.train_split: its report would read as a held-out one.

    Args:
        cfg: the evaluation's config.
        split: the split evaluated.
    Raises:
        ConfigError: the env refused `split` (naming `split=`, as `eval_tasks` does).
    """
    if split == str(cfg.env.train_split):    # `warn_if_training_split` says it
        return
    ids = build.split_tasks(cfg, split, key="split")
    try:
        trained = build.split_tasks(cfg, str(cfg.env.train_split))
    except ConfigError:     # no training split to compare with (its data absent): the evaluation needs none
        return
    build.warn_shared_tasks(cfg, split, ids, trained)


def warn_if_trained_otherwise(cfg: DictConfig, checkpoint: Path) -> None:
    """`agentq eval` composes its config from conf/ and the command line, not from the checkpoint's
    run: say so when the two differ in the task, the prompt or an RL run's rollout numerics (e.g. a
    checkpoint of the sweep's mapreader runs evaluated on `env`'s default coin game, another
    environment's checkpoint chosen with env=, or a bf16 run's checkpoint on the default w8a8_kv8
    engine). Another environment's checkpoint with no env chosen was refused before
    (`refuse_another_env_unasked`)."""
    run_cfg, changed = trained_otherwise(cfg, checkpoint)
    if changed:
        # env.kwargs say which tasks each split holds (WebShop's split_sizes, TextWorldExpress' tasks_per_game)
        split_note = (" The env's kwargs differ, and with them may which tasks each split holds: this held-out "
                      "split may hold tasks the run trained on." if any(c.startswith("env.kwargs.") for c in changed) else "")
        numerics_note = (" Its episodes were sampled with other rollout numerics: this evaluation measures the "
                         "checkpoint on another engine than it trained with." if any(c.startswith("rollout.")
                                                                                     for c in changed) else "")
        console.print(f"warning: this checkpoint's run ({run_cfg}) trained with other settings than this "
                      f"evaluation's: {'; '.join(changed)}.{split_note}{numerics_note} agentq eval reads conf/ and "
                      "the command line, not the run's config: give the run's env= and keys to evaluate what it "
                      "trained on", style="yellow", markup=False, highlight=False, soft_wrap=True)


def latest_checkpoint_hint(folder: Path) -> str:
    """For `checkpoint=<a run folder>` (a common slip: the folder `agentq train` or `agentq pipeline`
    printed), the checkpoint inside it that was probably meant, as the end of the error message; also
    for a run's checkpoints/ folder and for an evaluation's output folder (eval.json)."""
    if folder.is_file():                                # e.g. <checkpoint>/model.safetensors
        inside = folder.parent / "config.json"
        return "; a file, not a folder" + (f": checkpoint={folder.parent}?" if inside.is_file() else "")
    hint = pruned_checkpoint_hint(folder) or build.checkpoint_hint(folder, "checkpoint")
    if hint or not folder.is_dir():
        return hint
    steps = sorted(folder.glob("step_*/config.json"))
    if steps:                                           # <run>/checkpoints
        return f"; its last checkpoint is checkpoint={steps[-1].parent}"
    if not (folder / "eval.json").is_file():
        return ""
    # an evaluation's output: <checkpoint>/eval-<env>-<split> (agentq eval) or <run>/eval/step_N (the trainer's)
    if (folder.parent / "config.json").is_file():
        return f"; an evaluation's output folder (eval.json): the checkpoint it evaluated is checkpoint={folder.parent}"
    run = folder.parent.parent if folder.parent.name == "eval" else None
    same = run / "checkpoints" / folder.name if run else None
    if same is not None and (same / "config.json").is_file():
        return f"; an evaluation's output folder (eval.json): that step's checkpoint is checkpoint={same}"
    return "; an evaluation's output folder (eval.json), not a checkpoint" + (
        build.checkpoint_hint(run, "checkpoint").replace("; a run folder? its", "; the run's") if run else "")


def pruned_checkpoint_hint(folder: Path) -> str:
    """For <run>/checkpoints/step_N gone or without its weights (trainer.keep_checkpoints removes all but a
    run's latest checkpoints, leaving a folder that holds evaluations written into it), the run's latest
    checkpoint; "" for any other folder. The error said only "no such folder" (or nothing)."""
    steps = sorted(folder.parent.glob("step_*/config.json")) if folder.parent.name == "checkpoints" else []
    if not steps or folder.is_file():
        return ""
    what = "no such checkpoint" if not folder.exists() else "its weights are gone"
    return (f"; {what} (trainer.keep_checkpoints removes all but a run's latest checkpoints): the run's latest "
            f"is checkpoint={steps[-1].parent}")


def eval_out_path(cfg: DictConfig, split: str, overrides: list[str] | None = None,
                  selection: TaskSelection | None = None) -> tuple[Path, str]:
    """`agentq eval`'s output folder (not created: `evaluate` makes it once nothing can refuse the
    evaluation) and the setting that names it: eval.out_dir, else <checkpoint>/eval-<env>-<split>, or
    without a checkpoint runs/eval-<env>-<split>-<time> (never the model's folder: a shared cache or
    the user's own checkpoint of model.path); the default names end with `settings_suffix`, so
    evaluations under other settings (numerics, decoding, seed, budgets, task sample, prompt...) keep
    their own folders. `selection`: the tasks `eval.num_tasks` chose (`settings_suffix`).

    Returns:
        (the folder, the setting to name when it cannot be created: eval.out_dir, also for a folder
        inside the checkpoint, since a read-only checkpoint is evaluated by giving eval.out_dir).
    """
    if cfg.eval.out_dir:
        return Path(cfg.eval.out_dir), "eval.out_dir"
    name = f"eval-{folder_name(str(cfg.env.name))}-{split}{settings_suffix(cfg, overrides, selection)}"
    if cfg.checkpoint:
        return Path(cfg.checkpoint) / name, "eval.out_dir"
    # named like the trainer's unnamed run folders (agentq.trainer.run_dir.new_run_dir, a layer above)
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", "eval.out_dir"


def settings_suffix(cfg: DictConfig, overrides: list[str] | None = None, selection: TaskSelection | None = None) -> str:
    """The end of `agentq eval`'s default folder name: every setting that changes the episodes where it
    differs from the default (`default_config`), so evaluations under other settings keep their own
    folders and a rerun with the same settings replaces its own; "" for the default. E.g. "-bf16",
    "-T1", "-bf16-T0.7-top_p0.9-x2", "-seed1", "-steps2-n4", "-cfg1a2b3c4d". The README's comparisons
    (rollout=bf16 against the quantized rollout, sampled against greedy, three seeds) wrote to one
    <checkpoint>/eval-<env>-<split>/, so the second evaluation replaced the first's without a word.
    `selection`: the tasks `eval.num_tasks` chose (`episode_parts`)."""
    return "".join(f"-{p}" for p in decoding_parts(cfg) + episode_parts(cfg, default_config(cfg, overrides), selection))


def decoding_parts(cfg: DictConfig) -> list[str]:
    """The numerics and decoding of `settings_suffix` (default: W8A8-KV8 on the torch engine, greedy,
    one episode a task)."""
    r, t = cfg.rollout, float(cfg.eval.temperature)
    parts = [quant_name(str(r.quant))] if r.quant != "w8a8_kv8" else []
    parts += [folder_name(str(r.backend))] if r.backend != "torch" else []
    if t > 0:       # greedy decoding ignores top_p / top_k
        parts += [f"T{t:g}"] + ([f"top_p{float(r.top_p):g}"] if float(r.top_p) < 1 else [])
        parts += [f"top_k{int(r.top_k)}"] if int(r.top_k) > 0 else []
    return parts + ([f"x{int(cfg.eval.repeats)}"] if int(cfg.eval.repeats) > 1 else [])


#: settings that change an evaluation's episodes, named readably in its folder name when they differ
#: from the default: (key, the part's prefix before the value)
NAMED_SETTINGS = (("seed", "seed"), ("env.max_steps", "steps"), ("env.max_context_tokens", "ctx"),
                  ("env.max_new_tokens", "tok"))
#: the rest of what the episodes play and how they are scored (the task, the prompt, the agent loop's
#: format and penalties): too many and too long to spell out, named by a hash of those that differ
HASHED_SETTINGS = ("env.kwargs", "env.prompt", "agent")


def episode_parts(cfg: DictConfig, default: DictConfig, selection: TaskSelection | None = None) -> list[str]:
    """`settings_suffix`'s parts for what the episodes play: `NAMED_SETTINGS` ("seed1", "steps2"), the
    task sample ("n4": eval.num_tasks of the stratified sample, "first4" of eval.selection=first; every
    task, the default, adds none, nor does an eval.num_tasks that `selection` shows to take every task of
    the split: the same episodes as the default's, which went to a folder of their own; named since a
    4-task smoke test replaced a full evaluation) and "cfg" + 8 hex digits of the `HASHED_SETTINGS` that
    differ from `default` (`RUN_ONLY` env.kwargs left out: how the env runs, not what it plays)."""
    parts = [f"{prefix}{OmegaConf.select(cfg, k)}" for k, prefix in NAMED_SETTINGS
             if OmegaConf.select(cfg, k) != OmegaConf.select(default, k)]
    if cfg.eval.num_tasks is not None and (selection is None or selection.method != "all"):
        method = str(cfg.eval.get("selection", "stratified"))
        parts.append(f"{'n' if method == 'stratified' else method}{int(cfg.eval.num_tasks)}")
    diffs = differing_settings(default, cfg, lambda k: in_sections(k, HASHED_SETTINGS) and not in_sections(k, RUN_ONLY),
                               default=lambda k: build.setting_default(cfg, k))
    if diffs:       # the settings' keys and values: the same settings, the same name in any process
        text = json.dumps([[k, now] for k, _, now in diffs], sort_keys=True, default=repr)
        parts.append("cfg" + hashlib.sha256(text.encode()).hexdigest()[:8])
    return parts


def default_config(cfg: DictConfig, overrides: list[str] | None = None) -> DictConfig:
    """The config an evaluation's folder name is told against: conf/'s defaults with the environment
    preset named env.name (conf/env/<env.name>.yaml, a plugin's too), so an evaluation at that preset's
    defaults keeps the name it always had. One preset per env.name: textworld_express_mapreader (env.name
    textworld_express) is told against textworld_express.yaml, so its name differs from the coin game's
    on the same split. For an env.name no preset is named after (a Gymnasium id, module:Class), conf/'s
    default environment: the name then says what differs from it (a stable name, if not a short one).
    `overrides`' hydra.searchpath is kept: a preset found only through it (docs/adding-an-environment.md).
    Its env.kwargs are as written (no `pin_env_kwargs`): a data folder from $WEBSHOP_DATA names its own."""
    name = str(cfg.env.name)
    searchpath = [o for o in overrides or [] if o.startswith("hydra.searchpath=")]
    if re.fullmatch(r"[\w-]+", name):       # a group option's name, not a Gymnasium id or module:Class
        try:
            preset = load_config([f"env={name}", *searchpath], pin_env=False)
        except Exception:                   # no such preset, one that does not load alone, a plugin's import
            preset = None
        if preset is not None and str(preset.env.name) == name:
            return preset
    return load_config(searchpath, pin_env=False)


def folder_name(env_name: str) -> str:
    """`env_name` as one folder name: a Gymnasium id's "/" made nested folders and "module:Class"'s ":"
    breaks paths on Windows and in PATH-like lists (`agentq/ALFWorld-v0` → `agentq_ALFWorld-v0`)."""
    return re.sub(r"[^\w.-]+", "_", env_name)


def write_eval(out: Path, report: dict, trajs: list[Trajectory]) -> None:
    """`out/eval.json` (the report) and `out/episodes.jsonl` (one `eval_record` per episode), as a pair
    (`write_eval_pair`: eval.json records the episodes' sha256); then adds `episodes_sha256`, `out_dir`
    and `first_error` (the first errored episode's error, or None) to the report in memory."""
    report[EPISODES_SHA256] = write_eval_pair(out, report, trajs)
    report["out_dir"] = str(out)
    report["first_error"] = next((t.error for t in trajs if t.end_reason == "error"), None)


def print_report(r: dict) -> None:
    from rich.table import Table

    t = Table(title=f"{r['env']} / {r['split']}  ({r['episodes']} episodes, rollout={rollout_text(r)})")
    for c in ("metric", "value"):
        t.add_column(c)
    if r.get("task_selection"):
        t.add_row("tasks", r["task_selection"]["description"])
    if r.get("sampling"):
        t.add_row("decoding", decoding_text(r["sampling"]))
    lo, hi = r["success_ci95"]
    t.add_row("success rate", f"{100 * r['success_rate']:.1f} %  (95 % CI {100 * lo:.1f}–{100 * hi:.1f})")
    t.add_row("mean score (% of the maximum)", f"{100 * r['score_mean']:.1f}")
    t.add_row("turns (successful)", turns_text(r["turns_success_mean"]))
    cap = (r.get("limits") or {}).get("max_steps")      # an eval.json from before limits were recorded: none
    t.add_row("hit step cap", f"{100 * r['cap_rate']:.1f} %" + (f"  (cap {cap} turns)" if cap else ""))
    if r.get("end_context"):        # the context budget ended these, not the step cap (it read only "hit step cap")
        budget = (r.get("limits") or {}).get("max_context_tokens")
        t.add_row("ended at the context budget", f"{100 * r['end_context']:.1f} %"
                  + (f"  (env.max_context_tokens {budget})" if budget else ""))
    # every episode errored (or none played) before a turn: 0 of 0 turns is no rate, nor is the env's list missing
    no_turn = None if turns_played(r) else "n/a (no turn was played)"
    t.add_row("invalid-format turns", no_turn or f"{100 * r['invalid_action_rate']:.1f} %")
    t.add_row("inadmissible-action turns",
              no_turn or rate_text(r["inadmissible_action_rate"], "the env lists no admissible actions"))
    if r.get("errors"):
        t.add_row("environment errors", errored_text(r))
    if r.get("env_worker_restarts") or r.get("rollout_worker_restarts"):
        t.add_row("worker restarts", restarts_text(r))
    for k, v in (r.get("per_task_type") or {}).items():
        t.add_row(f"  {k}", f"{100 * v['success_rate']:.1f} % of {v['episodes']}")
    console.print(t)


def decoding_text(sampling: dict) -> str:
    """eval.json's `sampling` for the table, e.g. "greedy" or "sampled at T = 1, top_p 0.9; 2 episodes a
    task": the table of a sampled evaluation read like a greedy one's."""
    t, reps = float(sampling["temperature"]), int(sampling.get("repeats", 1))
    how = "greedy" if t == 0 else f"sampled at T = {t:g}" + "".join(
        f", {k} {sampling[k]:g}" for k, off in (("top_p", 1.0), ("top_k", -1)) if sampling.get(k, off) not in (off, 0))
    return how + (f"; {reps} episodes a task" if reps > 1 else "")


def rollout_text(r: dict) -> str:
    """The rollout numerics of a report as its folder names them, e.g. "w8a8_kv8 (torch)", "bf16 (torch)"
    (rollout=bf16 read "none (torch)" beside a -bf16 folder); an eval.json or summary.json written before
    `rollout_backend` was recorded gives the quantization alone."""
    backend = r.get("rollout_backend")
    return quant_name(str(r.get("rollout_quant"))) + (f" ({backend})" if backend else "")


def errored_text(r: dict) -> str:
    """"N of M errored (counted as lost)" for an evaluation report with errored episodes (the
    environment failed, e.g. raised in step), else ""; `agentq eval`'s table and the trainer's last line."""
    n_err = int(r.get("errors") or 0)
    return f"{n_err} of {r['episodes']} errored (counted as lost)" if n_err else ""


def restarts_text(r: dict) -> str:
    """The workers an evaluation restarted, e.g. "env 1, rollout 0 (2 episodes' resets retried)"."""
    rec = int(r.get("env_recovered_episodes") or 0)
    return (f"env {int(r.get('env_worker_restarts') or 0)}, rollout {int(r.get('rollout_worker_restarts') or 0)}"
            + (f" ({rec} episodes' resets retried, played)" if rec else ""))


def turns_played(r: dict) -> bool:
    """Whether an evaluation's episodes played any turn (its mean turns, null in eval.json with no
    episode, above 0; a report without it is taken to have played).

    Args:
        r: the report (`summarize`'s numbers).

    Returns:
        False where no turn was played, so no rate per turn was measured.
    """
    turns = r.get("turns_mean", 1.0)
    return turns is not None and turns > 0


def rate_text(v: float | None, why_none: str) -> str:
    """A rate for a table, "n/a (`why_none`)" where it was not measured (NaN, null in eval.json)."""
    return f"n/a ({why_none})" if v is None or math.isnan(v) else f"{100 * v:.1f} %"


def turns_text(v: float | None) -> str:
    """Mean turns of the won episodes for a table; with none won it is NaN (null in eval.json),
    which a table showed as "nan"."""
    return "– (none won)" if v is None or math.isnan(v) else f"{v:.2f}"
