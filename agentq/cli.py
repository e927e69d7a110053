"""`agentq` command line: Hydra-style `key=value` overrides on conf/config.yaml.

    agentq train env=textworld_express trainer.steps=2 trainer.out_dir=runs/x
    agentq eval checkpoint=runs/x/checkpoints/step_000002 env=textworld_express split=test
    agentq sft env=alfworld sft.num_demos=200
    agentq pipeline                              # the embedded default: tiny model → SFT → RL → eval
    agentq sweep sweep.parallel=2                # every objective × 3 seeds from one SFT checkpoint
    agentq config env=webshop algo=qat          # print the composed config
    agentq report runs/x                         # runs/x/report.html: curves, evals, by-turn, episode viewer
"""
from __future__ import annotations

import sys

COMMANDS = ("pipeline", "train", "eval", "sft", "config", "report", "sweep")
CONFIG_OF = {"pipeline": "pipeline", "sweep": "sweep"}      # commands with their own root config


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        print(f"\ncommands: {', '.join(COMMANDS)}")
        return 0
    cmd, overrides = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"agentq: unknown command {cmd!r}; valid: {list(COMMANDS)}", file=sys.stderr)
        return 2
    if cmd == "report":
        return report(overrides)
    if any(a in ("-h", "--help") for a in overrides):
        print(__doc__.strip())
        print(f"\n`agentq {cmd}` takes section.key=value overrides; `agentq config` prints every key "
              "(`pipeline` starts from conf/pipeline.yaml, which sets the default run's sizes; `sweep` from "
              "conf/sweep.yaml)")
        return 0
    from agentq.config import ConfigError, load_config
    from agentq.trainer.run_dir import RunAborted
    from agentq.utils.checkpoint import CheckpointError

    try:
        cfg = load_config(overrides, config_name=CONFIG_OF.get(cmd, "config"))
        if cmd == "config":
            from omegaconf import OmegaConf
            print(OmegaConf.to_yaml(cfg, resolve=True))
        elif cmd == "train":
            from agentq.trainer.rl import train
            train(cfg, overrides)       # a resume: the run's config.yaml with these overrides on top
        elif cmd == "eval":
            from agentq.eval.evaluate import evaluate
            evaluate(cfg)
        elif cmd == "pipeline":
            from agentq.trainer.pipeline import pipeline
            pipeline(cfg)
        elif cmd == "sweep":
            from agentq.trainer.sweep import sweep
            sweep(cfg, overrides)
        elif cmd == "sft":
            from agentq.trainer.sft import sft
            sft(cfg)
    except (ConfigError, CheckpointError) as e:        # bad input: a key, a run folder, a checkpoint file
        print(f"agentq: {e}", file=sys.stderr)
        return 2
    except RunAborted as e:
        print(f"agentq: run stopped: {e}", file=sys.stderr)
        return 1
    return 0


def report(args: list[str]) -> int:
    """`agentq report <run> [out.html]`: a static HTML report of an RL run folder."""
    if len(args) not in (1, 2) or args[0] in ("-h", "--help"):
        print("usage: agentq report <run folder> [out.html]   (default: <run folder>/report.html)",
              file=sys.stderr if args[:1] not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    from agentq.eval.report import write_report

    try:
        out = write_report(args[0], args[1] if len(args) == 2 else None)
    except FileNotFoundError as e:
        print(f"agentq: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
