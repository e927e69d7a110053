"""The RL trainer: GRPO-family updates on multi-turn episodes from a quantized rollout engine.

One step, top to bottom:
  1. rollouts   the engine (the behaviour policy μ, e.g. W8A8-KV8) plays G episodes of each of
                `tasks_per_step` training tasks; token ids, μ's log-probs and turn indices are kept
  2. advantages GRPO: episode reward standardised within each task's group
  3. π_old/π_ref log-probs from the learner's aligned forward (same fake quant as the engine)
  4. objective  token weights once per batch (IS / InterQ-RL retention …), then PPO epochs;
                with trainer.old_logp=bypass, π_old and the weights come from the update's own
                forward at θ_old instead (step 3 is then π_ref only; `old_logp_mode`)
  5. sync       the engine requantizes the new master weights (fresh scales)
  6. log        metrics.jsonl + TensorBoard; periodic checkpoints and held-out evaluation
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from agentq import build
from agentq.agent import BackendPolicy, ChatFormat, EpisodeSpec
from agentq.agent.trajectory import Trajectory
from agentq.config import ConfigError, check_config, check_env_name, config_leaves, load_config
from agentq.algos import Objective, Prepared, grpo_advantages, idle_correction_note, make_objective, mismatch_metrics
from agentq.envs.base import sample_tasks
from agentq.eval.episodes import read_eval
from agentq.eval.evaluate import (EVAL_FIRST_ID, check_errors, check_unplayed, choose_eval_tasks, errored_text,
                                  eval_seed, evaluate_policy, warn_if_training_split)
from agentq.eval.metrics import counts_since, run_totals, summarize, worker_counts
from agentq.eval.plots import write_run_plots
from agentq.eval.segments import segment_rows, segments_due, token_decoder, truncate_segments, write_segments
from agentq.learner.batch import PolicyBatch, collate
from agentq.learner.learner import bypass_refusal, grad_pass_refusal
from agentq.kernels.quant_spec import QuantSpec
from agentq.rollout.backend import SyncStats
from agentq.learner.lr_schedule import lr_factor
from agentq.utils.checkpoint import CheckpointError, TrainerState, load_trainer_state, save_hf_checkpoint
from agentq.utils.errors import first_line, says_where_on_stop
from agentq.utils.files import write_text_replacing
from agentq.utils.folder_lock import removed_if_left_empty
from agentq.utils.logging import (MetricsLogger, console, errored_note, jsonable, logger_names,
                                  progress, read_metrics, step_line)

from .placement import Placement, check_placement_config
from .run_dir import (COMPLETION_ARTIFACTS, RunAborted, check_resume_dir, claim_run_dir, last_step_checkpoint,
                      log_resume, new_run_dir, read_run_config, read_run_id, remove_run_artifacts,
                      restore_config_hint, step_checkpoints, truncate_evaluations, truncate_lost_episodes,
                      write_lost_episodes, write_run_config, write_run_id)


#: rollout summary keys (eval.metrics.summarize) every step row carries, skipped steps too
ROLLOUT_KEYS = ("reward_mean", "success_rate", "score_mean", "turns_mean", "cap_rate", "invalid_action_rate",
                "inadmissible_action_rate", "end_context")


def rollout_stats(trajs: list[Trajectory]) -> dict:
    """A step row's rollout metrics: `ROLLOUT_KEYS` over the episodes that did not error, as the learner
    trains on those alone (an errored episode is no failure of the policy: its worker died or hung),
    with `episodes` (all of them) and `errored_episodes` beside them. All errored: the means are NaN.
    (An evaluation counts errored episodes as lost instead: `summarize` over all of them.)"""
    completed = [x for x in trajs if x.end_reason != "error"]
    rollout = summarize(completed) if completed else {}     # none: every key NaN (rates too, not 0 of 0)
    return {**{k: rollout.get(k, float("nan")) for k in ROLLOUT_KEYS}, "episodes": len(trajs),
            "errored_episodes": len(trajs) - len(completed)}


def stopped_episodes(specs: list[EpisodeSpec], ended: list[Trajectory], why: str) -> list[Trajectory]:
    """A step's episodes when the run stopped while collecting them (`why`: the give-up message).

    Args:
        specs: the step's episodes; ended: the trajectories of those that ended before the stop.
    Returns:
        By episode id: each ended one as it is (an errored one keeps its own error), and each other
        one, the stopping call's among them, as an errored trajectory naming the stop.
    """
    done = {t.episode_id for t in ended}
    stopped = [Trajectory(s.episode_id, s.task_id, s.split, s.group_id, end_reason="error",
                          error=f"the run stopped before this episode ended: {why}")
               for s in specs if s.episode_id not in done]
    return sorted([*ended, *stopped], key=lambda t: t.episode_id)


def run_dir_for(cfg: DictConfig) -> Path:
    if cfg.trainer.resume:
        return Path(cfg.trainer.resume)
    return Path(cfg.trainer.out_dir or new_run_dir(f"{cfg.env.name}-{cfg.algo.name}"))


def final_eval_tasks(t: DictConfig) -> int:
    """The final evaluation's tasks: trainer.final_eval_tasks, null (or absent: a run folder from before
    it) trainer.eval_num_tasks. A setting, not an argument of `train`, so that it is in the run's
    config.yaml and a resume ends on the evaluation the run would have ended on.

    Args:
        t: the config's trainer section.
    Returns:
        The number of held-out tasks the final evaluation plays.
    """
    n = t.get("final_eval_tasks")
    return int(n if n is not None else t.eval_num_tasks)


def old_logp_mode(cfg: DictConfig, objective: Objective, device: torch.device, dtype: torch.dtype) -> str:
    """trainer.old_logp: "recompute" (a no-grad π_old pass before the update) or "bypass" (π_old
    from the update's own forward, `Learner.update`), refused with the reason where bypass would
    not give the numbers recompute gives (the learner computes in `dtype` on `device`)."""
    t = cfg.trainer
    mode = str(t.get("old_logp", "recompute"))
    if mode != "bypass":
        return mode
    placement = str(OmegaConf.select(cfg, "placement.mode", default="single"))
    why = None if placement == "single" else (
        f"placement.mode={placement} runs the data-parallel learner, whose ranks take π_old from their own pass")
    why = why or bypass_refusal(objective, int(t.ppo_epochs), int(t.minibatch_size) if t.minibatch_size else None,
                                int(t.tasks_per_step) * int(t.group_size)) or grad_pass_refusal(dtype, device)
    if why:
        raise ConfigError(f"trainer.old_logp=bypass is exact only when the step's one optimizer step runs at "
                          f"θ_old, in a training forward that computes what the π_old pass does, with a row-local "
                          f"objective; here {why}. Use trainer.old_logp=recompute")
    return mode


def check_rl_config(cfg: DictConfig) -> tuple[torch.device, torch.dtype, Objective, str]:
    """The RL settings judged from the config alone: device and dtype, the objective and its
    parameters, trainer.old_logp, the sampling the learner must reproduce, the placement values.
    `agentq pipeline` runs it before its SFT stage, so a bad RL setting costs no SFT run.

    Returns:
        (device, dtype, objective, old_logp mode).
    Raises:
        ConfigError: the first refused setting, named.
    """
    build.check_model_path_set(cfg)        # before the device's probe prints its line
    device, dtype = build.device_and_dtype(cfg)
    build.check_learner_dtype(cfg)
    objective = build_objective(cfg)
    mode = old_logp_mode(cfg, objective, device, dtype)
    build.learner_temperature(cfg)          # (the learner reads it when built)
    check_placement_config(cfg)
    build.check_ray_installed(cfg)          # env_pool=ray or a Ray placement without Ray: one line, now
    build.check_logger_config(cfg)     # a logger sink that cannot be built: one line, before the folder
    build.check_rollout_backend(cfg)   # a plugin that does not import: one line, before an SFT stage
    t = cfg.trainer
    if int(t.get("lr_warmup_steps", 0)) > int(t.steps):
        raise ConfigError(f"trainer.lr_warmup_steps={t.lr_warmup_steps} > trainer.steps={t.steps}: the rate would "
                          f"never reach trainer.lr={t.lr}; warm up over at most trainer.steps steps")
    return device, dtype, objective, mode


def step_lr(t: DictConfig, step: int) -> float:
    """trainer.lr × the schedule's factor at RL step `step` (1-based) of trainer.steps
    (`lr_schedule.lr_factor`; a run saved before the schedule existed has none: constant)."""
    return float(t.lr) * lr_factor(step - 1, int(t.steps), int(t.get("lr_warmup_steps", 0)),
                                   str(t.get("lr_schedule", "constant")), float(t.get("lr_min_ratio", 0.0)))


LR_KEYS = ("lr", "lr_warmup_steps", "lr_schedule", "lr_min_ratio", "steps")


def lr_change_note(saved_config: Path, t: DictConfig, step: int) -> str | None:
    """For a resume: the rate RL step `step` now runs at, where the run's own config.yaml gave
    another (a changed lr or schedule, or a changed trainer.steps under a decaying schedule, which
    moves the whole curve); None when they agree or there is nothing to compare with."""
    if step > int(t.steps):
        return None
    saved = read_run_config(saved_config, needs=("trainer",))      # a damaged one: a one-line ConfigError
    then = saved.get("trainer") if saved is not None else None
    if not isinstance(then, DictConfig) or "lr" not in then:
        return None
    old, new = step_lr(then, step), step_lr(t, step)
    if abs(old - new) <= 1e-9 * max(abs(old), abs(new)):
        return None
    curve = any(str(c.get("lr_schedule", "constant")) != "constant" or int(c.get("lr_warmup_steps", 0))
                for c in (then, t))        # trainer.steps moves the rate only on a curve
    keys = [f"trainer.{k} {then.get(k)} → {t.get(k)}" for k in LR_KEYS
            if then.get(k) != t.get(k) and (k != "steps" or curve)]
    return (f"step {step} runs at lr {new:.4g} where the run's own settings gave {old:.4g} ({', '.join(keys)}); "
            "the rate is a function of the step and trainer.steps")


def build_objective(cfg: DictConfig) -> Objective:
    """The objective `algo.objective` names, with the preset's parameters.

    Raises:
        ConfigError: an unknown objective or parameter, or a value out of its range, as one line
        naming the preset and the keys that set it (was a traceback from deep in the trainer).
    """
    a = cfg.algo
    try:
        return make_objective(a.objective, clip_eps=float(a.clip_eps), dual_clip=float(a.dual_clip),
                              kl_coef=float(a.kl_coef), loss_agg=str(a.loss_agg),
                              **build.config_dict(a.objective_params))
    except ValueError as e:
        raise ConfigError(f"algo={a.name}: {e} (set by algo.objective, algo.objective_params.*, algo.clip_eps, "
                          "algo.dual_clip, algo.kl_coef, algo.loss_agg)") from None


def with_optimizer_settings(state: dict, **settings: Any) -> tuple[dict, list[str]]:
    """An optimizer state_dict whose every param group has `settings` (lr, weight_decay, betas),
    and 'key old → new' for each that the checkpoint had otherwise (its first differing group's)."""
    groups = [dict(g) for g in state["param_groups"]]
    changed: dict[str, str] = {}
    for g in groups:
        for key, new in settings.items():
            old = g.get(key)
            if key not in changed and (tuple(old) if isinstance(old, (list, tuple)) else old) != new:
                changed[key] = f"{key} {old} → {new}"
            g[key] = new
    return {**state, "param_groups": groups}, list(changed.values())


def resumed_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """trainer.resume's config: the run's own config.yaml with this command line's `overrides` on
    top, checked as at start-up. The values come from `cfg` (the overrides' composition, so Hydra
    parses them); a group choice such as env_pool=inline takes the sections it sets from it whole.

    Raises:
        ConfigError: the folder's config.yaml is missing (the defaults would stand in for the run's
        settings, trainer.keep_checkpoints among them) or damaged (`read_run_config`).
    """
    saved_path = Path(cfg.trainer.resume) / "config.yaml"
    saved = read_run_config(saved_path)
    if saved is None:
        raise ConfigError(f"trainer.resume={str(cfg.trainer.resume)!r}: the run folder has no config.yaml, so the run "
                          "cannot continue exactly (its settings would be guesses); "
                          f"{restore_config_hint(saved_path.parent)}")
    search = [o for o in overrides if o.startswith("hydra.")]
    model_before = OmegaConf.to_container(saved.get("model"), resolve=True) if saved.get("model") is not None else None
    algo_before = {k: OmegaConf.select(saved, k, default=None) for k in ALGO_OF_A_RUN}
    changed = []
    for o in (o for o in overrides if not o.startswith("hydra.")):
        key = o.split("=", 1)[0].lstrip("+~")
        parent, _, leaf = key.rpartition(".")
        if o.startswith("~"):
            node = OmegaConf.select(saved, parent) if parent else saved
            if isinstance(node, DictConfig):
                node.pop(leaf, None)
            changed.append(o)
        elif not parent and isinstance(cfg.get(key), DictConfig):       # a group choice
            for section in group_sections(o, search):
                saved[section] = cfg[section]
            changed.append(o)
        else:
            old, new = OmegaConf.select(saved, key, default=None), OmegaConf.select(cfg, key)
            OmegaConf.update(saved, key, new, merge=False, force_add=True)
            # the resume itself is no change of the run's settings
            changed += [f"{key} {old} → {new}"] if old != new and key != "trainer.resume" else []
    refuse_model_change(cfg.trainer.resume, model_before, saved)
    refuse_algo_change(cfg.trainer.resume, algo_before, saved)
    check_config(saved)
    try:        # the command line's env was checked, not the run's (a plugin's module off PYTHONPATH here)
        check_env_name(saved)
    except ConfigError as e:
        raise ConfigError(f"trainer.resume={str(cfg.trainer.resume)!r}: the run's {e}") from None
    OmegaConf.set_struct(saved, True)
    console.print(f"trainer.resume: the run's {saved_path.name}" + (f", changed by this command line: "
                                                                   f"{'; '.join(changed)}" if changed else ""))
    return saved


def refuse_model_change(resume: str, before: Any, saved: DictConfig) -> None:
    """A resume's weights are its latest checkpoint's and its KL reference the model it started
    from: a command line that changes the `model` section (model.path, model=, model.tiny.*) would
    be written into config.yaml and used nowhere, so it is refused, naming the keys."""
    flat_before, flat_after = config_leaves({"model": before}), config_leaves({"model": saved.get("model")})
    keys = [f"{k} {flat_before.get(k)} → {flat_after.get(k)}" for k in sorted(set(flat_before) | set(flat_after))
            if flat_before.get(k) != flat_after.get(k) and not _same_folder(flat_before.get(k), flat_after.get(k))]
    if not keys:
        return
    raise ConfigError(f"trainer.resume={resume!r} continues from the run's latest checkpoint, and its KL reference "
                      f"stays the model it started from: this command line's {'; '.join(keys[:3])}"
                      f"{f' (and {len(keys) - 3} more)' if len(keys) > 3 else ''} would be used "
                      "nowhere. Drop it, or start a new run from other weights (model.path=<checkpoint folder>)")


#: what a run is, as its report and summary name it: a resume that changed them mixed two algorithms'
#: steps in one run (the report titled it by the last)
ALGO_OF_A_RUN = ("algo.name", "algo.learner_quant")


def refuse_algo_change(resume: str, before: dict[str, Any], saved: DictConfig) -> None:
    """A resume under another preset (algo=) or learner alignment than the run's (`ALGO_OF_A_RUN`):
    its later steps would be another algorithm's, under the run's name. Refused, naming the keys and how
    to start a run of the other preset from the checkpoint (an objective's parameters may change).

    Raises:
        ConfigError: one of `ALGO_OF_A_RUN` differs between `before` (the run's) and `saved`.
    """
    keys = [f"{k} {before[k]} → {OmegaConf.select(saved, k, default=None)}" for k in ALGO_OF_A_RUN
            if OmegaConf.select(saved, k, default=None) != before[k]]
    if keys:
        raise ConfigError(f"trainer.resume={resume!r}: this command line's {'; '.join(keys)} would make the run's "
                          "later steps another algorithm's under its name (its report and summary name one). "
                          "Drop it, or start a new run of that preset from the run's checkpoint "
                          "(model.path=<its checkpoint folder> algo=...)")


def _same_folder(a: Any, b: Any) -> bool:
    """Two path settings naming one existing folder (relative and absolute, through a symlink)."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return os.path.samefile(os.path.expanduser(a), os.path.expanduser(b))
    except OSError:
        return False


def group_sections(choice: str, search: list[str]) -> list[str]:
    """The top-level sections a group choice (`algo=qat`) sets: its own, and any other that an
    option of the group sets (an algo preset picks the rollout preset), found by composing each
    against the defaults. `search`: the command line's hydra.searchpath overrides."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    group = choice.split("=", 1)[0].lstrip("+")
    with initialize_config_module(config_module="agentq.conf", version_base=None):
        options = GlobalHydra.instance().config_loader().get_group_options(group)
    default = OmegaConf.to_container(load_config(search))
    assert isinstance(default, dict)
    sections = {group}
    for option in [choice, *(f"{group}={o}" for o in options)]:
        try:
            composed = OmegaConf.to_container(load_config([*search, option]))
        except ConfigError:         # an option that does not compose alone (none of agentq's own)
            continue
        assert isinstance(composed, dict)
        sections |= {str(k) for k in composed if composed.get(k) != default.get(k)}
    return sorted(sections)


def wandb_redo_notice(run_dir: Path, cfg: DictConfig, start_step: int) -> None:
    """Said on a resume that redoes logged steps (rows after `start_step`) with wandb among the loggers:
    W&B ignores a step logged again, so its run keeps the stopped run's values of those steps."""
    path = run_dir / "metrics.jsonl"
    names = logger_names(cfg)
    if "wandb" not in names or not path.exists():
        return
    last = max((int(r["step"]) for r in read_metrics(path)), default=start_step)
    if last > start_step:
        steps = f"step {last} is" if last == start_step + 1 else f"steps {start_step + 1}-{last} are"
        record = "metrics.jsonl and TensorBoard have" if "tensorboard" in names else "metrics.jsonl has"
        console.print(f"trainer.resume: {steps} redone; W&B keeps the values the stopped run logged for them "
                      f"(it ignores a step logged again): {record} the redone ones",
                      style="yellow", markup=False, highlight=False, soft_wrap=True)


def recorded_step(run_dir: Path, step: int) -> tuple[dict | None, dict | None]:
    """What the run folder holds for `step`: (its metrics row without step and time, the report of
    its held-out evaluation as `evaluate_policy` returns it), each None when not recorded (an
    evaluation counts once metrics.jsonl has its row: eval.json is written first)."""
    path = run_dir / "metrics.jsonl"
    rows = [r for r in read_metrics(path) if r["step"] == step] if path.exists() else []
    row = next(({k: v for k, v in r.items() if k not in ("step", "time")} for r in rows if "reward_mean" in r), None)
    folder = run_dir / "eval" / f"step_{step:06d}"
    if not (any(k.startswith("eval/") for r in rows for k in r) and (folder / "eval.json").exists()):
        return row, None
    report = read_eval(folder)          # checked against its episodes (a one-line CheckpointError if not)
    report["out_dir"] = str(folder)
    return row, report


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = step_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


@contextlib.contextmanager
def reading_resume_checkpoint(run_dir: Path, ckpt: Path | None) -> Iterator[None]:
    """Run a block that reads `ckpt`, the checkpoint a resume starts from (None: no resume). A
    CheckpointError it raises (no trainer state, a damaged one, a weight file missing or truncated, a
    tokenizer or config.json that does not load) stopped the resume with no way on: it now ends with
    `earlier_checkpoint_advice`. Nothing falls back to an earlier checkpoint on its own: the user
    decides what becomes of the damaged one."""
    try:
        yield
    except CheckpointError as e:
        if ckpt is None:
            raise
        raise CheckpointError(f"{e}; {earlier_checkpoint_advice(run_dir, ckpt)}") from e


def check_state_values(ckpt: Path, state: TrainerState, rng: np.random.Generator, gen: torch.Generator) -> None:
    """The trainer state's values a resume restores, tried on fresh copies first: a well-formed file with
    a wrong value (a hand edit, a bit flip in a number) ended the resume with a traceback from numpy or
    torch; now a `CheckpointError`, which `reading_resume_checkpoint` completes with the way on.

    Raises:
        CheckpointError: `step` is not the checkpoint folder's step, or an RNG state does not load.
    """
    step = state.meta["step"]
    if type(step) is not int or ckpt.name != f"step_{step:06d}":
        raise CheckpointError(f"checkpoint {ckpt} is damaged (its trainer_state.json says step {step!r})")
    for name, restore in (("np_rng", lambda v: setattr(type(rng.bit_generator)(), "state", v)),
                          ("torch_gen", lambda v: torch.Generator(device=gen.device).set_state(v))):
        value = state.meta[name] if name == "np_rng" else state.tensors[name]
        try:
            restore(value)
        except (TypeError, ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {ckpt} is damaged (its {name} does not load: {first_line(e)})") from None


def earlier_checkpoint_advice(run_dir: Path, ckpt: Path) -> str:
    """What a resume refused at its latest checkpoint `ckpt` can do: move it aside and resume from the
    one before it (named; trainer.keep_checkpoints keeps 2 by default), or, with none before it, start
    the run again."""
    earlier = [p for p in step_checkpoints(run_dir) if p.name < ckpt.name]
    if earlier:
        return f"move {ckpt.name} out of its checkpoints folder to resume from the one before it, {earlier[-1].name}"
    return ("it is the run's only checkpoint, so none before it to resume from: start the run again (its command "
            "line with trainer.overwrite=true)")


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Remove all but the last `keep` checkpoints (0: keep all). An evaluation inside one (`agentq eval`
    writes to <checkpoint>/eval-<env>-<split> by default) stays where it was: only the checkpoint's own
    files go. The whole folder went before, and with it the user's evaluation, without a word."""
    import shutil

    for old in step_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        kept = sorted(c.name for c in old.iterdir() if c.is_dir())
        if not kept:
            shutil.rmtree(old, ignore_errors=True)
            continue
        for f in old.iterdir():
            if not f.is_dir():
                f.unlink(missing_ok=True)
        console.print(f"removed checkpoint {old}'s weights and state (trainer.keep_checkpoints={keep}); the folder "
                      f"keeps what was written into it: {', '.join(kept)}", markup=False, highlight=False, soft_wrap=True)


def numerics_line(rollout: QuantSpec, learner: QuantSpec, counts: dict[str, int] | None) -> str:
    """The start-up line that says what runs quantized: the rollout's spec, the learner's (aligned to
    it, another, or full precision) and, where given, the learner's count of linears each way."""
    said = ("aligned to it" if learner == rollout else
            "in full precision (not aligned to the rollout)" if not (learner.linear_quantized or learner.kv_quantized)
            else learner.describe())
    if counts is not None:
        said += (f"; {counts['quantized_linears']} linears fake-quantized, "
                 f"{counts['full_precision_linears']} in full precision")
    return f"numerics: rollout {rollout.describe()} · learner {said}"


class RLTrainer:
    def __init__(self, cfg: DictConfig, init_path: str | None = None, out_key: str = "trainer.out_dir"):
        """Check the settings, lock the run folder (trainer.out_dir) and build the run.

        Args:
            cfg: the composed config.
            init_path: the weights to start from (default model.path, or the tiny model).
            out_key: the setting that named the run folder, for its messages: `pipeline.out_dir` for a
                pipeline's RL stage and `sweep.out_dir` for a sweep's arms, which refuse trainer.out_dir.
        """
        self.cfg = cfg
        # refusals of the algo, sampling and placement settings, before anything is built or the run
        # folder made
        self.device, self.dtype, self.objective, self.old_logp_mode = check_rl_config(cfg)
        evaluates = int(cfg.trainer.eval_every) >= 0
        if evaluates:        # "held-out train" read as a held-out result
            warn_if_training_split(cfg, str(cfg.env.eval_split), key="env.eval_split")
        # missing data (ALFWorld's real games) before the model build, not after it
        build.check_split_data(cfg, [str(cfg.env.train_split), *([str(cfg.env.eval_split)] if evaluates else [])])
        torch.manual_seed(int(cfg.seed))
        self.rng = np.random.default_rng(int(cfg.seed))
        self.gen = torch.Generator().manual_seed(int(cfg.seed))
        self.run_dir = run_dir_for(cfg)
        t = cfg.trainer
        if t.resume:
            check_resume_dir(t.resume)      # before the folder is created or locked
        # locked and checked, but left as it is until everything is built (`_open_run`): a bad setting
        # or a missing path found on the way costs no earlier run's files, config.yaml or rows, and
        # leaves no folder this start created
        with removed_if_left_empty(self.run_dir):
            self._lock = claim_run_dir(self.run_dir, resume=bool(t.resume),
                                       overwrite=bool(t.get("overwrite", False)), out_key=out_key, remove=False)
            try:
                state = self._build(init_path)
            except BaseException:
                self._lock.close()      # refused or failed before the run began: the folder is free again
                raise
        self._open_run(state)

    def _build(self, init_path: str | None) -> TrainerState | None:
        """Everything the run needs, the run folder unchanged: the resume point, tokenizer, learner
        (optimizer and RNGs restored on a resume), engine and env pool. Returns the resumed state."""
        resume_ckpt, state = self._resume_point()
        # the policy the run started from: the KL reference, also after a resume
        # absolute: a relative model.path kept as written named another folder when a resume ran elsewhere
        self.init_path = ((state.meta if state else {}).get("init_path")
                          or str(Path(init_path or build.model_path(self.cfg)).absolute()))
        if resume_ckpt is not None:
            self._check_reference()
        path = str(resume_ckpt) if resume_ckpt else self.init_path
        with reading_resume_checkpoint(self.run_dir, resume_ckpt):      # its weight files and tokenizer
            self.tokenizer = build.load_tokenizer(path)
        self.chat = ChatFormat.from_tokenizer(self.tokenizer)
        # where the engines and learner ranks run (placement=single: both here, as before)
        self.placement = Placement(self.cfg)
        self._build_learner(path, resumed=resume_ckpt is not None)
        self.start_step = self._restore(state, resume_ckpt) if state is not None else 0
        self._build_rollout(path)
        report = getattr(self.learner, "report", None)      # a data-parallel learner's ranks audit their own copies
        console.print(numerics_line(*build.quant_specs(self.cfg), report() if callable(report) else None),
                      markup=False, highlight=False)
        return state

    def _open_run(self, state: TrainerState | None) -> None:
        """The run folder changes only now: an overwritten run's files go (`claim_run_dir` allowed
        nothing else for a fresh run), a resumed run's rows after its checkpoint are cut (those steps
        are redone), config.yaml is written; then the metric sinks."""
        steps, unfinished = int(self.cfg.trainer.steps), False
        if state is None:
            remove_run_artifacts(self.run_dir)
            self.run_id = write_run_id(self.run_dir)
        else:
            # a folder from before run ids takes its checkpoint's (or a new one) from now on
            self.run_id = read_run_id(self.run_dir) or write_run_id(self.run_dir, state.meta.get("run_id"))
            # steps the run had logged past its checkpoint under its own trainer.steps: cut below, so a
            # resume that then runs no step (trainer.steps set to the checkpoint's) still changes the run
            before = read_run_config(self.run_dir / "config.yaml")
            unfinished = before is not None and int(before.trainer.steps) > self.start_step
            wandb_redo_notice(self.run_dir, self.cfg, self.start_step)
            MetricsLogger.truncate(self.run_dir, self.start_step)
            truncate_lost_episodes(self.run_dir, self.start_step)
            truncate_segments(self.run_dir, self.start_step)
            truncate_evaluations(self.run_dir, self.start_step)
            if self.start_step < steps:      # written again when the run completes, not left from an earlier end
                remove_run_artifacts(self.run_dir, COMPLETION_ARTIFACTS)
        # a resume that runs no step of a finished run leaves its settings as its steps ran them
        if state is None or self.start_step < steps or unfinished:
            if state is not None:
                log_resume(self.run_dir, self.start_step, self.cfg)
            write_run_config(self.run_dir, self.cfg)
        self._eval_selection: dict = {}
        # on a resume, TensorBoard hides the earlier run's points of the steps redone (W&B continues its run)
        self.logger = MetricsLogger.from_config(self.run_dir, self.cfg,
                                                purge_step=self.start_step + 1 if state else None)
        # saved since episode ids had to stay unique over a resume that changes the batch (a count from
        # the new tasks_per_step × group_size replayed earlier ids, hence their seeds)
        self.next_episode_id = (int(state.meta.get("next_episode_id", self.start_step * self.n_episodes)) if state
                                else 0)
        self.eval_history: list[dict] = []
        # a resumed run keeps counting toward trainer.max_skipped_steps where it stopped
        self.skipped_in_a_row = int(state.meta.get("skipped_in_a_row", 0)) if state else 0

    # ------------------------------------------------------------------ construction phases
    def _resume_point(self) -> tuple[Path | None, TrainerState | None]:
        """(checkpoint, its trainer state) to resume from with trainer.resume, else (None, None).

        Raises:
            ConfigError: the folder has no checkpoint, or the checkpoint is past trainer.steps
            (continuing would write its newer weights under an older step's name).
        """
        resume, steps = self.cfg.trainer.resume, int(self.cfg.trainer.steps)
        if not resume:
            return None, None
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:        # check_resume_dir found one: another process removed it since
            raise ConfigError(f"trainer.resume={resume!r}: no checkpoints/step_* in that run folder")
        # what `_restore` reads; a file without it is a one-line CheckpointError naming the checkpoint
        with reading_resume_checkpoint(self.run_dir, ckpt):
            state = load_trainer_state(ckpt, meta_keys=("step", "np_rng"), tensor_keys=("optimizer", "torch_gen"))
            check_state_values(ckpt, state, self.rng, self.gen)
        ours, theirs = read_run_id(self.run_dir), state.meta.get("run_id")
        if ours and theirs and ours != theirs:
            raise ConfigError(f"trainer.resume={resume!r}: its latest checkpoint ({ckpt.name}) was written by another "
                              f"run (run id {theirs}; this run's, in its run_id file, is {ours}): a checkpoints/ "
                              "folder copied from another run? Resume that run's own folder, or start a new run "
                              f"from those weights (model.path={str(ckpt)!r})")
        if int(state.meta["step"]) > steps:
            raise ConfigError(f"trainer.resume={resume!r}: its latest checkpoint ({ckpt.name}) is at step "
                              f"{int(state.meta['step'])}, past trainer.steps={steps}; trainer.steps is the run's "
                              f"total, from its start: set it to {int(state.meta['step'])} or more")
        return ckpt, state

    def _check_reference(self) -> None:
        """A resumed run's KL reference is the model it started from, read again from its folder: a
        folder moved or deleted since ended the resume with a traceback from transformers (it took the
        path for a hub id); now one line naming it."""
        kl = float(self.cfg.algo.kl_coef)
        if kl > 0 and not (Path(self.init_path) / "config.json").is_file():
            raise ConfigError(f"trainer.resume={str(self.cfg.trainer.resume)!r}: the model the run started from, "
                              f"{self.init_path!r}, is its KL reference (algo.kl_coef={kl:g}) but has no config.json "
                              "any more: put that folder back there (a moved one: a symlink at that path)")

    def _build_learner(self, path: str, resumed: bool) -> None:
        """The learner at `path` with the aligned learner spec (`self.rollout_spec` is the engine's)."""
        cfg, t = self.cfg, self.cfg.trainer
        self.rollout_spec, learner_spec = build.quant_specs(cfg)
        self.learner = self.placement.learner(
            path, learner_spec, dtype=self.dtype, device=str(self.device), lr=float(t.lr),
            weight_decay=float(t.weight_decay), betas=tuple(t.betas), grad_clip=float(t.grad_clip),
            use_reference=float(cfg.algo.kl_coef) > 0, ref_path=self.init_path if resumed else None,
            activation_checkpointing=bool(t.activation_checkpointing), **build.learner_batching(cfg),
            grad_input=str(t.get("grad_input", "bf16")), temperature=build.learner_temperature(cfg),
            cuda_graphs=bool(t.get("cuda_graphs", False)), share_prefix=bool(t.get("share_prefix", True)))

    def _restore(self, state: TrainerState, ckpt: Path | None) -> int:
        """Optimizer and RNG states from a checkpoint (`_open_run` cuts the logs after it).

        Returns:
            The checkpoint's step (the run continues after it).
        """
        step = int(state.meta["step"])
        t = self.cfg.trainer
        # the rate is set again at every step (`step_lr`); what it was at the checkpoint's step is
        # compared below, with the run's own settings, not with trainer.lr
        optimizer, changed = with_optimizer_settings(state.tensors["optimizer"], lr=step_lr(t, step),
                                                     weight_decay=float(t.weight_decay), betas=tuple(t.betas))
        # load_state_dict brings back the checkpoint's param_groups: the config's settings go in with them
        # (on every rank too, where the optimizer is remote)
        self.learner.opt.load_state_dict(optimizer)
        changed = [c for c in changed if not c.startswith("lr ")]
        if changed:
            console.print(f"trainer.resume: the optimizer takes this config's {', '.join(changed)}")
        note = lr_change_note(self.run_dir / "config.yaml", t, step + 1)
        if note:
            console.print(f"trainer.resume: {note}", style="yellow", markup=False, highlight=False)
        self.rng.bit_generator.state = state.meta["np_rng"]
        self.gen.set_state(state.tensors["torch_gen"])
        console.print(f"resumed from {ckpt} at step {step}")
        return step

    def _build_rollout(self, path: str) -> None:
        """The engine (synced to the learner's weights), the training tasks, env pool and agent loop."""
        cfg, t = self.cfg, self.cfg.trainer
        self.n_episodes = int(t.tasks_per_step) * int(t.group_size)
        self.n_conc = max(1, min(self.n_episodes, int(t.max_concurrent), int(cfg.rollout.max_slots)))
        self.engine = self.placement.rollout(cfg, path, self.device, self.dtype, self.tokenizer, max_slots=self.n_conc)
        self.engine.update_weights(self.learner.named_weights(), version=self.start_step)
        self.synced_version = self.start_step       # the version every rollout turn must report (`BackendPolicy`)
        self.train_split, self.eval_split = cfg.env.train_split, cfg.env.eval_split
        # listed by the start-up check (`check_split_data`, with the held-out split when the run
        # evaluates): this is that listing, not a second one
        self.train_tasks = build.split_tasks(cfg, self.train_split)
        self.pool = build.env_pool(cfg, self.train_split, self.n_conc)
        self.loop = build.agent_loop(cfg, self.pool, self.chat, build.sampling_params(cfg, self.chat), self.n_conc,
                                     run_seed=int(cfg.seed))
        self._restarts_logged = worker_counts(self.pool, self.engine)

    # ------------------------------------------------------------------ one RL step
    def step(self, step: int) -> dict:
        """One RL step (module docstring): collect, score, prepare, update, sync; returns the logged row."""
        before = self.engine.prefill_counts()
        t0 = time.perf_counter()
        trajs = self._collect(step)
        t_roll = time.perf_counter() - t0
        # written before the next backend call, which may give up on a worker and stop the run
        write_lost_episodes(self.run_dir, step, trajs)
        # the backend's counts never decrease: a restarted rollout worker's are carried over its restart
        # (`PrefillTally`), so this is the sum of the workers' counts in the step
        prefill = {k: v - before.get(k, 0) for k, v in self.engine.prefill_counts().items()}
        rollout = rollout_stats(trajs)
        usable = [x for x in trajs if x.end_reason != "error" and x.num_action_tokens > 0]
        if not usable:
            return {**self._skip_step(step, trajs, rollout, time.perf_counter() - t0), **self._new_restarts()}
        batch = self._score(usable)
        t1 = time.perf_counter()
        with build.learner_threads(self.cfg) as n_threads:
            batch, prep, mismatch, upd = self._learn(step, usable, batch)
        t_train = time.perf_counter() - t1
        # sync: the engine requantizes the new masters with fresh scales
        sync = self.engine.update_weights(self.learner.named_weights(), version=step)
        self.synced_version = step
        gen_tokens = sum(x.num_action_tokens for x in trajs)
        row = {
            **rollout, "adv_abs_mean": float(batch.adv.abs().mean()) if len(batch.adv) else 0.0,
            "action_tokens": gen_tokens, "tokens_per_s": gen_tokens / max(t_roll, 1e-9),
            **upd, **mismatch,
            "int8_codes_changed": sync.int8_codes_changed, "sync_time_s": sync.seconds, **sync_metrics(sync),
            "kv_bytes_per_token": self.engine.kv_bytes_per_token(),
            "rollout_time_s": t_roll, "train_time_s": t_train, "step_time_s": time.perf_counter() - t0, **prefill,
            "learner_threads": n_threads, "skipped_step": 0, **self._new_restarts(),
        }
        self._check_update(step, upd, set(prep.stats) & set(row))
        return {**row, **prep.stats}

    def _check_update(self, step: int, upd: dict[str, float], clash: set[str]) -> None:
        """Stop on an objective whose `prepare` stats reuse agentq's metric names (they replaced them in
        the row without a word), and say when no minibatch stepped (every gradient NaN or inf: the
        weights did not change, and grad_norm is NaN); trainer.max_skipped_steps such steps in a row
        stop the run, as steps without a usable episode do."""
        if clash:
            raise RunAborted(f"the objective {self.cfg.algo.objective!r} logs {sorted(clash)} from its prepare, names of "
                             "agentq's own metrics, which they would replace: rename them")
        if upd.get("optimizer_steps", 1) or not upd.get("skipped_nonfinite_grad"):
            self.skipped_in_a_row = 0
            return
        limit = self._one_more_skipped()
        console.print(f"step {step}: every minibatch's gradient was NaN or inf, so no optimizer step ran and the weights "
                      f"did not change ({self.skipped_in_a_row} such or skipped steps in a row, limit {limit}; the "
                      "objective's loss or its weights are not finite)", style="yellow", markup=False,
                      highlight=False, soft_wrap=True)
        if self.skipped_in_a_row >= limit:
            raise RunAborted(f"{self.skipped_in_a_row} steps in a row changed no weight (every gradient NaN or inf); "
                             f"stopping (trainer.max_skipped_steps={limit})")

    def _new_restarts(self) -> dict[str, int]:
        """The env and rollout worker restarts (and recovered resets, `worker_counts`) since the previous
        step row or evaluation, for this row (an evaluation's are its own row's: `evaluate`)."""
        now = worker_counts(self.pool, self.engine)
        new = counts_since(self._restarts_logged, now)
        self._restarts_logged = now
        return new

    def _collect(self, step: int) -> list[Trajectory]:
        """Rollouts from the behaviour policy (the quantized engine): `group_size` episodes of each of
        `tasks_per_step` sampled training tasks. A worker given up on (`RunAborted`) stops the run in the
        middle of them: the step's lost episodes are written to errors.jsonl first (`stopped_episodes`),
        as a step that completes writes its own, so the give-up call's are not missing from the record."""
        t = self.cfg.trainer
        tasks = sample_tasks(self.train_tasks, int(t.tasks_per_step), self.rng)
        specs = build.episode_specs(tasks, self.train_split, int(self.cfg.seed), self.next_episode_id,
                                    int(t.group_size))
        self.next_episode_id += len(specs)
        ended: list[Trajectory] = []
        try:
            return self.loop.run(specs, BackendPolicy(self.engine, version=self.synced_version), on_done=ended.append)
        except RunAborted as e:
            write_lost_episodes(self.run_dir, step, stopped_episodes(specs, ended, str(e)))
            raise

    def _score(self, usable: list[Trajectory]) -> PolicyBatch:
        """The padded batch with GRPO advantages (episode reward standardised within its task's group)."""
        rewards = torch.tensor([x.reward for x in usable], dtype=torch.float32)
        groups = torch.tensor([x.group_id for x in usable])
        return collate(usable, grpo_advantages(rewards, groups), pad_id=self.tokenizer.pad_token_id or 0)

    def _learn(self, step: int, usable: list[Trajectory], batch: PolicyBatch
               ) -> tuple[PolicyBatch, Prepared, dict[str, float | list[float]], dict[str, float]]:
        """The no-grad log-prob pass, the objective's weights and the update, in `old_logp_mode`'s
        order: recompute fills π_old and π_ref, weighs, then updates; bypass fills π_ref only, and
        the update fills π_old and weighs per micro-batch, so the same weights, mismatch metrics and
        segment history follow from the filled batch after it (`_weigh`).

        Returns:
            (the weighted batch, the objective's `Prepared`, mismatch metrics, update metrics with
            `old_ref_time_s`, the no-grad pass's seconds, and `old_logp_bypass` 0 / 1).
        """
        bypass = self.old_logp_mode == "bypass"
        t0 = time.perf_counter()
        (self.learner.fill_ref if bypass else self.learner.fill_old_and_ref)(batch)
        timing = {"old_ref_time_s": time.perf_counter() - t0, "old_logp_bypass": int(bypass)}
        if bypass:
            upd = self._update(batch, step)
            batch, prep, mismatch = self._weigh(step, usable, batch)
        else:
            batch, prep, mismatch = self._weigh(step, usable, batch)
            upd = self._update(batch, step)
        return batch, prep, mismatch, {**upd, **timing}

    def _weigh(self, step: int, usable: list[Trajectory],
               batch: PolicyBatch) -> tuple[PolicyBatch, Prepared, dict[str, float | list[float]]]:
        """The rollout ‖ learner mismatch and the objective's per-token weights (once per batch) of a
        batch with old_logp filled; the segment history is written here.

        Returns:
            (the weighted batch, the objective's `Prepared`, mismatch metrics).
        """
        mismatch = mismatch_metrics(batch)
        prep = self.objective.prepare(batch)
        batch = batch.weighted(prep)
        if segments_due(self.cfg.trainer.get("save_segments", True), step):   # the history (eval/segments.py)
            write_segments(self.run_dir, step, segment_rows(step, usable, batch, getattr(
                self.objective, "retention", None), token_decoder(self.tokenizer)))
        return batch, prep, mismatch

    def _update(self, batch: PolicyBatch, step: int) -> dict[str, float]:
        """PPO epochs over minibatches of `batch` at RL step `step`'s learning rate (`step_lr`);
        returns the learner's update metrics with `lr`."""
        t = self.cfg.trainer
        lr = step_lr(t, step)
        upd = self.learner.update(batch, self.objective, epochs=int(t.ppo_epochs),
                                  minibatch_size=int(t.minibatch_size) if t.minibatch_size else None,
                                  generator=self.gen, old_logp_mode=self.old_logp_mode, lr=lr)
        return {**upd, "lr": lr}

    def _one_more_skipped(self) -> int:
        """Count one more step in a row that changed no weight (no usable episode, or no finite
        gradient); returns trainer.max_skipped_steps, the count that stops the run."""
        self.skipped_in_a_row += 1
        return int(self.cfg.trainer.get("max_skipped_steps", 3))

    def _skip_step(self, step: int, trajs: list[Trajectory], rollout: dict, seconds: float) -> dict:
        """A step without one usable episode (all errored, or none produced an action token, e.g. the
        first prompt exceeds env.max_context_tokens): no update, a logged row, and after
        trainer.max_skipped_steps such steps in a row the run stops with the reason."""
        limit = self._one_more_skipped()
        reasons = {r: sum(x.end_reason == r for x in trajs) for r in sorted({x.end_reason for x in trajs})}
        lost = [x for x in trajs if x.end_reason == "error"]
        # the first error as errors.jsonl records it (its first line), or an env whose every reset
        # raises is only "end reasons {'error': 4}" until the run stops at max_skipped_steps, or ends
        said = (f"; the first error, task {lost[0].task_id!r}: {first_line(lost[0].error) or '?'} (each lost episode's "
                f"error in {self.run_dir / 'errors.jsonl'})" if lost else "")
        console.print(f"step {step}: no usable episode ({len(trajs)} episodes, end reasons {reasons}); "
                      f"skipped without an update ({self.skipped_in_a_row} in a row, limit {limit}){said}",
                      style="yellow", markup=False, highlight=False, soft_wrap=True)
        if self.skipped_in_a_row >= limit:
            hint = (f". 'context' means the first prompt does not fit env.max_context_tokens="
                    f"{int(self.cfg.env.max_context_tokens)}" if "context" in reasons else "")
            raise RunAborted(
                f"{self.skipped_in_a_row} steps in a row had no usable episode (last: end reasons {reasons}; "
                f"lost episodes' errors in {self.run_dir / 'errors.jsonl'}); stopping "
                f"(trainer.max_skipped_steps={limit}){hint}")
        return {**rollout, "action_tokens": sum(x.num_action_tokens for x in trajs), "step_time_s": seconds,
                "skipped_step": 1}

    # ------------------------------------------------------------------ eval, checkpoints
    def evaluate(self, step: int, num_tasks: int | None) -> dict:
        """The held-out evaluation at `step` (the same `num_tasks` tasks every time), into eval/step_*/."""
        cfg = self.cfg
        first = num_tasks not in self._eval_selection      # the replay warning, once a selection: its tasks stay
        if first:
            self._eval_selection[num_tasks] = choose_eval_tasks(cfg, self.eval_split, num_tasks)
        # the training pool plays the eval episodes (each reset names its split): no second set of
        # workers holding CPUs (a Ray cluster the size of the training pool could not place them)
        report = evaluate_policy(cfg, self.engine, self.pool, self.chat, self._eval_selection[num_tasks],
                                 self.eval_split, self.run_dir / "eval" / f"step_{step:06d}", seed=eval_seed(cfg),
                                 max_concurrent=self.n_conc, first_id=EVAL_FIRST_ID, repeats=int(cfg.eval.repeats),
                                 description=f"eval step {step}", warn_replays=first, step=step)
        self.eval_history.append(report)
        # its restarts are in its report (eval/env_worker_restarts ...): not counted again in the next step row
        self._restarts_logged = worker_counts(self.pool, self.engine)
        self.logger.log(step, {k: v for k, v in report.items() if isinstance(v, (int, float))}, prefix="eval/")
        # said once each, at the first evaluation that has such episodes (the final one may play more tasks)
        for key, check in (("unplayed", check_unplayed), ("errors", check_errors)):
            if report.get(key) and not any(r.get(key) for r in self.eval_history[:-1]):
                warn_lost(check, cfg, report, step)
        return report

    def save(self, step: int) -> Path:
        path = self.run_dir / "checkpoints" / f"step_{step:06d}"
        save_hf_checkpoint(self.learner.model, path, self.tokenizer,
                           extra={"step": step, "env": self.cfg.env.name, "algo": self.cfg.algo.name,
                                  "rollout_quant": self.cfg.rollout.quant},
                           trainer_state=TrainerState(
                               tensors={"optimizer": self.learner.opt.state_dict(), "torch_gen": self.gen.get_state()},
                               meta={"step": step, "np_rng": self.rng.bit_generator.state,
                                     "init_path": str(self.init_path), "skipped_in_a_row": self.skipped_in_a_row,
                                     "next_episode_id": self.next_episode_id, "run_id": self.run_id}))
        prune_checkpoints(self.run_dir, int(self.cfg.trainer.keep_checkpoints))
        return path

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict:
        """Run the remaining steps; checkpoint at the end and evaluate on the held-out split
        (`final_eval_tasks` tasks). However it ends, the workers and the run folder are released
        (`close`): a pipeline or sweep stopped in its RL stage, then started again in the same
        process, found the folder still locked."""
        try:
            return self._train()
        finally:
            self.close()

    def _train(self) -> dict:
        t = self.cfg.trainer
        steps = int(t.steps)
        save_every, eval_every = int(t.save_every), int(t.eval_every)
        last = None
        no_actions_said = False         # said once while no reply parses, again only after one did
        self._evaluate_if_due_at_resume(eval_every, steps)
        with progress(plain_lines=False) as prog:       # a log file gets step_line, each step
            bar = prog.add_task(f"RL {self.cfg.env.name} [{self.cfg.algo.name}]", total=steps,
                                completed=self.start_step, info="")
            for step in range(self.start_step + 1, steps + 1):
                m = self.step(step)
                self.logger.log(step, m)
                rate = float(m.get("invalid_action_rate", 0))
                if rate >= 1 and not no_actions_said:
                    warn_no_parsed_actions(self.cfg, step, m)
                if rate == rate:            # a NaN rate (every episode errored) says nothing of the replies
                    no_actions_said = rate >= 1
                last = m
                prog.update(bar, advance=1, info=f"reward {m['reward_mean']:.3f} succ {m['success_rate']:.2f}"
                                                 f"{errored_note(m)} k3 {m.get('k3', float('nan')):.1e}")
                if not console.is_terminal:      # a log file: the bar only prints at the end
                    console.print(step_line(step, steps, m), markup=False, highlight=False, soft_wrap=True)
                if save_every > 0 and step % save_every == 0 and step < steps:
                    self.save(step)
                if eval_every > 0 and step % eval_every == 0 and step < steps:
                    self._periodic_eval(step)
        # resumed at the last step: that checkpoint is already the final one (re-saving only risks it)
        final = self.save(steps) if self.start_step < steps else self.run_dir / "checkpoints" / f"step_{steps:06d}"
        report = self._final_eval(steps, final_eval_tasks(t)) if eval_every >= 0 else None
        if last is None:        # resumed at the last step: its logged row is the run's last
            last = recorded_step(self.run_dir, steps)[0]
        summary = {"run_dir": str(self.run_dir), "checkpoint": str(final), "steps": steps, "last_step": last,
                   "final_eval": report, "totals": self._totals(), "notes": self._notes()}
        write_text_replacing(self.run_dir / "train_summary.json", json.dumps(jsonable(summary), indent=2, default=str))
        write_run_plots(self.run_dir, self.eval_split)        # learning_curve.png, mismatch.png
        return summary

    def _notes(self) -> list[str]:
        """train_summary.json's `notes`, each also a warning: an objective whose correction never engaged
        over the run (`idle_correction_note`; a resumed run's earlier steps count too)."""
        path = self.run_dir / "metrics.jsonl"
        note = idle_correction_note(self.objective, read_metrics(path) if path.exists() else [])
        if note is not None:
            console.print(f"warning: {note}", style="yellow", markup=False, highlight=False, soft_wrap=True)
        return [note] if note is not None else []

    def _totals(self) -> dict[str, int]:
        """train_summary.json's `totals`: errored episodes and worker restarts over the whole run, from
        metrics.jsonl (`run_totals`; a resumed run's steps before the resume count too)."""
        path = self.run_dir / "metrics.jsonl"
        return run_totals(read_metrics(path) if path.exists() else [])

    def _evaluate_if_due_at_resume(self, eval_every: int, steps: int) -> None:
        """The held-out evaluation due at the checkpoint a run resumes from, when the run stopped
        between that checkpoint and its evaluation (a kill): the loop saves step N, then evaluates
        it, and a resume starts at N + 1. The checkpoint holds step N's weights and the evaluation
        draws none of the trainer's random numbers, so it is the one the run would have logged."""
        n = self.start_step
        if 0 < n < steps and eval_every > 0 and n % eval_every == 0 and recorded_step(self.run_dir, n)[1] is None:
            self._periodic_eval(n)

    def _periodic_eval(self, step: int) -> dict:
        """A `trainer.eval_every` evaluation, its result said in one plain line (`eval_line`): a log file
        showed only a blank line, the result only in metrics.jsonl (the final one's is on the run's last line)."""
        report = self.evaluate(step, int(self.cfg.trainer.eval_num_tasks))
        console.print(eval_line(step, report), markup=False, highlight=False, soft_wrap=True)
        return report

    def _final_eval(self, steps: int, num_tasks: int) -> dict:
        """The held-out evaluation at the last step. A run resumed at that step whose evaluation is
        already recorded (a run finished, resumed again) keeps it: evaluating again would log a
        second eval row at that step (metrics.jsonl, TensorBoard) with the same episodes."""
        if self.start_step == steps:
            report = recorded_step(self.run_dir, steps)[1]
            if report is not None:
                ckpt = self.run_dir / "checkpoints" / f"step_{steps:06d}"
                console.print(f"the final evaluation at step {steps} is recorded ({report['out_dir']}); for "
                              f"another: agentq eval {shlex.quote(f'checkpoint={ckpt}')}", markup=False, highlight=False)
                self.eval_history.append(report)
                return report
        return self.evaluate(steps, num_tasks)

    def close(self):
        self.logger.close()
        self.pool.close()
        self.placement.close()
        self._lock.close()          # releases the run folder


def train(cfg: DictConfig, overrides: list[str] | None = None) -> dict:
    """`agentq train`; with trainer.resume and the command line's `overrides`, the run's own config
    with them on top (`resumed_config`)."""
    if cfg.trainer.resume and overrides is not None:
        check_resume_dir(cfg.trainer.resume)    # a missing folder is named, not read as "no config.yaml"
        cfg = resumed_config(cfg, overrides)
    trainer = RLTrainer(cfg)
    # Ctrl-C, a worker or rank given up on, skipped steps: where the run stands, not a traceback; train()
    # has closed the trainer, unless a second Ctrl-C cut that short (a second close finishes it)
    with says_where_on_stop(lambda: interrupted_text(trainer.run_dir, overrides or []), close=trainer.close):
        summary = trainer.train()
    print_run_end(summary, str(cfg.env.train_split))
    return summary


def interrupted_text(run_dir: Path, overrides: list[str]) -> str:
    """What an interrupted `agentq train` left: the run folder and the command that goes on from it,
    a resume from its last checkpoint, or before the first one the same command line (`overrides`)
    starting it again there."""
    folder = shlex.quote(str(run_dir))
    if not run_dir.is_dir():            # removed as left empty: nothing to go on from
        return ""
    last = last_step_checkpoint(run_dir)
    if last is None:
        again = [o for o in overrides if not o.startswith(("trainer.out_dir=", "trainer.overwrite="))]
        command = shlex.join(["agentq", "train", *again])
        return (f"run folder {run_dir} has no checkpoint yet; start it again with {command} "
                f"trainer.out_dir={folder} trainer.overwrite=true")
    return f"run folder {run_dir}, last checkpoint {last}; continue it with agentq train trainer.resume={folder}"


def warn_no_parsed_actions(cfg: DictConfig, step: int, m: dict) -> None:
    """Say when no turn of a step wrote a parseable action: every reward, hence every GRPO advantage,
    is the same and the update learns nothing. The default tiny model, untrained, never writes one, and
    its run read "reward 0.000 ... loss 0.0000" with the cause only in metrics.jsonl."""
    if not float(m.get("invalid_action_rate", 0)) >= 1:    # NaN (every episode errored): the env's fault, said apart
        return
    tag = cfg.agent.action_tag
    path = OmegaConf.select(cfg, "model.path", default=None, throw_on_missing=False)
    advice = (f"the model at model.path={path} does not follow the action format yet: more or better SFT (agentq sft with more "
              "demonstrations or steps), or model.path=<a model that follows the prompt>" if path else
              "An untrained model never writes one: start from an SFT checkpoint (agentq sft, then "
              "model.path=<its checkpoint>; or agentq pipeline), or model.path=<a model that follows the prompt>")
    console.print(f"warning: step {step}: no reply had a parseable <{tag}>...</{tag}> (invalid_action_rate 1.0), so "
                  f"every episode scores alike and the update learns nothing. {advice}", style="yellow",
                  markup=False, highlight=False, soft_wrap=True)


def warn_lost(check: Callable[[DictConfig, dict], None], cfg: DictConfig, report: dict, step: int) -> None:
    """Say when held-out episodes were lost, as `agentq eval` does (`check`: `check_unplayed`, episodes
    that ended before their first turn; `check_errors`, episodes whose env failed): they count as lost,
    and the run's held-out success read as the policy's. Where every episode was, where `agentq eval`
    refuses, the run goes on (its training episodes may fare better) with a warning."""
    try:
        check(cfg, report)
    except ConfigError as e:
        console.print(f"warning: the held-out evaluation at step {step}: {e}", style="yellow", markup=False,
                      highlight=False, soft_wrap=True)


def unplayed_text(r: dict) -> str:
    """"N of M not played (why; counted as lost)" for an evaluation report with episodes that ended
    before their first turn (`unplayed`), else ""; the trainer's last line, beside `errored_text`."""
    n = int(r.get("unplayed") or 0)
    limit = (r.get("limits") or {}).get("max_context_tokens")
    why = "their first prompt does not fit env.max_context_tokens" + (f"={limit}" if limit is not None else "")
    return f"{n} of {r['episodes']} not played ({why}; counted as lost)" if n else ""


def sync_metrics(sync: SyncStats) -> dict[str, float]:
    """A backend's own numbers about a weight sync (`SyncStats.extra`) as metrics `sync/<name>`: numbers
    and booleans (as 0 / 1); text and other values are left out (TensorBoard takes numbers only)."""
    return {f"sync/{k}": float(v) for k, v in sync.extra.items() if isinstance(v, (int, float))}


def eval_line(step: int, r: dict) -> str:
    """One plain line for a held-out evaluation during training, from its report (its eval row's
    numbers: eval/success_rate, eval/episodes, eval/score_mean), e.g. "eval step 4: success 37.5 % of
    8 episodes (split dev), score 0.410", with its errored and unplayed episodes where there are any."""
    def num(key: str, scale: float, fmt: str) -> str:
        v = r.get(key)
        return format(scale * v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"
    notes = "".join(f", {n}" for n in (errored_text(r), unplayed_text(r)) if n)
    return (f"eval step {step}: success {num('success_rate', 100, '.1f')} % of {r.get('episodes', 0)} episodes "
            f"(split {r.get('split', '?')}), score {num('score_mean', 1, '.3f')}{notes}")


def print_run_end(summary: dict, train_split: str | None = None) -> None:
    """Where the run went (an unnamed run's folder has a timestamp: the user had to `ls runs/`
    for the checkpoint `agentq eval` takes) and the final held-out result (`train_split`: the split
    training drew from; an evaluation on it is not called held-out, as the start-up warning says)."""
    ev = summary.get("final_eval")
    notes = "".join(f", {n}" for n in (errored_text(ev), unplayed_text(ev)) if n) if ev else ""
    held = (f"{ev['split']} (the training split, not held out)" if ev and ev["split"] == train_split
            else f"held-out {ev['split']}" if ev else "")
    result = (f"; {held}: success {100 * ev['success_rate']:.1f} % of {ev['episodes']} episodes "
              f"({ev['out_dir']}){notes}" if ev else "")
    console.print(f"run folder {summary['run_dir']}; final checkpoint {summary['checkpoint']}{result}; "
                  f"HTML report: agentq report {shlex.quote(str(summary['run_dir']))}", markup=False, highlight=False,
                  soft_wrap=True)       # quoted: a folder with a space pastes as one argument
