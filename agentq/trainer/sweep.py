"""`agentq sweep`: the quantized-rollout objectives compared side by side, in one command.

    agentq sweep                                  # conf/sweep.yaml: 9 arms × 3 seeds on TWX mapreader
    agentq sweep sweep.arms=[bf16,interq] sweep.seeds=[0] sweep.parallel=2 sweep.out_dir=runs/s

One shared SFT checkpoint (tiny model → expert demonstrations → SFT, as `agentq pipeline`) is
evaluated on the held-out split once per rollout numerics among the arms (each arm's preset sets its
rollout.quant); then every arm (an `algo=<preset>`) × seed runs RL from it with the same budget
(trainer.steps × tasks_per_step × group_size episodes), evaluating the same held-out tasks every
`trainer.eval_every` steps and at the end. The sweep folder gets:

    sft/, eval_sft/                 the shared start and its evaluation under the sweep's base rollout
                                    numerics (conf/sweep.yaml's rollout: w8a8_kv8)
    eval_sft_<quant>/               its evaluation under another arm's numerics (eval_sft_bf16/: rollout
                                    quant none), with that arm's config and the sweep's seed; each
                                    arm's curve starts (step 0) from the one under its own numerics,
                                    which table.json names per arm ("sft_eval"); a folder from before
                                    these has eval_sft/ only: the table falls back to it, saying so
    arms/<arm>/seed_<s>/            an ordinary RL run folder, plus result.json once it finished
    table.md, table.json            per arm: final success pooled over seeds with a 95 % Wilson
                                    interval, per-seed success, AULC, paired tests over the held-out
                                    tasks (each task's success over all seeds' episodes; exact McNemar
                                    with one seed and one episode each, else the sign-flip test)
                                    against each `sweep.references` arm, K3 (mean, range, per turn),
                                    α range, rollout and learner seconds; the rollout backend (torch
                                    engine or vLLM) of each arm, shown in table.md when arms differ
    curves.png                      held-out success against RL step, one line per arm (seed mean)

Resumable: a finished arm × seed (its result.json exists) is never rerun, and the SFT checkpoint and
its evaluations are reused; an unfinished one is started again from the SFT checkpoint. A resume
whose settings differ from a finished run's (`check_resumed_runs`: the budget, SFT, evaluation, ...)
is refused, naming them: the table would put runs of two settings under one title.
`sweep.parallel=N` runs N arm × seed jobs at once in spawned processes (logs in each run folder);
`sweep.table_only=true` writes the table of the runs finished so far in `sweep.out_dir` and runs
nothing (no SFT, no evaluation, no arm; no lock taken, so it reads a running sweep), of the arms, seeds
and references the finished runs' config.yaml list (`folder_arms`), titled with their own settings,
not the command line's, and never over a table of more runs (`check_not_fewer_runs`); a folder that does
not exist or where nothing has finished yet is one line (`check_table_only`), and no folder is made.
`sweep.aligned_learner` sets what the presets' `learner_quant: aligned` means in this sweep
(`aligned`: exact; `w8a8`: linears only, so the KV8 residual stays; `none`: unaligned).
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from agentq.config import ConfigError, differing_settings, env_label, in_sections, quant_name
from agentq.utils.errors import RunAborted, first_line, says_where_on_stop
from agentq.utils.files import write_text_replacing
from agentq.utils.folder_lock import removed_if_left_empty
from agentq.utils.logging import console, counted, jsonable

from .run_dir import check_kind, claim_run_dir, new_run_dir, read_run_config

RESULT = "result.json"


# ---------------------------------------------------------------------- configs
#: what the sweep sets for each arm × seed run (`arm_overrides`): (what it is, the sweep's list of them)
SET_PER_RUN = {"algo": ("preset", "arms"), "seed": ("seed", "seeds")}
#: what each arm's preset sets (conf/algo/<arm>.yaml: `override /rollout`): a command line's value
#: turned the bf16 baseline into a quantized rollout and left the aligned arms' learner partial
_OWN_NUMERICS = ("each arm's preset sets its own rollout numerics (bf16: none, the others w8a8_kv8) and its "
                 "learner's; drop it, or compare other numerics with a preset of your own in conf/algo/ named in "
                 "sweep.arms")
#: (the `rollout=` group override does what `rollout.quant=` does; the rollout groups differ in it alone)
SET_BY_PRESET = {"rollout.quant": _OWN_NUMERICS, "rollout": _OWN_NUMERICS}
#: the section every preset sets whole (conf/algo/*.yaml: algo.name, learner_quant, objective, its
#: parameters, clip_eps, dual_clip, kl_coef, loss_agg): `algo.objective=tis` ran every arm as TIS under
#: the table's bf16 / qat rows, `algo.learner_quant=aligned` gave the bf16 arm a W8A8 learner
PRESET_SECTION = "algo."
_PRESET_KEY = ("the presets set it, so it would change every arm and the arms would no longer be the presets the "
               "table names; to change an arm, define a preset of your own in conf/algo/ and name it in sweep.arms")


def _override_problem(cfg: DictConfig, override: str) -> str | None:
    """Why a sweep refuses `override` (an algo= / seed= it sets per run, a key the presets set), or None."""
    key, _, value = override.partition("=")
    key = key.lstrip("+~")
    if key in SET_PER_RUN:
        what, name = SET_PER_RUN[key]
        return (f"{override}: a sweep runs each {what} of sweep.{name} (now {list(cfg.sweep[name])}); "
                f"write 'sweep.{name}=[{value}]'")
    if key in SET_BY_PRESET:
        return f"{override}: {SET_BY_PRESET[key]}"
    if key.startswith(PRESET_SECTION):
        return f"{override}: {_PRESET_KEY}"
    return None


def _repeated(cfg: DictConfig) -> list[str]:
    """A line for each of sweep.arms / sweep.seeds that lists an entry more than once, naming it."""
    said = []
    for name, what in (("arms", "arm"), ("seeds", "seed")):
        items = list(cfg.sweep[name])
        twice = list(dict.fromkeys(x for i, x in enumerate(items) if x in items[:i]))
        if twice:
            said.append(f"sweep.{name}={items} repeats {what} {', '.join(map(str, twice))}: each arm × seed runs "
                        f"once into arms/<arm>/seed_<seed>, a repeat would run it again there and count its episodes "
                        f"twice in the table; list each {what} once")
    return said


def check_sweep_settings(cfg: DictConfig, overrides: list[str]) -> None:
    """Refuse a sweep without arms or seeds, or with an arm or seed listed twice (run again into the
    same folder, its episodes counted twice), one whose arms would skip their final held-out evaluation
    (trainer.eval_every=-1: the table reads it, and failed after every arm had run), an `algo=` or
    `seed=` override (every arm × seed run sets its own, so the command line's was dropped without a
    word), a `rollout.quant=` one (`SET_BY_PRESET`: it changed every arm, the bf16 baseline too) and one
    of any `algo.` key (`PRESET_SECTION`: the presets set them; every arm ran the command line's).

    Raises:
        ConfigError: an empty or repeating sweep.arms / sweep.seeds, trainer.eval_every < 0 (unless
        sweep.table_only, which runs nothing), or naming each such override and why, in one line.
    """
    if not cfg.sweep.arms or not cfg.sweep.seeds:
        raise ConfigError(f"sweep.arms={list(cfg.sweep.arms)} and sweep.seeds={list(cfg.sweep.seeds)} must both be "
                          "non-empty")
    repeated = _repeated(cfg)
    if repeated:
        raise ConfigError("; ".join(repeated))
    if int(cfg.trainer.eval_every) < 0 and not cfg.sweep.table_only:     # RLTrainer.train: no final eval then
        raise ConfigError(f"trainer.eval_every={cfg.trainer.eval_every}: a sweep's table needs each arm's final "
                          "held-out evaluation; set trainer.eval_every=0 (only the final one) or N > 0 (also every "
                          "N steps)")
    bad = [why for why in (_override_problem(cfg, o) for o in overrides) if why]
    if bad:
        raise ConfigError("; ".join(bad))


def arm_overrides(overrides: list[str], arm: str, seed: int, run_dir: Path, threads: int | None) -> list[str]:
    """The sweep's own overrides with the arm's preset, seed and run folder, which replace any
    `algo=`, `seed=` or `trainer.out_dir=` among them (`check_sweep_settings` refuses the first two
    on the command line)."""
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("algo", "seed", "trainer.out_dir")]
    extra = [f"learner_threads={threads}"] if threads else []
    return [*keep, f"algo={arm}", f"seed={seed}", f"trainer.out_dir={run_dir}", "trainer.resume=null", *extra]


def arm_config(overrides: list[str]) -> DictConfig:
    """Compose one arm's config (conf/sweep.yaml + overrides) and apply the sweep's learner setting."""
    from agentq.config import load_config

    cfg = load_config(overrides, config_name="sweep")
    if cfg.algo.learner_quant == "aligned":
        OmegaConf.update(cfg, "algo.learner_quant", str(cfg.sweep.aligned_learner))
    # every interval evaluation plays the same held-out tasks as the final one (and as the SFT eval);
    # trainer.final_eval_tasks stays null (`agentq sweep` refuses it): the final one plays these too
    OmegaConf.update(cfg, "trainer.eval_num_tasks", int(cfg.sweep.eval_tasks))
    return cfg


def sweep_dir(cfg: DictConfig) -> Path:
    return Path(cfg.sweep.out_dir or new_run_dir(f"sweep-{cfg.env.name}"))


# ---------------------------------------------------------------------- one arm × seed
def run_arm(job: dict) -> dict:
    """RL from the shared SFT checkpoint for one arm × seed; writes and returns result.json.
    Runs in the sweep's process (parallel = 1) or in a spawned one (its output then goes to log.txt)."""
    run_dir = Path(job["run_dir"])
    if run_dir.exists():                          # an unfinished earlier attempt: start it over
        shutil.rmtree(run_dir)
    # a run refused at its start (in the sweep's process: no log.txt) leaves no arm folder holding a lock alone
    with removed_if_left_empty(run_dir):
        run_dir.mkdir(parents=True)
        if job["redirect"]:
            log = os.open(run_dir / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
        from agentq.trainer.rl import RLTrainer

        cfg = arm_config(job["overrides"])
        try:        # a sweep refuses trainer.out_dir: the run folder's messages name sweep.out_dir
            RLTrainer(cfg, init_path=job["sft_checkpoint"], out_key="sweep.out_dir").train()
        except Exception:
            if job["redirect"]:       # the sweep's stop says the error's first line and names log.txt
                import traceback

                traceback.print_exc()
            raise
    result = {"arm": job["arm"], "seed": job["seed"], "algo": cfg.algo.name, "objective": cfg.algo.objective,
              "rollout_quant": cfg.rollout.quant, "rollout_backend": cfg.rollout.backend,
              "learner_quant": cfg.algo.learner_quant,
              "steps": int(cfg.trainer.steps), "overrides": job["overrides"]}
    tmp = run_dir / (RESULT + ".tmp")
    tmp.write_text(json.dumps(jsonable(result), indent=2))
    tmp.replace(run_dir / RESULT)                 # atomic: a result.json is always complete
    return result


def _run_jobs(jobs: list[dict], parallel: int, run: Callable[[dict], Any] | None = None) -> None:
    """Run the arm × seed `jobs` (`run`: `run_arm`), `parallel` at a time in spawned processes (one: in
    this process, one after another). Either way an arm's error (or its worker process's death) stops
    the sweep once the arms already running have finished (their results are kept; no other arm
    starts), as a `RunAborted` naming each failed arm × seed, so the sweep's stop says what finished
    and the command that resumes it. A job is handed to the executor only when a worker is free: the
    executor pre-loads queued calls into its workers, where cancelling cannot reach them.

    Raises:
        RunAborted: an arm failed, naming it (and each other failed one) with its error's first line.
    """
    run = run or run_arm
    if parallel <= 1:
        failed = list[tuple[dict, BaseException]]()
        for job in jobs:
            console.rule(f"[bold]sweep: {job['arm']} seed {job['seed']}")
            try:
                run(job)
            except Exception as e:          # stopped as the parallel path stops: the arm named, no other starts
                failed.append((job, e))
                break
    else:
        failed = _run_parallel(jobs, parallel, run)
    if failed:
        raise RunAborted(_failed_text(sorted(failed, key=lambda f: jobs.index(f[0])))) from failed[0][1]


def _run_parallel(jobs: list[dict], parallel: int, run: Callable[[dict], Any]) -> list[tuple[dict, BaseException]]:
    """`_run_jobs` with `parallel` > 1 workers: spawned processes, each job's output in its log.txt.

    Returns:
        (job, its error) of each failed job (none: all finished).
    """
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    queue, failed = list(jobs), list[tuple[dict, BaseException]]()
    with ProcessPoolExecutor(max_workers=parallel, mp_context=multiprocessing.get_context("spawn")) as ex:
        running: dict[Future, dict] = {}
        while queue or running:
            while queue and len(running) < parallel and not failed:
                job = queue.pop(0)
                try:
                    running[ex.submit(run, {**job, "redirect": True})] = job
                except BrokenProcessPool as e:      # a worker died: its jobs' futures say whose
                    queue.clear()
                    if not running:
                        failed.append((job, e))
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                job = running.pop(f)
                error = f.exception()
                if error is not None:
                    queue.clear()                 # the arms still running finish; no other starts
                    failed.append((job, error))
                else:
                    console.print(f"sweep: {job['arm']} seed {job['seed']} done ({job['run_dir']})")
    return failed


def _failed_text(failed: list[tuple[dict, BaseException]]) -> str:
    """'sweep arm A seed S failed: <its error's first line>' for each failed job (with its run folder's
    log.txt where that holds its output); the jobs whose worker process died (BrokenProcessPool: the
    pool cannot say whose, and it ends every job running in it) in one clause."""
    from concurrent.futures.process import BrokenProcessPool

    said, dead = [], []
    for job, e in failed:
        name = f"{job['arm']} seed {job['seed']}"
        if isinstance(e, BrokenProcessPool):
            dead.append(name)
            continue
        log = Path(str(job["run_dir"])) / "log.txt"
        said.append(f"sweep arm {name} failed: {type(e).__name__}: {first_line(e, 300)}"
                    + (f" (its output: {log})" if log.is_file() else ""))
    if dead:
        said.append(f"sweep arm{'s' if len(dead) > 1 else ''} {', '.join(dead)} stopped: a worker process died "
                    "(BrokenProcessPool: killed, e.g. for memory), which ends every arm running in the pool")
    return "; ".join(said)


# ---------------------------------------------------------------------- the sweep
def sweep(cfg: DictConfig, overrides: list[str]) -> dict:
    """Shared SFT → arms × seeds RL → table.md / table.json / curves.png in the sweep folder."""
    from agentq import build
    from agentq.trainer.pipeline import eval_splits

    check_sweep_settings(cfg, overrides)
    sw = cfg.sweep
    arms, seeds, references = list(sw.arms), [int(s) for s in sw.seeds], list(sw.references)
    if sw.table_only:                       # reads what is there: nothing found is one line, no folder made
        arms, seeds, references = folder_arms(sw.out_dir, overrides, arms, seeds, references)
    refs = _references(arms, references)
    if sw.table_only:
        check_table_only(cfg.sweep.out_dir, arms, seeds)
    out = sweep_dir(cfg)
    overrides = [o for o in overrides if not o.startswith("sweep.out_dir=")] + [f"sweep.out_dir={out}"]
    again = shlex.join(["agentq", "sweep", *overrides])     # the command that resumes it, said when it stops
    split = eval_splits(cfg)[0]
    if not sw.table_only:           # missing data (ALFWorld's real games) before the SFT stage, not after it
        build.check_split_data(cfg, [str(cfg.env.train_split), split])
    overrides.append(f"env.eval_split={split}")
    threads = max(1, (os.cpu_count() or 1) // int(sw.parallel)) if int(sw.parallel) > 1 else None
    # every arm × seed composed now: a misspelt preset fails before the SFT stage, not after it and
    # every earlier arm; a finished run whose settings differ from this command line is named
    if not sw.table_only:   # table_only titles the runs' own settings: this command line's are not compared
        check_resumed_runs(out, arms, seeds, overrides, threads)
    check_final_evals(out, arms, seeds)     # a finished run is never rerun: the table would fail after the rest
    console.rule(f"[bold]agentq sweep: {escape(env_label(cfg.env))}/{split} — {len(arms)} arms × {len(seeds)} seeds "
                 f"→ {out}")

    if sw.table_only:       # the table of what finished so far, asked for while the sweep runs: no lock
        return _write_sweep_table(cfg, out, arms, seeds, refs, split)
    # a stop (Ctrl-C, an arm's worker given up on) says what finished and the command that resumes the rest
    with says_where_on_stop(lambda: sweep_stopped_text(out, arms, seeds, again)):
        with removed_if_left_empty(out):        # a refused start (model.path) leaves no empty sweep folder
            # one sweep at a time in its folder (its arms lock their own), never another command's folder
            lock = claim_run_dir(out, resume=True, overwrite=False, kind="sweep", out_key="sweep.out_dir")
            try:
                _shared_sft(cfg, out)
            except BaseException:
                lock.close()
                raise
        try:
            return _sweep_runs(cfg, out, overrides, arms, seeds, refs, split, threads)
        finally:
            lock.close()            # releases the folder


def _references(arms: list[str], references: list[str]) -> list[str]:
    """The `references` among `arms` (the table's paired columns), with a warning naming the others.

    Returns:
        The references that are arms, in order.
    """
    refs = [r for r in references if r in arms]
    dropped = [r for r in references if r not in arms]
    if dropped:         # the table's paired columns would leave them out unsaid
        said = (f"sweep.references {dropped} are not among sweep.arms, so the table compares with {refs} only" if refs
                else f"none of sweep.references={references} is among sweep.arms={arms}: the table has no "
                     "paired comparison columns (name a reference that is one of the arms)")
        console.print(f"warning: {said}", style="yellow", markup=False, highlight=False, soft_wrap=True)
    return refs


def sweep_stopped_text(out: Path, arms: list[str], seeds: list[int], again: str) -> str:
    """Where a stopped sweep left its folder: how many arm × seed runs finished (their result.json) and
    `again`, the command that resumes it ("" when the folder was removed as left empty)."""
    if not out.is_dir():
        return ""
    done = sum((out / "arms" / arm / f"seed_{seed}" / RESULT).exists() for arm in arms for seed in seeds)
    return (f"sweep folder {out}: {done} of {len(arms) * len(seeds)} arm × seed runs finished; resume it with {again} "
            "(finished runs are kept, an unfinished one starts over)")


def folder_arms(out_dir: str | None, overrides: list[str], arms: list[str], seeds: list[int],
                references: list[str]) -> tuple[list[str], list[int], list[str]]:
    """The arms, seeds and references of the sweep in `out_dir`, for `sweep.table_only=true`: its
    finished runs' own sweep.arms / sweep.seeds / sweep.references (their config.yaml, in order), and
    any other arm × seed finished there; one the command line names (`overrides`) is taken as named.
    Without it, conf/sweep.yaml's defaults counted "1 of 27" runs of a 2 × 1 sweep, added empty
    "vs bf16" columns and wrote that table over the sweep's own.

    Args:
        out_dir: sweep.out_dir (unset or no folder: `arms`, `seeds`, `references` as given).
        overrides: the command line's overrides.
        arms, seeds, references: the config's (conf/sweep.yaml's unless the command line set them).
    Returns:
        (arms, seeds, references).
    """
    if not out_dir or not (Path(out_dir) / "arms").is_dir():
        return arms, seeds, references
    named = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    found: dict[str, list] = {"arms": [], "seeds": [], "references": []}
    finished = sorted(Path(out_dir).glob(f"arms/*/seed_*/{RESULT}"))
    for result in finished:
        ran = read_run_config(result.parent / "config.yaml", needs=())
        for key, items in found.items():
            listed = OmegaConf.select(ran, f"sweep.{key}") if ran is not None else None
            items += [x for x in (listed or []) if x not in items]
    for result in finished:     # a finished run of an arm or seed its runs' configs do not list
        arm, seed = result.parent.parent.name, result.parent.name.removeprefix("seed_")
        if arm not in found["arms"]:
            found["arms"].append(arm)
        if seed.lstrip("-").isdigit() and int(seed) not in found["seeds"]:
            found["seeds"].append(int(seed))
    given: dict[str, list[Any]] = {"arms": arms, "seeds": seeds, "references": references}
    pick = {k: given[k] if f"sweep.{k}" in named or not found[k] else found[k] for k in given}
    return pick["arms"], [int(s) for s in pick["seeds"]], pick["references"]


def check_table_only(out_dir: str | None, arms: list[str], seeds: list[int]) -> None:
    """Refuse `sweep.table_only=true` where there is no table to write: it reads the finished runs of
    the sweep in `out_dir` and runs nothing (an SFT stage or evaluation started there would run without
    the sweep's lock, beside the sweep that holds it, or in a misspelt folder).

    Raises:
        ConfigError: no sweep.out_dir, no such folder, another command's folder, or nothing finished
        yet (the SFT stage, its evaluation, or every listed arm × seed), in one line.
    """
    what = "sweep.table_only=true writes the table of a sweep's finished runs and runs nothing"
    if not out_dir:
        raise ConfigError(f"{what}: name the sweep's folder with sweep.out_dir=<folder>")
    out = Path(out_dir)
    where = f"sweep.table_only=true: sweep.out_dir={str(out)!r}"
    if not out.is_dir():
        raise ConfigError(f"{where} is no folder; it writes the table of a sweep's finished runs and runs nothing")
    check_kind(out, "sweep", "sweep.out_dir")
    if not (out / "sft" / "sft_summary.json").exists():
        raise ConfigError(f"{where} has nothing finished yet: its shared SFT stage has not finished "
                          "(no sft/sft_summary.json)")
    if not (out / "eval_sft" / "eval.json").exists():
        raise ConfigError(f"{where} has nothing finished yet: its SFT checkpoint is not evaluated yet "
                          "(no eval_sft/eval.json)")
    if not any((out / "arms" / arm / f"seed_{seed}" / RESULT).exists() for arm in arms for seed in seeds):
        raise ConfigError(f"{where} has no finished run of sweep.arms={arms} × sweep.seeds={seeds} yet "
                          f"(no arms/<arm>/seed_<seed>/{RESULT})")


def read_result(run_dir: Path) -> dict:
    """A finished arm × seed's result.json (written whole, so damage is from outside the sweep).

    Raises:
        ConfigError: it is not a JSON object with its "steps", in one line saying how to redo that run.
    """
    path = run_dir / RESULT
    try:
        result = json.loads(path.read_text())
        if not isinstance(result, dict) or not isinstance(result.get("steps"), int):
            raise ValueError('not a JSON object with its "steps"')
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is damaged ({e}); delete it and resume the sweep to run that arm × seed "
                          "again") from None
    return result


def final_eval_dir(run_dir: Path) -> Path:
    """A finished arm × seed's final evaluation (relative to the run folder: a sweep folder may be moved
    and resumed): eval/step_<trainer.steps> as its result.json records them."""
    return run_dir / "eval" / f"step_{read_result(run_dir)['steps']:06d}"


def check_final_evals(out: Path, arms: list[str], seeds: list[int]) -> None:
    """Refuse a sweep folder holding a finished arm × seed without its final held-out evaluation (one
    run with trainer.eval_every=-1, or whose eval folder was removed): the table reads it.

    Raises:
        ConfigError: naming the first such run and the file it lacks, in one line.
    """
    for arm in arms:
        for seed in seeds:
            run_dir = out / "arms" / arm / f"seed_{seed}"
            if not (run_dir / RESULT).exists():
                continue
            final = final_eval_dir(run_dir) / "eval.json"      # one read of result.json
            if not final.exists():
                missing = final.relative_to(out)
                raise ConfigError(f"sweep.out_dir={str(out)!r}: arm {arm} seed {seed} finished without its final "
                                  f"held-out evaluation (no {missing}), which the table needs; delete "
                                  f"arms/{arm}/seed_{seed}/{RESULT} and resume the sweep to run it again")


def _write_sweep_table(cfg: DictConfig, out: Path, arms: list[str], seeds: list[int], refs: list[str],
                       split: str) -> dict:
    """3. the comparison table of the arm × seed runs finished in `out`."""
    done = sum((out / "arms" / arm / f"seed_{seed}" / RESULT).exists() for arm in arms for seed in seeds)
    console.print(f"sweep: {done} of {len(arms) * len(seeds)} arm × seed runs finished")
    table = sweep_table(out, arms, seeds, refs)
    if cfg.sweep.table_only:
        check_not_fewer_runs(out, table)
    ran = title_config(out, arms, seeds, cfg)           # the runs' own settings, not this command line's
    finished = [s for s in seeds if any((out / "arms" / a / f"seed_{s}" / RESULT).exists() for a in arms)]
    write_table(out, table, title=sweep_title(ran, str(OmegaConf.select(ran, "env.eval_split") or split),
                                              finished or seeds))
    return table


def _table_runs(table: dict) -> set[tuple[str, int]]:
    """The (arm, seed) runs a table (table.json's object) holds."""
    return {(arm, int(s)) for arm, r in table.get("arms", {}).items() for s in r.get("seeds", [])}


def check_not_fewer_runs(out: Path, table: dict) -> None:
    """Refuse to write `table` (a `sweep.table_only=true` one) over table.json / table.md of `out` that
    hold a run it lacks: an arm or seed left out of sweep.arms / sweep.seeds would replace the sweep's
    own table with a smaller one.

    Raises:
        ConfigError: naming the runs the new table would drop, in one line.
    """
    try:
        before = json.loads((out / "table.json").read_text())
    except (OSError, ValueError):           # none there (or damaged): nothing to lose
        return
    lost = sorted(_table_runs(before) - _table_runs(table)) if isinstance(before, dict) else []
    if lost:
        named = ", ".join(f"{arm} seed {seed}" for arm, seed in lost)
        raise ConfigError(f"sweep.table_only=true: {out}/table.md holds runs this table would leave out ({named}); "
                          "it is left as it is: name them in sweep.arms and sweep.seeds, or drop those overrides to "
                          "tabulate every finished run of the folder")


def _shared_sft(cfg: DictConfig, out: Path) -> None:
    """1. the shared start: SFT into <out>/sft, unless a finished one is there (reused on resume)."""
    from agentq import build
    from agentq.trainer.sft import sft

    if not (out / "sft" / "sft_summary.json").exists():   # none, or one cut short: (re)done, replacing what it left
        # a sweep refuses sft.out_dir: the SFT folder's messages name sweep.out_dir; its arms RL from
        # the checkpoint, so no `agentq train` hint
        sft(cfg, out_dir=out / "sft", init_path=build.model_path(cfg), overwrite=True, out_key="sweep.out_dir",
            rl_hint=False)


def _sweep_runs(cfg: DictConfig, out: Path, overrides: list[str], arms: list[str], seeds: list[int],
                refs: list[str], split: str, threads: int | None) -> dict:
    """1. the SFT checkpoint's evaluations (one per rollout numerics among the arms), 2. the arms ×
    seeds not finished yet, 3. the comparison table."""
    from agentq.trainer.pipeline import evaluate_checkpoint

    sw = cfg.sweep
    sft_ckpt = str(out / "sft" / "checkpoint")
    if not (out / "eval_sft" / "eval.json").exists():                 # 1. under the sweep's base numerics
        evaluate_checkpoint(cfg, sft_ckpt, out / "eval_sft", int(sw.eval_tasks), split)
    _other_sft_evals(cfg, out, overrides, arms, seeds[0], split, threads)

    jobs = []                                                # 2. arms × seeds, finished ones skipped
    for seed in seeds:                                       # seed-major: a cut-short sweep has every arm
        for arm in arms:
            run_dir = out / "arms" / arm / f"seed_{seed}"
            if (run_dir / RESULT).exists():
                continue
            jobs.append({"arm": arm, "seed": seed, "run_dir": str(run_dir), "sft_checkpoint": sft_ckpt,
                         "overrides": arm_overrides(overrides, arm, seed, run_dir, threads), "redirect": False})
    console.print(f"sweep: {len(arms) * len(seeds) - len(jobs)} arm × seed runs already finished, {len(jobs)} to run")
    _run_jobs(jobs, int(sw.parallel))
    return _write_sweep_table(cfg, out, arms, seeds, refs, split)        # 3. the comparison


#: the SFT checkpoint's evaluation under the sweep's base rollout numerics (conf/sweep.yaml's rollout)
BASE_SFT_EVAL = "eval_sft"


def sft_eval_name(quant: str, base: str | None) -> str:
    """The folder of the SFT checkpoint's evaluation under rollout.quant `quant`: eval_sft/ where that
    is the base numerics `base` (the sweep config's rollout.quant, which eval_sft/eval.json records;
    None: not recorded), else eval_sft_<quant as `quant_name` says it>/ (rollout quant none: eval_sft_bf16/)."""
    return BASE_SFT_EVAL if base is None or str(base) == str(quant) else f"{BASE_SFT_EVAL}_{quant_name(str(quant))}"


def _other_sft_evals(cfg: DictConfig, out: Path, overrides: list[str], arms: list[str], seed: int, split: str,
                     threads: int | None) -> None:
    """The SFT checkpoint evaluated under each arm's rollout numerics other than the base's (eval_sft/,
    `sft_eval_name`), once per distinct numerics, with the arm's composed config (its preset's rollout
    settings) and the sweep's seed and held-out tasks: each arm's curve starts from an evaluation under
    its own numerics. One already there (a resumed sweep) is kept."""
    from agentq.trainer.pipeline import evaluate_checkpoint

    for arm in arms:
        acfg = arm_config(arm_overrides(overrides, arm, seed, out / "arms" / arm / f"seed_{seed}", threads))
        folder = out / sft_eval_name(str(acfg.rollout.quant), str(cfg.rollout.quant))
        if folder.name == BASE_SFT_EVAL or (folder / "eval.json").exists():
            continue
        OmegaConf.update(acfg, "seed", cfg.seed)           # as eval_sft/'s: only the rollout numerics differ
        console.print(f"sweep: the SFT checkpoint under arm {arm}'s rollout numerics "
                      f"({quant_name(str(acfg.rollout.quant))}) → {folder.name}/")
        evaluate_checkpoint(acfg, str(out / "sft" / "checkpoint"), folder, int(cfg.sweep.eval_tasks), split)


#: what `sweep_title` reads of a config
TITLE_KEYS = ("env", "trainer.steps", "trainer.tasks_per_step", "trainer.group_size", "sweep.aligned_learner")


def title_config(out: Path, arms: list[str], seeds: list[int], cfg: DictConfig) -> DictConfig:
    """The config the title states: the first finished arm × seed's own config.yaml (so a table_only
    command without the sweep's overrides titles the runs as they ran), else `cfg`."""
    for seed in seeds:
        for arm in arms:
            run_dir = out / "arms" / arm / f"seed_{seed}"
            ran = read_run_config(run_dir / "config.yaml", needs=()) if (run_dir / RESULT).exists() else None
            if ran is not None and all(OmegaConf.select(ran, k) is not None for k in TITLE_KEYS):
                return ran
    return cfg


def sweep_title(cfg: DictConfig, split: str, seeds: list[int]) -> str:
    """table.md's and curves.png's title: the env with the tasks its config chooses (`env_label`: both
    TextWorldExpress configs are `textworld_express`), the split, seeds and budget."""
    episodes = int(cfg.trainer.tasks_per_step) * int(cfg.trainer.group_size)
    return (f"{env_label(cfg.env)}/{split}, seeds {seeds}, {counted(int(cfg.trainer.steps), 'RL step')} × "
            f"{counted(episodes, 'episode')}, learner of aligned arms: {cfg.sweep.aligned_learner}")


#: settings a resumed sweep may change without changing what its runs compute (where the workers run,
#: where the metrics go, which arms and seeds this command lists, thread counts and folders)
RESUME_FREE = ("trainer.out_dir", "trainer.resume", "trainer.overwrite", "learner_threads", "logger", "wandb.",
               "ray.", "env_pool.", "sweep.arms", "sweep.seeds", "sweep.references", "sweep.parallel",
               "sweep.table_only", "sweep.out_dir")


def changed_settings(run_dir: Path, cfg: DictConfig) -> list[str]:
    """'key: ran with A, now B' for each setting a finished run's config.yaml holds otherwise than
    `cfg` (its arm × seed composed from this command line), `RESUME_FREE` keys aside. A key only one
    of the two has is compared with its default under env.kwargs / algo.objective_params (a newer
    config that spells out a default is the same run), and not compared elsewhere (`differing_settings`)."""
    from agentq import build

    ran = read_run_config(run_dir / "config.yaml")       # a damaged one is one line
    if ran is None:
        return []
    diffs = differing_settings(ran, cfg, lambda k: not in_sections(k, RESUME_FREE),
                               default=lambda k: build.setting_default(cfg, k))
    return [f"{k}: ran with {then!r}, now {now!r}" for k, then, now in diffs]


def check_resumed_runs(out: Path, arms: list[str], seeds: list[int], overrides: list[str], threads: int | None,
                       warn_only: bool = False) -> None:
    """Compose every arm × seed's config (a bad preset or key is a ConfigError now), judge each arm's
    RL settings as its run would (`check_rl_config`: an objective parameter out of range, an unknown
    objective, failed after the SFT stage and every earlier arm), and compare each finished run with
    the settings it ran with: a resumed sweep whose command line changed its budget, SFT or evaluation
    would put runs of two settings in one table under one title.

    Raises:
        ConfigError: an arm's RL settings are refused (named with the arm), or a run differs (with
            `warn_only`, for `sweep.table_only`, a warning instead).
    """
    from agentq.trainer.rl import check_rl_config

    changed = []
    for seed in seeds:
        for arm in arms:
            run_dir = out / "arms" / arm / f"seed_{seed}"
            cfg = arm_config(arm_overrides(overrides, arm, seed, run_dir, threads))
            if seed == seeds[0] and not warn_only:
                try:
                    check_rl_config(cfg)
                except ConfigError as e:
                    raise ConfigError(f"sweep arm {arm}: {e}") from None
            if (run_dir / RESULT).exists() and (run_dir / "config.yaml").exists():
                changed += [f"{arm}/seed_{seed}: {c}" for c in changed_settings(run_dir, cfg)]
    if not changed:
        return
    msg = (f"sweep.out_dir={str(out)!r} holds finished runs whose settings differ from this command line's "
           f"({'; '.join(changed[:6])}{'; …' if len(changed) > 6 else ''}); their table would mix the two. Resume "
           "with the sweep's own overrides, or start another sweep.out_dir")
    if not warn_only:
        raise ConfigError(msg)
    console.print(f"sweep.table_only: {msg}; the title below states the finished runs' own settings",
                  style="yellow", markup=False)


# ---------------------------------------------------------------------- the table
def rollout_backend(run_dir: Path, result: dict) -> str | None:
    """The rollout backend (torch / vllm) an arm × seed ran with: its result.json's, or for a run
    finished before result.json recorded it, its config.yaml's; None where neither says."""
    if result.get("rollout_backend"):
        return str(result["rollout_backend"])
    cfg = read_run_config(run_dir / "config.yaml", needs=())
    backend = OmegaConf.select(cfg, "rollout.backend") if cfg is not None else None
    return None if backend is None else str(backend)


def _curve(run_dir: Path, sft_success: float) -> tuple[list[int], list[float]]:
    from agentq.utils.logging import read_metrics

    ev = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/success_rate" in r]
    return [0] + [int(r["step"]) for r in ev], [sft_success] + [float(r["eval/success_rate"]) for r in ev]


def step0_eval(out: Path, quant: str | None) -> dict:
    """Step 0 of an arm's curve: the SFT checkpoint's evaluation under the arm's rollout.quant `quant`
    (`sft_eval_name`) as {"folder": its folder's name, "rollout_quant", "success_rate", "episodes", "own_numerics"}.
    A sweep folder from before there was one per numerics (no such folder) falls back to eval_sft/,
    `own_numerics` false; so does an arm whose result.json records no rollout_quant, or an evaluation
    that records none (then which numerics it ran under is not known)."""
    from agentq.eval.episodes import read_eval

    base = read_eval(out / BASE_SFT_EVAL).get("rollout_quant")
    name = BASE_SFT_EVAL if quant is None else sft_eval_name(str(quant), base)
    if not (out / name / "eval.json").exists():
        name = BASE_SFT_EVAL
    ev = read_eval(out / name)
    ran = ev.get("rollout_quant")
    own = quant is not None and ran is not None and str(ran) == str(quant)    # an unrecorded one: not known to be
    return {"folder": name, "rollout_quant": ran, "success_rate": ev["success_rate"], "episodes": ev["episodes"],
            "own_numerics": own}


def _finite(xs: Iterable[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]


def train_stats(rows: list[dict]) -> dict:
    """Mismatch, retention and time over one run's training steps (metrics.jsonl rows)."""
    steps = [r for r in rows if "reward_mean" in r]
    k3 = _finite(r.get("k3") for r in steps)
    n_turns = max((len(r.get("k3_by_turn") or []) for r in steps), default=0)
    by_turn = [_finite((r.get("k3_by_turn") or [None] * n_turns)[j] if j < len(r.get("k3_by_turn") or []) else None
                       for r in steps) for j in range(n_turns)]
    a_min, a_max = _finite(r.get("alpha_min") for r in steps), _finite(r.get("alpha_max") for r in steps)
    return {"k3_mean": sum(k3) / len(k3) if k3 else None, "k3_min": min(k3, default=None),
            "k3_max": max(k3, default=None),
            "k3_by_turn": [sum(v) / len(v) if v else None for v in by_turn],
            "alpha_min": min(a_min, default=None), "alpha_max": max(a_max, default=None),
            "rollout_time_s": sum(float(r.get("rollout_time_s", 0.0)) for r in steps),
            "learner_time_s": sum(float(r.get("train_time_s", 0.0)) for r in steps)}


def _pool(stats: list[dict]) -> dict:
    """Per-seed train_stats → one arm's: means of means and times, extremes of ranges."""
    def mean(key):
        v = _finite(s[key] for s in stats)
        return sum(v) / len(v) if v else None
    n_turns = max(len(s["k3_by_turn"]) for s in stats)
    turns = [_finite(s["k3_by_turn"][j] for s in stats if j < len(s["k3_by_turn"])) for j in range(n_turns)]
    return {"k3_mean": mean("k3_mean"), "k3_min": min(_finite(s["k3_min"] for s in stats), default=None),
            "k3_max": max(_finite(s["k3_max"] for s in stats), default=None),
            "k3_by_turn": [sum(v) / len(v) if v else None for v in turns],
            "alpha_min": min(_finite(s["alpha_min"] for s in stats), default=None),
            "alpha_max": max(_finite(s["alpha_max"] for s in stats), default=None),
            "rollout_time_s": mean("rollout_time_s"), "learner_time_s": mean("learner_time_s")}


def sweep_table(out: Path, arms: list[str], seeds: list[int], refs: list[str]) -> dict:
    """Everything table.md shows, from the run folders (arms with no finished seed are left out)."""
    from agentq.eval.episodes import read_eval, read_trajectories
    from agentq.eval.metrics import aulc, outcomes_by_task, paired_comparison, success_interval
    from agentq.utils.logging import read_metrics

    sft = read_eval(out / BASE_SFT_EVAL)
    rows, won = {}, {}
    for arm in arms:
        runs = [(s, out / "arms" / arm / f"seed_{s}") for s in seeds]
        done = [(s, d) for s, d in runs if (d / RESULT).exists()]
        if not done:
            continue
        results = [(s, final_eval_dir(d)) for s, d in done]        # `check_final_evals` found them all
        finals = [read_eval(e) for _, e in results]          # checked against the episodes read below
        k = sum(round(f["success_rate"] * f["episodes"]) for f in finals)
        n = sum(int(f["episodes"]) for f in finals)
        # every seed plays the same held-out tasks: their episodes of one task are not independent
        episodes = [(t.task_id, t.won) for _, e in results for t in read_trajectories(e / "episodes.jsonl")]
        won[arm] = outcomes_by_task(episodes)      # for the paired tests: a task's episodes over all seeds
        first = read_result(done[0][1])
        step0 = step0_eval(out, first.get("rollout_quant"))      # the SFT evaluation under the arm's numerics
        curves = {s: _curve(d, float(step0["success_rate"])) for s, d in done}
        rows[arm] = {
            "seeds": [s for s, _ in done], "rollout_quant": first["rollout_quant"], "sft_eval": step0,
            "rollout_backend": rollout_backend(done[0][1], first),
            "learner_quant": first["learner_quant"], "objective": first["objective"],
            "success_rate": k / n if n else None, "success_ci95": list(success_interval(episodes)), "episodes": n,
            "success_by_seed": [f["success_rate"] for f in finals],
            "aulc_by_seed": [aulc(*curves[s]) for s, _ in done],
            "curves": {str(s): {"steps": c[0], "success": c[1]} for s, c in curves.items()},
            **_pool([train_stats(read_metrics(d / "metrics.jsonl")) for _, d in done]),
        }
        rows[arm]["aulc"] = sum(rows[arm]["aulc_by_seed"]) / len(done)
    # paired by task: every seed plays the same held-out tasks, and a task's episodes (seeds, repeats)
    # are one unit of the test, not independent pairs (metrics.paired_comparison)
    for arm, r in rows.items():
        r["paired"] = {ref: paired_comparison(won[ref], won[arm]) for ref in refs if ref in won and ref != arm}
    return {"sft_success_rate": sft["success_rate"], "sft_episodes": sft["episodes"], "sft_eval": BASE_SFT_EVAL,
            "sft_rollout_quant": sft.get("rollout_quant"), "arms": rows,
            "references": refs, "seeds": seeds}


def _fmt(x: float | None, spec: str = ".1e") -> str:
    return "–" if x is None else format(x, spec)


#: turns of the K3-by-turn column in table.md (table.json has every turn)
TABLE_TURNS = 8


def _by_turn(k3_by_turn: list[float | None]) -> str:
    """The first TABLE_TURNS turns' K3; more turns end in "… (N turns)", which the cell would hide."""
    cell = ", ".join(_fmt(v, ".0e") for v in k3_by_turn[:TABLE_TURNS])
    return cell + (f", … ({len(k3_by_turn)} turns)" if len(k3_by_turn) > TABLE_TURNS else "")


def _paired_cell(pr: dict) -> str:
    """'b / c, p' of one arm against one reference; without a shared task there is no test (not p = 1)."""
    if not pr["pairs"]:
        return "no shared tasks"
    return f"{pr['won_only_after']} / {pr['won_only_before']}, {pr['mcnemar_p']:.2g}"


def _step0_text(t: dict) -> str:
    """table.md's words on step 0 of the curves: the SFT checkpoint's evaluation under the base numerics
    (eval_sft/), each other one with the arms that start from it, and the arms that fall back to
    eval_sft/ (a sweep folder from before there was one evaluation per numerics)."""
    base = t.get("sft_rollout_quant")
    said = [f"After SFT: {100 * t['sft_success_rate']:.1f} % of {t['sft_episodes']} held-out episodes"
            + (f" ({quant_name(str(base))} rollouts, {BASE_SFT_EVAL}/)." if base is not None else ".")]
    others: dict[str, tuple[dict, list[str]]] = {}
    for arm, r in t["arms"].items():
        ev = r.get("sft_eval")
        if ev and ev["folder"] != BASE_SFT_EVAL:
            others.setdefault(ev["folder"], (ev, []))[1].append(arm)
    for folder, (ev, starting) in others.items():
        said.append(f"Under {quant_name(str(ev['rollout_quant']))} rollouts ({folder}/, step 0 of "
                    f"{', '.join(starting)}): {100 * ev['success_rate']:.1f} % of {ev['episodes']}.")
    fell = [arm for arm, r in t["arms"].items() if r.get("sft_eval") and not r["sft_eval"]["own_numerics"]]
    if fell:
        whose = "its" if len(fell) == 1 else "their"
        said.append(f"Step 0 of {', '.join(fell)} is {BASE_SFT_EVAL}/'s, not under {whose} "
                    "own rollout numerics: this sweep folder has no SFT evaluation under them (made before there "
                    "was one per numerics; resuming the sweep adds it).")
    return " ".join(said)


def table_markdown(t: dict, title: str) -> str:
    from agentq.eval.metrics import NO_PAIRS, paired_test_name

    refs = t["references"]
    # the backend only where arms differ in it: otherwise it is the title's setting, not a column's
    backends = len({r["rollout_backend"] for r in t["arms"].values()}) > 1
    tests = sorted({paired_test_name(pr) for r in t["arms"].values() for pr in r["paired"].values()} - {NO_PAIRS})
    head = ["arm", "rollout (backend) / learner" if backends else "rollout / learner", "success (95 % CI)",
            "per finished seed", "AULC",
            *[f"vs {r}: b / c, p" for r in refs], "K3 mean [min, max]", "K3 by turn 1, 2, 3, …", "α range",
            "rollout s", "learner s"]
    # the paired columns' key only where there are such columns (no reference among the arms: none)
    pairs = ("b / c = held-out tasks whose success (over all the seeds' episodes) is higher for the arm / for the "
             f"reference; p = two-sided, paired by task{': ' + ', '.join(tests) if tests else ''}. ") if refs else ""
    lines = [f"**{title}.** {_step0_text(t)} {pairs}Times are totals per seed (mean over seeds).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, r in t["arms"].items():
        lo, hi = r["success_ci95"]
        paired = [_paired_cell(r["paired"][ref]) if ref in r["paired"] else "–" for ref in refs]
        alpha = "–" if r["alpha_min"] is None else f"{r['alpha_min']:.6f}–{r['alpha_max']:.6f}"
        rollout = quant_name(r["rollout_quant"]) + (f" ({r['rollout_backend'] or '?'})" if backends else "")
        lines.append("| " + " | ".join([
            arm, f"{rollout} / {r['learner_quant']}",
            f"{100 * r['success_rate']:.1f} % ({100 * lo:.1f}–{100 * hi:.1f}), n = {r['episodes']}",
            ", ".join(f"s{s}: {100 * x:.0f}" for s, x in zip(r["seeds"], r["success_by_seed"])),
            f"{100 * r['aulc']:.1f}", *paired,
            f"{_fmt(r['k3_mean'])} [{_fmt(r['k3_min'])}, {_fmt(r['k3_max'])}]",
            _by_turn(r["k3_by_turn"]), alpha,
            _fmt(r["rollout_time_s"], ".0f"), _fmt(r["learner_time_s"], ".0f")]) + " |")
    return "\n".join(lines) + "\n"


def write_table(out: Path, table: dict, title: str) -> None:
    from agentq.eval.plots import sweep_curves

    # replaced whole: `sweep.table_only=true` may write them while the sweep does
    write_text_replacing(out / "table.json", json.dumps(jsonable(table), indent=2))
    md = table_markdown(table, title)
    write_text_replacing(out / "table.md", md)
    sweep_curves({arm: r["curves"] for arm, r in table["arms"].items()}, out / "curves.png", title=title)
    console.print(md, markup=False, highlight=False, soft_wrap=True)     # "[min, max]" is not rich markup
    console.print(f"sweep outputs in {out}/ (table.md, table.json, curves.png)")
