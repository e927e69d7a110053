"""`agentq` command line: Hydra-style `key=value` overrides on conf/config.yaml.

    agentq train env=textworld_express trainer.steps=2 trainer.out_dir=runs/x
    agentq eval checkpoint=runs/x/checkpoints/step_000002 env=textworld_express split=test
    agentq sft env=alfworld sft.num_demos=200
    agentq pipeline                              # the embedded default: tiny model → SFT → RL → eval
    agentq sweep sweep.parallel=2                # every objective × 3 seeds from one SFT checkpoint
    agentq config env=webshop algo=qat          # print the composed config
    agentq config pipeline                       # ...that `agentq pipeline` starts from (or sweep)
    agentq report runs/x                         # runs/x/report.html: curves, evals, by-turn, episode viewer
    agentq --version                             # agentq <version>
"""
from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

COMMANDS = ("pipeline", "train", "eval", "sft", "config", "report", "sweep")
#: what `agentq <command> --help` says (before, every command printed the same text)
HELP = {
    "pipeline": "the embedded default run: tiny model → SFT → held-out eval → RL → held-out eval; outputs in "
                "pipeline.out_dir (default runs/pipeline-<env>-<time>/). Starts from conf/pipeline.yaml "
                "(its sizes: sft.num_demos, trainer.steps, pipeline.eval_tasks, pipeline.eval_splits).",
    "train": "RL from model.path (model=hf) or the tiny model: trainer.steps, trainer.out_dir (default "
             "runs/<env>-<algo>-<time>/), trainer.resume=<run folder>, env=<config>, algo=<preset>.",
    "eval": "a held-out evaluation: checkpoint=<folder> (or model.path), split=<split> (default "
            "env.eval_split), eval.num_tasks=N, eval.temperature; writes eval.json and episodes.jsonl to "
            "eval.out_dir (default <checkpoint>/eval-<env>-<split>/, its name ending with every setting that "
            "changes the episodes where it differs from the default: -bf16, -T1, -x2, -seed1, -steps2, -n100, "
            "-cfg<hash> for prompt / env.kwargs / agent overrides, ...).",
    "sft": "supervised fine-tuning on the env expert's demonstrations: sft.num_demos, sft.epochs, sft.out_dir.",
    "config": "print the composed config (every key) with these overrides applied: conf/config.yaml's, which train, "
              "eval and sft read, or with `pipeline` / `sweep` first (`agentq config pipeline ...`) the root that "
              "command starts from; with trainer.resume=<run>, the config that `agentq train` would resume with "
              "(the run's config.yaml, these overrides on top).",
    "sweep": "every objective × seed from one SFT checkpoint: sweep.arms, sweep.seeds, sweep.parallel, "
             "sweep.out_dir. Starts from conf/sweep.yaml.",
}
CONFIG_OF = {"pipeline": "pipeline", "sweep": "sweep"}      # commands with their own root config


#: what `run` returns after Ctrl-C (128 + SIGINT, as a shell reports a process SIGINT ended)
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    try:
        rc = run(argv)
    except BrokenPipeError:     # `agentq config | head`: the reader left early; no traceback for that
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())     # Python's flush at exit fails too
        return 1
    if rc == INTERRUPTED and argv is None:
        # end by the signal that stopped it, as an uncaught Ctrl-C (or SIGTERM) does: a shell loop of commands
        # (`for s in 1 2 3; do agentq train seed=$s; done`) then stops too, where an exit status of 130 would
        # let it go on, and a job scheduler sees the SIGTERM it sent
        import atexit
        import os
        import signal

        # the run's own clean-up ran before (workers, Ray, the folder's lock); what waits for the
        # interpreter's exit runs now, as at any exit: a process the signal ends skips it (the vLLM
        # backend's exported checkpoint stayed in $TMPDIR, a model's size per Ctrl-C)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        stopped_by = _stopped_by.pop() if _stopped_by else signal.SIGINT
        signal.signal(stopped_by, signal.SIG_DFL)
        os.kill(os.getpid(), stopped_by)
    return rc


