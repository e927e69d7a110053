"""Real ALFWorld games: finding them under $ALFWORLD_DATA and loading them in one vocabulary.

Layout (what `alfworld-download` writes): `$ALFWORLD_DATA/json_2.1.1/<split>/<task>/<trial>/`
with `game.tw-pddl`, `traj_data.json` and, in the full release, `initial_state.pddl`. A task id is
"<task>/<trial>", e.g. "look_at_obj_in_light-AlarmClock-None-DeskLamp-308/trial_T20190908_222917_366542".

Vocabulary: agentq plays every game with the alfworld 0.4.2 wheel's domain and grammar ("move X
to Y", `help`). A game file that embeds another domain (the json_2.1.1 release's own files use
"put X in/on Y") is rebuilt on load from its `initial_state.pddl` with the wheel's domain and
grammar and a templated task text, as `alfworld-generate` does; the shared evaluation archive
already is in that form, so it loads unchanged.
"""
from __future__ import annotations

import json
import os
import random
import warnings
from pathlib import Path

from ..base import SplitRefused
from .generator import TASK_TYPES, grammar_with_task, stable_seed, tables, wheel_domain

REAL_SPLITS: tuple[str, ...] = ("valid_seen", "valid_unseen", "valid_train", "train")
#: the generated split that stands in for each real one (its rooms: ALFRED's unseen ones, or the others)
GENERATED_FOR = {"valid_seen": "gen_seen", "valid_unseen": "gen_unseen", "valid_train": "gen_seen",
                 "train": "gen_train"}
_HOW_TO_GET = (
    "Get the real games with `alfworld-download` (needs internet; it writes to $ALFWORLD_DATA, "
    "default ~/.cache/alfworld), or unpack an archive with the json_2.1.1 layout and set ALFWORLD_DATA "
    "(or the env's data_dir=) to the folder that contains json_2.1.1. Without real games, play a "
    "generated split (gen_train, gen_seen or gen_unseen), which needs no download")


def _without_real_games(split: str) -> str:
    """How to play the generated stand-in of real `split`, naming no setting: the env cannot know which
    one gave the split (env.train_split, env.eval_split, pipeline.eval_splits, `agentq eval`'s split=;
    it named env.eval_split under `agentq eval split=...`). agentq's one line starts with that key
    (`build.split_refused`)."""
    return f"{_HOW_TO_GET}: {GENERATED_FOR[split]} in place of {split}."


class ALFWorldDataError(FileNotFoundError, SplitRefused):
    """The real ALFWorld games of a split are not where ALFWORLD_DATA / data_dir says.

    A refusal of the split (`SplitRefused`, a `ValueError`): every command reports it as one line
    starting with the setting that gave the split (a `FileNotFoundError` alone ended `agentq eval`
    with a traceback), where a refusal of the env's other settings names the env instead.
    """


class ALFWorldGameError(SplitRefused):
    """A game file of a real split cannot be read (damaged, truncated): one line naming the file, where
    the JSON parser's own message ("Expecting value: line 1 column 1") named none."""


def forget_empty_data_var() -> None:
    """Remove an empty $ALFWORLD_DATA from this process's environment, before alfworld is imported.

    `import alfworld` makes the folder $ALFWORLD_DATA names and raised `FileNotFoundError: ''` for an
    empty value, even for a generated split, which needs no data; `data_root` reads an empty value as
    unset, and so does alfworld once it is gone (and children inherit that).
    """
    if os.environ.get("ALFWORLD_DATA") == "":
        del os.environ["ALFWORLD_DATA"]


