"""Whose folder a folder is: what each agentq command writes at its top and no other command does.

A folder that holds one command's run is refused to the others whatever their settings (a pipeline
wrote beside a train run, and `trainer.overwrite=true` removed what the two share; a train run and an
evaluation wrote into one folder). `agentq.trainer.run_dir` claims run folders with these markers;
`agentq eval` checks the folder `eval.out_dir` names.
"""
from __future__ import annotations

from pathlib import Path

#: what only that command writes at the top of its folder: whose folder it is. metrics.jsonl, tb/, sft/,
#: the curve and the report are written by more than one
MARKERS = {"train": ("train_summary.json", "checkpoints", "eval", "segments", "mismatch.png"),
           "sft": ("sft_summary.json", "checkpoint", "demos.jsonl"),
           "pipeline": ("summary.json", "rl", "eval_sft_*", "eval_rl_*"),
           "sweep": ("arms", "eval_sft", "table.md", "table.json", "curves.png"),
           "eval": ("eval.json", "episodes.jsonl", "episodes.partial.jsonl")}
#: what some commands write at the top of their folder and the others never do: a run cut short
#: before its own markers (a train run killed before its first checkpoint; a pipeline or a sweep
#: killed in its SFT stage, whose sft/ is an `agentq sft` folder)
SHARED_MARKERS = {("train", "sft"): ("metrics.jsonl", "tb", "errors.jsonl", "config.yaml"),
                  ("pipeline", "sweep"): ("sft/sft_summary.json", "sft/config.yaml", "sft/demos.jsonl",
                                          "sft/checkpoint")}


def found_in(folder: Path, names: tuple[str, ...]) -> list[str]:
    """The `names` present in `folder`; a pattern (`eval_sft_*`) gives each name it matches, as a path
    under `folder` ("sft/config.yaml")."""
    return [p.relative_to(folder).as_posix() for name in names for p in sorted(Path(folder).glob(name))]


def folder_owners(folder: Path) -> list[tuple[tuple[str, ...], list[str]]]:
    """Whose run `folder` holds, with what says so: the run command with the most `MARKERS` found; with
    none found, each group of `SHARED_MARKERS` found (a run cut short); with neither, `agentq eval` if
    its markers are there (an older agentq let an evaluation write into a run's folder, which stays
    that run's). Empty: no command's run."""
    found = {other: found_in(folder, names) for other, names in MARKERS.items()}
    runs = [k for k in found if k != "eval" and found[k]]
    if runs:
        owner = max(runs, key=lambda k: len(found[k]))
        return [((owner,), found[owner])]
    owned: list[tuple[tuple[str, ...], list[str]]] = [
        (owners, names) for owners, marks in SHARED_MARKERS.items() if (names := found_in(folder, marks))]
    return owned or ([(("eval",), found["eval"])] if found["eval"] else [])


def whose_run(owners: tuple[str, ...]) -> str:
    """`agentq train` or `agentq sft`, …: the commands `owners` names, for a message."""
    return " or ".join(f"`agentq {o}`" for o in owners)
