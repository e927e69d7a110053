"""The run folder's guards: one process per folder (a lock), no silent mixing of two runs, no
stale temporary checkpoint folders or files, and a written record of every lost episode.

    run_dir = Path(cfg.trainer.out_dir or new_run_dir("alfworld-grpo"))   # runs/alfworld-grpo-<time>
    lock = claim_run_dir(run_dir, resume=..., overwrite=...)   # at start-up, before anything is built
    write_lost_episodes(run_dir, step, trajectories)            # each step: errors.jsonl
"""
from __future__ import annotations

import re
import shlex
import shutil
import time
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING

from omegaconf import DictConfig, ListConfig, OmegaConf

from agentq.config import (CONFIG_FOOTER, CONFIG_HEADER, RUN_CONFIG_KEYS, ConfigError, differing_settings,
                           make_setting_dir, settings_damage)
from agentq.eval.episodes import recover_eval_pairs
from agentq.utils.checkpoint import restore_interrupted_commits
from agentq.utils.errors import RunAborted
from agentq.utils.files import remove_stale_temporaries, write_text_replacing
from agentq.utils.folder_lock import LOCK_FILE, lock_folder, lock_holder
from agentq.utils.jsonl import append_jsonl, drop_rows_after
from agentq.utils.logging import WANDB_ID_FILE
from agentq.utils.run_folders import folder_owners, found_in, whose_run

if TYPE_CHECKING:
    from agentq.agent.trajectory import Trajectory

ERRORS_FILE = "errors.jsonl"
#: the run's id, written at its start; every checkpoint carries it, so a resume tells a checkpoint that
#: another run wrote (a checkpoints/ folder copied in) from the run's own
RUN_ID_FILE = "run_id"
#: one row a resume that runs steps: the step it resumed at and the settings it changed (config.yaml
#: holds the latest settings only)
RESUMES_FILE = "resumes.jsonl"
#: what `logger=[..., wandb]` writes into a run folder: its offline W&B files and the W&B run id a resume
#: continues (an overwritten run's, left, made a later resume log into the replaced run's W&B run)
WANDB_ARTIFACTS = ("wandb", WANDB_ID_FILE)
#: what a training run writes into its folder (and `agentq report` beside it): the evidence that a
#: folder holds a run, and what `trainer.overwrite=true` removes (nothing else in the folder is touched)
RUN_ARTIFACTS = ("metrics.jsonl", "checkpoints", "tb", "eval", "train_summary.json", ERRORS_FILE, "segments",
                 "learning_curve.png", "mismatch.png", "report.html", RESUMES_FILE, RUN_ID_FILE, *WANDB_ARTIFACTS)
#: what a run writes when it completes: a resume that runs steps removes them until it completes again
COMPLETION_ARTIFACTS = ("train_summary.json", "learning_curve.png", "mismatch.png")
#: the same for an `agentq sft` folder (demos.jsonl is left: a fresh collection replaces it whole,
#: and `sft.demos` may name it)
SFT_ARTIFACTS = ("metrics.jsonl", "tb", "checkpoint", "sft_summary.json", *WANDB_ARTIFACTS)
#: the same for an `agentq pipeline` folder: its stages' folders, its evaluations (glob patterns, as
#: `holds_run` reads every name here), the summary, the curve and `agentq report`'s page
PIPELINE_ARTIFACTS = ("sft", "rl", "eval_sft_*", "eval_rl_*", "summary.json", "learning_curve.png", "report.html")
#: the same for an `agentq sweep` folder (never removed: a sweep given its folder again resumes)
SWEEP_ARTIFACTS = ("sft", "eval_sft", "arms", "table.md", "table.json", "curves.png")
#: each command's folder: what `trainer.overwrite=true` removes (`claim_run_dir`)
ARTIFACTS = {"train": RUN_ARTIFACTS, "sft": SFT_ARTIFACTS, "pipeline": PIPELINE_ARTIFACTS, "sweep": SWEEP_ARTIFACTS}