def run(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        print(f"\ncommands: {', '.join(COMMANDS)}")
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"agentq {version()}")
        return 0
    cmd, overrides = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"agentq: unknown command {cmd!r}; valid: {list(COMMANDS)}", file=sys.stderr)
        return 2
    if cmd == "report":
        return report(overrides)
    if any(a in ("-h", "--help") for a in overrides):
        print(f"agentq {cmd} [section.key=value ...]: {HELP[cmd]}")
        print("\nOverrides are Hydra's: section.key=value, group=option (env=, algo=, rollout=, model=, "
              "env_pool=, placement=); `agentq config` prints every key.\n")
        print(__doc__.strip())
        return 0
    from agentq.config import ConfigError, load_config
    from agentq.trainer.run_dir import RunAborted
    from agentq.utils.checkpoint import CheckpointError
    from agentq.utils.errors import RunFileError

    if cmd != "config":
        prepare_process()
    root = CONFIG_OF.get(cmd, "config")
    if cmd == "config" and overrides and overrides[0] in CONFIG_OF:     # `agentq config pipeline ...`
        root, overrides = CONFIG_OF[overrides[0]], overrides[1:]
    try:
        # command=: each command refuses a key only another reads (`agentq train checkpoint=...`)
        with sigterm_as_ctrl_c(cmd in SIGTERM_AS_CTRL_C):
            dispatch(cmd, load_config(overrides, config_name=root, command=cmd), overrides)
    except (ConfigError, CheckpointError, RunFileError) as e:     # bad input: a key, a run folder, a damaged file
        print(f"agentq: {e}", file=sys.stderr)
        return 2
    except RunAborted as e:
        print(f"agentq: run stopped: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:      # Ctrl-C: one line (with where a run stands, when it says), no traceback
        print(f"agentq: interrupted{f': {e}' if str(e) else ''}", file=sys.stderr)
        return INTERRUPTED
    except OSError as e:
        return disk_error(e)
    return 0


#: the commands a SIGTERM (`kill <pid>`, a job scheduler's stop or time limit) stops as Ctrl-C does: the run
#: closes its workers and folder and says where it stands and how to go on, where it was a bare "Terminated"
SIGTERM_AS_CTRL_C = ("train", "pipeline", "eval")
#: the SIGTERM that `sigterm_as_ctrl_c` turned into KeyboardInterrupt, if one did: `main` ends by it
_stopped_by: list[int] = []


@contextlib.contextmanager
def sigterm_as_ctrl_c(enabled: bool = True) -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt in the main thread (as Ctrl-C's SIGINT does);
    the previous handler is back afterwards. Nothing changes off the main thread (Python runs signal
    handlers there only, and `signal.signal` refuses elsewhere) or with `enabled` False."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stopped_by.clear()     # a SIGTERM an earlier block of this process took is not this block's stop
    if not enabled:
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        _stopped_by[:] = [signum]
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:    # None: a handler not installed from Python; the default is what it did
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def prepare_process() -> None:
    """Before a command that loads models: the heap tuned and transformers' progress bars off."""
    from transformers.utils import logging as hf_logging

    from agentq.utils.malloc_tuning import tune_malloc

    tune_malloc()       # large CPU tensors from the heap, not a page-faulted mmap each (AGENTQ_MALLOC_TUNING=0: off)
    # transformers' own bars at every model load and checkpoint save ("Writing model shards"), drawn
    # with carriage returns into agentq's progress and log files; agentq says what it loads and saves
    hf_logging.disable_progress_bar()


#: OSErrors the user fixes on the machine (a full disk or quota, a read-only folder, permissions): one line
USER_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT}


def disk_error(e: OSError) -> int:
    """Print an OSError of `USER_ERRNOS` as "agentq: <reason>: <file>" and return exit status 2;
    re-raise any other (a traceback for what is unexpected)."""
    if e.errno not in USER_ERRNOS:
        raise e
    print(f"agentq: {e.strerror or e}" + (f": {e.filename}" if e.filename is not None else ""), file=sys.stderr)
    return 2


def version() -> str:
    """The installed agentq's version (its package metadata), else `agentq.__version__` where set."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("agentq")
    except PackageNotFoundError:        # run from a checkout that was never installed
        import agentq

        return str(getattr(agentq, "__version__", "unknown"))


def dispatch(cmd: str, cfg: DictConfig, overrides: list[str]) -> None:
    """Run `cmd` on the composed config (`overrides`: the command line, for a resume or a sweep)."""
    if cmd == "config":
        from omegaconf import OmegaConf
        if cfg.trainer.get("resume"):       # what `agentq train` would run: the run's config.yaml, these overrides on top
            from agentq.trainer.rl import resumed_config
            from agentq.trainer.run_dir import check_resume_dir

            check_resume_dir(cfg.trainer.resume)
            cfg = resumed_config(cfg, overrides)
        print(OmegaConf.to_yaml(cfg, resolve=True))
    elif cmd == "train":
        from agentq.trainer.rl import train
        train(cfg, overrides)       # a resume: the run's config.yaml with these overrides on top
    elif cmd == "eval":
        from agentq.eval.evaluate import evaluate
        evaluate(cfg, overrides)
    elif cmd == "pipeline":
        from agentq.trainer.pipeline import pipeline
        pipeline(cfg, overrides)
    elif cmd == "sweep":
        from agentq.trainer.sweep import sweep
        sweep(cfg, overrides)
    elif cmd == "sft":
        from agentq.trainer.sft import sft
        sft(cfg, overrides=overrides)       # the closing `agentq train` hint repeats its env settings


def report(args: list[str]) -> int:
    """`agentq report <run> [out.html]`: a static HTML report of an RL run folder."""
    if len(args) not in (1, 2) or args[0] in ("-h", "--help"):
        print("usage: agentq report <run folder> [out.html]   (a run folder of `agentq train`, or of `agentq "
              "pipeline`; out.html: the file to write, default <run folder>/report.html. The page has the run's "
              "held-out evaluations, with those `agentq eval` wrote into its checkpoints)",
              file=sys.stderr if args[:1] not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    from pathlib import Path

    from agentq.eval.report import write_report
    from agentq.utils.errors import RunFileError

    if len(args) == 2 and Path(args[1]).is_dir():       # `agentq report runs/x runs/x`: an IsADirectoryError traceback
        print(f"agentq: report: {args[1]!r} is a folder; the second argument is the HTML file to write, e.g. "
              f"{Path(args[1]) / 'report.html'} (left out: <run folder>/report.html)", file=sys.stderr)
        return 2
    try:
        out = write_report(args[0], args[1] if len(args) == 2 else None)
    except (FileNotFoundError, RunFileError) as e:
        print(f"agentq: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        return disk_error(e)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