def data_root(data_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(root, where it came from): `data_dir`, else $ALFWORLD_DATA, else alfworld's default ~/.cache/alfworld.

    A `data_dir` equal to $ALFWORLD_DATA came from it: agentq's config copies $ALFWORLD_DATA into
    env.kwargs.data_dir (`resolved_kwargs`), and an error blamed a data_dir the user never gave.
    """
    default = Path("~/.cache/alfworld").expanduser()
    given = os.environ.get("ALFWORLD_DATA")
    # `import alfworld` sets $ALFWORLD_DATA to its default when unset: that value says nothing of the user
    from_env = Path(given).expanduser() if given and Path(given).expanduser() != default else None
    if data_dir:
        path = Path(data_dir).expanduser()
        same = from_env is not None and path.absolute() == from_env.absolute()
        return path, "$ALFWORLD_DATA" if same else "data_dir argument"
    if from_env is not None:
        return from_env, "$ALFWORLD_DATA"
    return default, "alfworld's default (ALFWORLD_DATA unset, or set to it)"


def read_game_json(path: Path) -> dict:
    """The JSON document of a game's file (game.tw-pddl, traj_data.json).

    Raises:
        ALFWorldGameError: it is not JSON (a damaged unpack): one line naming the file and the way out.
    """
    try:
        doc = json.loads(path.read_text())
    except ValueError as e:             # JSONDecodeError, or bytes that are not UTF-8
        raise ALFWorldGameError(f"ALFWorld game file {path} is damaged ({e}): unpack the archive again "
                                "(or run `alfworld-download`)") from None
    if not isinstance(doc, dict):
        raise ALFWorldGameError(f"ALFWorld game file {path} is damaged (a JSON {type(doc).__name__}, not an "
                                "object): unpack the archive again (or run `alfworld-download`)")
    return doc


def split_dir(split: str, data_dir: str | os.PathLike | None = None) -> Path:
    if split not in REAL_SPLITS:
        raise ValueError(f"unknown real ALFWorld split {split!r}; valid: {list(REAL_SPLITS)}")
    root, source = data_root(data_dir)
    path = root / "json_2.1.1" / split
    if not path.is_dir():
        have = sorted(p.name for p in (root / "json_2.1.1").iterdir()) if (root / "json_2.1.1").is_dir() else []
        raise ALFWorldDataError(
            f"ALFWorld split {split!r} not found: {path} does not exist (root {root} from {source}; "
            f"splits present there: {have or 'none'}). {_without_real_games(split)}")
    return path


def task_type_of(task_id: str) -> str:
    """Task type of a real task id (its folder name starts with the type)."""
    head = task_id.split("/", 1)[0].split("-", 1)[0]
    return head if head in TASK_TYPES else "unknown"


def list_real_games(split: str, data_dir=None, task_types=TASK_TYPES) -> list[str]:
    """Sorted task ids of the split's solvable games (as AlfredTWEnv.collect_game_files selects them)."""
    base = split_dir(split, data_dir)
    ids = []
    for task in sorted(os.listdir(base)):
        if "movable" in task or "Sliced" in task or task_type_of(task) not in task_types:
            continue
        tdir = base / task
        if not tdir.is_dir():
            continue
        for trial in sorted(os.listdir(tdir)):
            folder = tdir / trial
            if not (folder / "traj_data.json").exists():
                continue
            game = folder / "game.tw-pddl"
            if game.exists():
                if read_game_json(game).get("solvable") is not True:
                    continue
            elif not (folder / "initial_state.pddl").exists():
                continue
            ids.append(f"{task}/{trial}")
    return ids


def load_real_game(split: str, task_id: str, data_dir: str | os.PathLike | None = None
                   ) -> tuple[Path, dict | None, dict]:
    """(path of the game's folder, game.tw-pddl document in the wheel's vocabulary, traj_data)."""
    folder = split_dir(split, data_dir) / task_id
    traj = read_game_json(folder / "traj_data.json")
    game_file, initial = folder / "game.tw-pddl", folder / "initial_state.pddl"
    game = read_game_json(game_file) if game_file.exists() else None
    if game is not None and game.get("pddl_domain") == wheel_domain():
        return folder, game, traj
    if initial.exists():
        return folder, rebuild_game(initial.read_text(), traj, task_id), traj
    warnings.warn(f"{game_file} embeds a PDDL domain other than alfworld 0.4.2's and has no initial_state.pddl "
                  "to rebuild it from: its commands may differ ('put X in/on Y')", stacklevel=2)
    return folder, game, traj


def rebuild_game(problem: str, traj: dict, task_id: str) -> dict:
    """A game document from an ALFRED problem with the wheel's domain, grammar and a templated task.

    The template (two per task type) is chosen by a generator seeded from the task id, so a game
    reads the same on every machine.
    """
    params = traj["pddl_params"]
    template = random.Random(stable_seed("task-text", task_id)).choice(tables().templates[traj["task_type"]])
    desc = template.format(obj=params["object_target"].lower(), recep=params["parent_target"].lower(),
                           toggle=params["toggle_target"].lower(), mrecep=params["mrecep_target"].lower())
    return {"pddl_domain": wheel_domain(), "grammar": grammar_with_task(desc), "pddl_problem": problem,
            "solvable": True, "walkthrough": None}