def new_run_dir(name: str) -> Path:
    """The folder of a run the user did not name: `runs/<name>-<YYYYmmdd-HHMMSS>` (relative to the
    working directory). `name` says what ran, e.g. `sft-alfworld`, `pipeline-textworld_express`; it
    is made one folder name as `agentq eval`'s output folders are (`sft-wordle_env:WordEnv` →
    `sft-wordle_env_WordEnv`: a plugin's ":" or a Gymnasium id's "/" is no nested folder)."""
    # imported here: the CLI imports this module for every command, the evaluation (torch) only to run
    from agentq.eval.evaluate import folder_name

    return Path("runs") / f"{folder_name(name)}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunDirError(ConfigError):
    """The run folder cannot be used as asked (in use, or holds another run)."""


def make_run_dir(folder: str | Path, key: str) -> Path:
    """`folder`, created (parents too); `RunDirError` naming `key` when it cannot be."""
    return make_setting_dir(folder, key, "run folder", RunDirError)


def last_step_checkpoint(run_dir: Path) -> str | None:
    """The name of a train run's last checkpoint (step_N) a resume would restore, None before its first:
    a checkpoint a kill left as .step_N.old counts (`check_resume_dir` accepts it)."""
    steps = [p.name for p in step_checkpoints(run_dir)]
    steps += [p.name[1:-len(".old")] for p in (run_dir / "checkpoints").glob(".step_*.old") if p.is_dir()]
    return max(steps) if steps else None


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints/step_* in step order, without the folders of removed ones that only hold
    the evaluations written into them (`prune_checkpoints`)."""
    # step_N only: a copy kept beside them (step_000002.bak) is neither resumed from nor pruned
    return [p for p in sorted((run_dir / "checkpoints").glob("step_*")) if re.fullmatch(r"step_\d+", p.name)
            and not (p.is_dir() and all(c.is_dir() for c in p.iterdir()))]


def holds_run(run_dir: Path, artifacts: tuple[str, ...] = RUN_ARTIFACTS) -> list[str]:
    """The run artifacts present in `run_dir` (empty: a fresh folder), as `found_in` gives them."""
    return found_in(run_dir, artifacts)


def claim_run_dir(run_dir: str | Path, resume: bool, overwrite: bool, kind: str = "train",
                  out_key: str = "trainer.out_dir", remove: bool = True) -> IO:
    """Lock `run_dir` for this process and make sure it may be written.

    Args:
        run_dir: the run folder (created if missing: `make_run_dir`).
        resume: the run continues the one in the folder (`trainer.resume`; a sweep always).
        overwrite: the folder's earlier run may be replaced (`trainer.overwrite`).
        kind: the command whose folder it is (`ARTIFACTS`: train, sft, pipeline, sweep).
        out_key: the setting that named the folder (or the one it is in), for the error message.
        remove: remove an overwritten run's files now; False leaves that to the caller
            (`remove_run_artifacts`), once its own start-up can no longer fail on a bad setting, so a
            typo does not cost the earlier run.
    Returns:
        the open lock file; the lock lasts until it is closed (or the process exits).
    Raises:
        RunDirError: the folder cannot be created, another process holds it, it holds another
        command's run (`agentq.utils.run_folders.MARKERS`), or a run of this one and neither `resume`
        nor `overwrite` was given.
        Any error once the folder is locked (this one, an OSError of the clean-up, KeyboardInterrupt)
        releases it first.
    """
    run_dir = make_run_dir(run_dir, out_key)
    # a resume cannot pick another folder: it waits
    advice = RESUME_WAITS if resume and kind == "train" else f"wait for it to finish or pick another {out_key}"
    lock = lock_folder(run_dir, lambda pid: in_use(run_dir, pid, advice), what="run folder")
    try:
        check_kind(run_dir, kind, out_key)
        found = holds_run(run_dir, ARTIFACTS[kind])
        if found and not resume and not overwrite:
            # trainer.resume only where the command reads it (`agentq train`, not a pipeline's RL stage)
            resume_hint = (f"continue it with trainer.resume={str(run_dir)!r}, "
                           if kind == "train" and out_key == "trainer.out_dir" else "")
            raise RunDirError(
                f"run folder {str(run_dir)!r} ({out_key}) already holds a run ({', '.join(found)}); {resume_hint}"
                f"pick another {out_key}, or replace it with trainer.overwrite=true")
        if found and not resume and remove:
            remove_run_artifacts(run_dir, ARTIFACTS[kind])
        remove_stale_temp_dirs(run_dir / "checkpoints")
        # the temporaries of config.yaml, metrics.jsonl, the summaries, table.md ... a kill left (`replaced`)
        remove_stale_temporaries(run_dir)
        # an evaluation of this run whose write a kill cut short: its last pair back (only the run's own
        # eval/step_*, which the lock guards: `agentq eval` writes into checkpoints/ without it)
        recover_eval_pairs(sorted((run_dir / "eval").glob("step_*")))
    except BaseException:       # a refusal, an OSError of the clean-up, Ctrl-C: the folder is free again
        lock.close()
        raise
    return lock


#: what a `trainer.resume` of a run folder another process holds is told to do
RESUME_WAITS = "wait for it to finish (or stop it), then resume it"


def in_use(run_dir: Path, pid: str, advice: str) -> RunDirError:
    """The refusal of a run folder another agentq process holds (its lock, with the `pid` it wrote)."""
    return RunDirError(f"run folder {str(run_dir)!r} is in use by another agentq process (pid {pid}); {advice}")


def check_kind(run_dir: Path, kind: str, out_key: str) -> None:
    """Refuse a folder that holds another command's run, whatever resume / overwrite say: the command
    with the most `MARKERS` found is its owner (a pipeline of an older agentq wrote a sweep's eval_sft/
    beside its summary.json and rl/); with none found, one cut short with `SHARED_MARKERS` of others.

    Raises:
        RunDirError: naming the command(s) whose folder it is and what says so.
    """
    for owners, names in folder_owners(run_dir):
        if kind in owners:
            continue
        rl = pipeline_rl_stage(run_dir, owners)
        hint = (f"; continue its RL stage with trainer.resume={str(rl)!r}"
                if kind == "train" and out_key == "trainer.out_dir" and rl else "")
        raise RunDirError(f"run folder {str(run_dir)!r} ({out_key}) holds an {whose_run(owners)} run "
                          f"({', '.join(names)}), not an `agentq {kind}` one: pick another {out_key} "
                          f"(trainer.overwrite=true replaces only a run of the same command){hint}")


def pipeline_rl_stage(run_dir: Path, owners: tuple[str, ...]) -> Path | None:
    """A pipeline folder's RL stage (<pipeline>/rl), the `agentq train` run it holds; None for
    another command's folder, or a pipeline's before its RL stage began."""
    rl = run_dir / "rl"
    return rl if "pipeline" in owners and rl.is_dir() else None


def remove_run_artifacts(run_dir: str | Path, artifacts: tuple[str, ...] = RUN_ARTIFACTS) -> list[str]:
    """Remove the files of the run in `run_dir` (`trainer.overwrite`; nothing else in the folder is
    touched). Only after `claim_run_dir` allowed it. Returns what was removed."""
    found = holds_run(Path(run_dir), artifacts)
    for name in found:
        path = Path(run_dir) / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return found


def read_run_id(run_dir: str | Path) -> str | None:
    """The id in the run folder's `run_id` file; None for a folder without one (a run begun before
    run ids, or an unreadable file: a resume then takes its checkpoint's)."""
    try:
        found = (Path(run_dir) / RUN_ID_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return found or None


def write_run_id(run_dir: str | Path, run_id: str | None = None) -> str:
    """Write `run_id` (a new random one when None) into the run folder; returns it."""
    run_id = run_id or uuid.uuid4().hex
    write_text_replacing(Path(run_dir) / RUN_ID_FILE, run_id + "\n")
    return run_id


def write_run_config(run_dir: str | Path, cfg: DictConfig) -> Path:
    """`run_dir/config.yaml`: the run's resolved config, written once the run has started (an RL run's
    and an SFT run's: `trainer.resume` and `agentq eval`'s trained-otherwise check read it), replaced
    whole (a kill or a full disk mid-write leaves the old file, never an empty one).

    Returns:
        the file's path.
    """
    path = Path(run_dir) / "config.yaml"
    write_text_replacing(path, f"{CONFIG_HEADER}\n{OmegaConf.to_yaml(cfg, resolve=True)}{CONFIG_FOOTER}\n")
    return path








def read_run_config(path: Path, needs: tuple[str, ...] = RUN_CONFIG_KEYS) -> DictConfig | None:
    """A run folder's config.yaml (`path`) as `write_run_config` wrote it; None when there is none.

    Args:
        needs: the top-level keys the reader needs (default: every run's).
    Raises:
        ConfigError: the file is damaged (not UTF-8 or YAML, empty, no mapping, without a key of `needs`),
        in one line naming the folder, the damage and what to do (`restore_config_hint`).
    """
    if not path.is_file():
        return None
    saved, why = settings_damage(path, needs)
    if why:
        raise ConfigError(f"run folder {str(path.parent)!r}: {path.name} is damaged ({why}); "
                          f"{restore_config_hint(path.parent)}")
    assert isinstance(saved, DictConfig)
    return saved





def restore_config_hint(run_dir: str | Path) -> str:
    """What a user with a run folder whose config.yaml is missing or damaged can do. A pipeline's RL
    stage (`<pipeline.out_dir>/rl`) ran the pipeline's settings with its own eval split and folder, so
    the pipeline's command line alone would write other settings back: the hint adds those two."""
    run_dir = Path(run_dir)
    cfg = shlex.quote(str(run_dir / "config.yaml"))
    parent = run_dir.parent
    if run_dir.name == "rl" and (parent / "sft").is_dir() and (
            (parent / "summary.json").exists() or any(parent.glob("eval_sft_*"))):   # a pipeline's, not sft/ + rl/ runs
        settings = (f"agentq config pipeline <the pipeline's overrides> env.eval_split=<its first pipeline.eval_splits> "
                    f"trainer.out_dir={shlex.quote(str(run_dir))} > {cfg}")
    else:
        settings = f"agentq config <the command line that started the run> > {cfg}"
    return (f"write the run's settings back ({settings}), or start a new run from a checkpoint's weights "
            f"(model.path={shlex.quote(str(run_dir / 'checkpoints'))}/step_N)")


def _has_checkpoints(checkpoints: Path) -> bool:
    """A step_* checkpoint in a run's `checkpoints` folder (or a .step_*.old: a kill mid-commit, which
    claim_run_dir restores)."""
    return any(p.is_dir() for p in [*checkpoints.glob("step_*"), *checkpoints.glob(".step_*.old")])


def check_resume_dir(resume: str | Path) -> None:
    """Refuse a `trainer.resume` that names no run folder with a checkpoint, before anything is
    created or locked there (a typo would otherwise leave an empty folder behind).

    Raises:
        ConfigError: the folder is missing, is a checkpoint or a run's checkpoints/ (naming its run
        folder), is another command's folder (a pipeline's: naming its rl/; an SFT run's: naming
        model.path=<its checkpoint>), or has no checkpoints/step_* (`RunDirError` where another agentq
        process holds it: a run before its first checkpoint, said to be in use as `claim_run_dir` says).
    """
    folder = Path(resume)
    where = f"trainer.resume={str(resume)!r}"
    if not folder.is_dir():
        raise ConfigError(f"{where}: no such run folder")
    if not _has_checkpoints(folder / "checkpoints"):
        if folder.parent.name == "checkpoints" and (
                folder.name.startswith("step_") or (folder / "trainer_state.json").exists()):
            raise ConfigError(f"{where} is a checkpoint; trainer.resume takes its run folder "
                              f"({str(folder.parent.parent)!r}) and continues from its latest checkpoint")
        if folder.name == "checkpoints" and _has_checkpoints(folder):
            raise ConfigError(f"{where} is a run's checkpoints folder; trainer.resume takes the run folder above "
                              f"it ({str(folder.parent)!r}) and continues from its latest checkpoint")
        for owners, names in folder_owners(folder):
            if "train" in owners:
                continue
            what = f"{where} is an {whose_run(owners)} folder ({', '.join(names)}), not an `agentq train` run"
            if rl := pipeline_rl_stage(folder, owners):
                raise ConfigError(f"{what}; continue its RL stage with trainer.resume={str(rl)!r}")
            if owners == ("sft",):
                raise ConfigError(f"{what}: agentq train does not resume an SFT run; RL from its checkpoint is "
                                  f"model.path={str(folder / 'checkpoint')!r}")
            raise ConfigError(f"{what}; trainer.resume takes an `agentq train` run folder")
        # a run still before its first checkpoint: its process holds the folder (said rather than "none yet")
        if (pid := lock_holder(folder)) is not None:
            raise in_use(folder, pid, RESUME_WAITS)
        raise ConfigError(f"{where}: no checkpoints/step_* in that run folder (a run saves one every "
                          "trainer.save_every steps and at its end)")


def remove_stale_temp_dirs(folder: Path) -> list[Path]:
    """Remove the `.step_*.tmp*` / `.step_*.old` folders a kill mid-checkpoint leaves behind, after
    renaming back a `.step_N.old` whose `step_N` is missing (the kill fell between the commit's two
    renames: it is the checkpoint). Only safe while the run folder's lock is held (nobody is saving).
    Returns what was removed."""
    restore_interrupted_commits(folder)
    stale = sorted(folder.glob(".step_*.tmp*")) + sorted(folder.glob(".step_*.old")) if folder.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def truncate_lost_episodes(run_dir: str | Path, last_step: int) -> None:
    """Drop errors.jsonl rows after `last_step` (a resumed run redoes those steps)."""
    drop_rows_after(Path(run_dir) / ERRORS_FILE, last_step)


def log_resume(run_dir: str | Path, step: int, cfg: DictConfig) -> list[str]:
    """Append to resumes.jsonl the step a resume starts after and the settings it changed against the
    run's config.yaml (before that file is rewritten with them): which steps ran under which settings
    stays on record. Returns the changes, "key: old → new"."""
    before = read_run_config(Path(run_dir) / "config.yaml")
    diffs = differing_settings(before, cfg, lambda k: k != "trainer.resume") if before is not None else []
    changed = [f"{k}: {old!r} → {new!r}" for k, old, new in diffs]
    append_jsonl(Path(run_dir) / RESUMES_FILE, [{"step": step, "time": time.time(), "changed": changed}])
    return changed


def truncate_evaluations(run_dir: str | Path, last_step: int) -> list[str]:
    """Remove the held-out evaluations eval/step_N of steps after `last_step`: a resumed run redoes
    those steps, whose metrics rows went, and the report listed an evaluation of weights the run
    no longer has beside the redone ones. Returns the folders' names removed."""
    gone = []
    for folder in sorted(Path(run_dir, "eval").glob("step_*")):
        if folder.is_dir() and re.fullmatch(r"step_\d+", folder.name) and int(folder.name[5:]) > last_step:
            shutil.rmtree(folder)
            gone.append(folder.name)
    return gone


def write_lost_episodes(run_dir: str | Path, step: int, trajectories: list[Trajectory]) -> int:
    """Append one errors.jsonl row (step, episode, task, error text) per errored episode.
    Returns how many were written."""
    rows = [{"step": step, "episode_id": t.episode_id, "task_id": t.task_id, "split": t.split,
             "error": t.error or ""} for t in trajectories if t.end_reason == "error"]
    append_jsonl(Path(run_dir) / ERRORS_FILE, rows)
    return len(rows)
