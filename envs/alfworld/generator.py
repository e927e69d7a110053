"""ALFWorld-style game generator built only from data shipped in the alfworld 0.4.2 wheel.

A generated game is a `game.tw-pddl` document (the wheel's PDDL domain and text grammar, and a
PDDL problem built here) plus a `traj_data.json` with `task_type` and `pddl_params`, the same
layout as a real ALFWorld game folder, so both play through the same engine and experts.

Inputs: the floor-plan layouts (`alfworld/gen/layouts/FloorPlan*-{objects,openable}.json`: which
classes each AI2-THOR room holds and where its receptacles stand), the class tables of
`alfworld.gen.constants` (what may hold what; heatable, coolable, ... classes) and the goal
templates of `alfworld.gen.goal_library`.

A game is a pure function of (task type, floor plan, seed): the random generator is seeded from
those three and every set is sorted before sampling, so the same id gives byte-identical games on
any machine and under any PYTHONHASHSEED. Every game is solvable by construction (the checks in
`_task_options` and `_place_lamp`); `eval/bench_alfworld.py` verifies it with the planner.

Splits follow ALFRED's room split: `gen_unseen` uses only the held-out floor plans
10/219/308/424 (the rooms of real `valid_unseen`); `gen_train` and `gen_seen` use the other 116
floor plans with disjoint seed ranges. `docs/envs/alfworld.md` lists how these games differ
from real ALFWorld games.
"""
from __future__ import annotations

import hashlib
import json
import numbers
import os
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Mapping

#: the six ALFWorld task types (movable-receptacle and sliced tasks are excluded, as in ALFWorld)
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "pick_two_obj_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
)
#: ALFRED's unseen rooms (a kitchen, a living room, a bedroom, a bathroom): gen_unseen only
UNSEEN_FLOOR_PLANS: tuple[int, ...] = (10, 219, 308, 424)
GEN_SPLITS: tuple[str, ...] = ("gen_train", "gen_seen", "gen_unseen")
#: default number of games per task type in each generated split
DEFAULT_GEN_SIZES: dict[str, int] = {"gen_train": 500, "gen_seen": 25, "gen_unseen": 25}
#: first seed of each split: gen_train and gen_seen share rooms, so their seeds must never meet
_SEED_BASE = {"gen_train": 0, "gen_seen": 1_000_000, "gen_unseen": 0}
#: bump when the generated games change; cached games of other versions are ignored
GENERATOR_VERSION = "v1"

# The state-change appliance of each task type, and the parent classes ALFRED never pairs with it
# (real valid games never ask to "heat X and put it in the microwave").
_APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
              "pick_cool_then_place_in_recep": "Fridge"}
_ABILITY = {"pick_clean_then_place_in_recep": "Cleanable", "pick_heat_then_place_in_recep": "Heatable",
            "pick_cool_then_place_in_recep": "Coolable"}
_LAMP = "DeskLamp"
_LAMP_HOLDERS = ("CoffeeTable", "Desk", "Dresser", "Shelf", "SideTable")
_TARGETS = {"pick_two_obj_and_place": (2, 2)}   # other types: 1 to 3 instances of the target class
# Every other pickupable class the room lists is present, as in AI2-THOR scenes, with 1-2 instances
# (real valid_unseen games: 38.5 pickupable objects per game; these: see docs/envs/alfworld.md).
_INSTANCES_PER_DISTRACTOR = (1, 2)
# Receptacle classes the layout lists without a pose get one instance, except stoves (4 burners).
_UNPOSED_INSTANCES = {"StoveBurner": 4}


def _wheel_file(*parts: str) -> Path:
    return Path(str(resources.files("alfworld").joinpath(*parts)))


@lru_cache(maxsize=None)
def wheel_domain() -> str:
    """The PDDL domain shipped in the alfworld wheel (alfworld.info.ALFRED_PDDL_PATH)."""
    return _wheel_file("data", "alfred.pddl").read_text()


@lru_cache(maxsize=None)
def wheel_grammar() -> str:
    """The text grammar shipped in the wheel; its task line reads "UNKNOWN GOAL"."""
    return _wheel_file("data", "alfred.twl2").read_text()


def grammar_with_task(task_desc: str) -> str:
    """The wheel's grammar with `task_desc` as the task line (what `add_task_to_grammar` does)."""
    return wheel_grammar().replace("UNKNOWN GOAL", task_desc)


def mangle(name: str) -> str:
    """AI2-THOR id → PDDL name, as in the real game files ("Cabinet|+00.68|..." → "Cabinet_bar__plus_00_dot_68...")."""
    for a, b in (("|", "_bar_"), ("-", "_minus_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        name = name.replace(a, b)
    return name


def stable_seed(*parts) -> int:
    """A 64-bit seed from `parts`, identical across processes and machines (unlike hash())."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


# ---------------------------------------------------------------------------------- class tables
@dataclass(frozen=True)
class _Tables:
    can_hold: dict[str, frozenset[str]]        # receptacle class → object classes it may hold
    receptacles: frozenset[str]                # static receptacle classes
    pickupable: frozenset[str]
    ability: dict[str, frozenset[str]]         # Heatable/Coolable/Cleanable/Toggleable/Sliceable → classes
    openable: frozenset[str]
    movable: frozenset[str]
    otypes: tuple[str, ...]                    # every object class, declared as "<C>Type - otype"
    goal_pddl: dict[str, str]
    templates: dict[str, tuple[str, ...]]


@lru_cache(maxsize=None)
def tables() -> _Tables:
    import alfworld.gen.constants as C
    import alfworld.gen.goal_library as G

    movable = frozenset(C.MOVABLE_RECEPTACLES)
    can_hold = {r: frozenset(o for o in objs if not o.endswith("Sliced"))
                for r, objs in C.VAL_RECEPTACLE_OBJECTS.items()}
    receptacles = frozenset(can_hold) - movable
    pickupable = frozenset().union(*can_hold.values())
    otypes = tuple(sorted((set(C.OBJECTS) | pickupable | {_LAMP}) - receptacles))
    return _Tables(
        can_hold=can_hold, receptacles=receptacles, pickupable=pickupable,
        ability={k: frozenset(v) for k, v in C.VAL_ACTION_OBJECTS.items()},
        openable=frozenset(C.OPENABLE_CLASS_SET), movable=movable, otypes=otypes,
        goal_pddl={t: G.gdict[t]["pddl"] for t in TASK_TYPES},
        templates={t: tuple(G.gdict[t]["templates"]) for t in TASK_TYPES})


# ---------------------------------------------------------------------------------- rooms
@dataclass(frozen=True)
class Room:
    floor_plan: int
    classes: frozenset[str]                          # every class the objects file lists
    receptacles: tuple[tuple[str, str, str], ...]    # (AI2-THOR id, class, location) from the layout


def _location(x: float, z: float, rotation: float, horizon: float) -> str:
    # ALFWorld's location names: grid coordinates (0.25 m steps), rotation in quarter turns, horizon.
    return f"loc|{int(round(x * 4))}|{int(round(z * 4))}|{int(round(rotation / 90)) % 4}|{int(round(horizon))}"


@lru_cache(maxsize=None)
def all_floor_plans() -> tuple[int, ...]:
    names = (p.name for p in _wheel_file("gen", "layouts").iterdir())
    return tuple(sorted({int(m.group(1)) for n in names if (m := re.fullmatch(r"FloorPlan(\d+)-openable\.json", n))}))


@lru_cache(maxsize=None)
def room(floor_plan: int) -> Room:
    layouts = _wheel_file("gen", "layouts")
    try:
        classes = frozenset(json.loads((layouts / f"FloorPlan{floor_plan}-objects.json").read_text()))
        poses = json.loads((layouts / f"FloorPlan{floor_plan}-openable.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"no layout for FloorPlan{floor_plan}; valid floor plans: {list(all_floor_plans())}") from None
    recs = []
    for rid in sorted(poses):
        parts = rid.split("|")
        cls = parts[4] if len(parts) == 5 else parts[0]     # "Sink|x|y|z|SinkBasin" is a SinkBasin
        if cls in tables().receptacles:
            recs.append((rid, cls, _location(*poses[rid])))
    return Room(floor_plan, classes, tuple(recs))


# ---------------------------------------------------------------------------------- task choice
def _task_options(task_type: str, rm: Room) -> list[tuple[str, str]]:
    """Every (object class, parent class) this room supports for `task_type` (parent "" for look_at)."""
    T = tables()
    rec_classes = sorted(set(rm.classes) & T.receptacles)
    objs = sorted(c for c in rm.classes & T.pickupable
                  if any(c in T.can_hold[r] for r in rec_classes))   # a place to start from
    if task_type == "look_at_obj_in_light":
        if _LAMP not in rm.classes or not set(_LAMP_HOLDERS) & set(rec_classes):
            return []
        return [(o, "") for o in objs]
    if task_type in _APPLIANCE:
        appliance = _APPLIANCE[task_type]
        if appliance not in rec_classes:
            return []
        objs = [o for o in objs if o in T.ability[_ABILITY[task_type]]]
    else:
        appliance = None
    options = []
    for o in objs:
        for r in rec_classes:
            if r == appliance or o not in T.can_hold[r]:
                continue
            # the target must start somewhere that is not the parent class, or the goal holds at once
            if any(o in T.can_hold[s] for s in rec_classes if s != r):
                options.append((o, r))
    return options


@lru_cache(maxsize=None)
def feasible_floor_plans(task_type: str, split: str) -> tuple[int, ...]:
    """Floor plans of `split` where a `task_type` game can be generated."""
    check_task_type(task_type)
    fps = split_floor_plans(split)
    return tuple(fp for fp in fps if _task_options(task_type, room(fp)))


def split_floor_plans(split: str) -> tuple[int, ...]:
    if split == "gen_unseen":
        return UNSEEN_FLOOR_PLANS
    if split in ("gen_train", "gen_seen"):
        return tuple(fp for fp in all_floor_plans() if fp not in UNSEEN_FLOOR_PLANS)
    raise ValueError(f"unknown generated split {split!r}; valid: {list(GEN_SPLITS)}")


def check_task_type(task_type: str) -> str:
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; valid: {list(TASK_TYPES)}")
    return task_type


# ---------------------------------------------------------------------------------- task ids
def task_id(task_type: str, floor_plan: int, seed: int) -> str:
    return f"{task_type}/FloorPlan{floor_plan}/{seed}"


def parse_task_id(tid: str) -> tuple[str, int, int]:
    m = re.fullmatch(r"([a-z_]+)/FloorPlan(\d+)/(\d+)", tid)
    if not m:
        raise ValueError(f"not a generated ALFWorld task id: {tid!r} (expected '<task_type>/FloorPlan<N>/<seed>')")
    return check_task_type(m.group(1)), int(m.group(2)), int(m.group(3))


def list_gen_tasks(split: str, per_type: int) -> list[str]:
    """The split's task ids: `per_type` games of each task type, round-robin over its floor plans.

    Game i of a type uses floor plan F[i % len(F)] with seed base + i // len(F), so the list is
    balanced over task types and rooms, and growing `per_type` only appends ids.
    """
    ids = []
    for t in TASK_TYPES:
        fps = feasible_floor_plans(t, split)
        ids += [task_id(t, fps[i % len(fps)], _SEED_BASE[split] + i // len(fps)) for i in range(per_type)]
    return ids


def split_of(tid: str) -> str | None:
    """Which generated split an id belongs to by construction (None if it is not a generated id)."""
    try:
        _, fp, seed = parse_task_id(tid)
    except ValueError:
        return None
    if fp in UNSEEN_FLOOR_PLANS:
        return "gen_unseen"
    return "gen_seen" if seed >= _SEED_BASE["gen_seen"] else "gen_train"


# ---------------------------------------------------------------------------------- generation
@dataclass
class GeneratedGame:
    task_id: str
    game: dict             # the game.tw-pddl document
    traj_data: dict        # task_type, pddl_params, scene (as in real traj_data.json)

    @property
    def task_desc(self) -> str:
        return self.traj_data["task_desc"]


class _Ids:
    """Fresh AI2-THOR-style ids and locations, unique within one game."""

    def __init__(self, rng: random.Random, taken: set[str]):
        self.rng, self.taken = rng, taken

    def object_id(self, cls: str) -> str:
        while True:
            x, y, z = (self.rng.uniform(-3, 3) for _ in range(3))
            oid = f"{cls}|{x:+06.2f}|{abs(y):+06.2f}|{z:+06.2f}"
            if oid not in self.taken:
                self.taken.add(oid)
                return oid

    def location(self) -> str:
        while True:
            loc = _location(self.rng.randint(-16, 16) / 4, self.rng.randint(-16, 16) / 4,
                            90 * self.rng.randint(0, 3), self.rng.choice((0, 30, 60)))
            if loc not in self.taken:
                self.taken.add(loc)
                return loc


Receptacle = tuple[str, str, str]   # (id, class, location) or, for objects, (id, class, receptacle id)


def _receptacles(rm: Room, ids: _Ids) -> list[Receptacle]:
    """Every posed receptacle instance of the layout, plus instances of the classes it lists without a pose."""
    receptacles = list(rm.receptacles)
    posed = {cls for _, cls, _ in receptacles}
    for cls in sorted((rm.classes & tables().receptacles) - posed):
        for _ in range(_UNPOSED_INSTANCES.get(cls, 1)):
            receptacles.append((ids.object_id(cls), cls, ids.location()))
    return receptacles


def _objects(rng: random.Random, ids: _Ids, rm: Room, receptacles: list[Receptacle], task_type: str,
             obj_cls: str, parent_cls: str) -> tuple[list[Receptacle], str]:
    """The task's target objects (not already in the goal receptacle), the lamp of a look-in-light
    task, and distractors of every other pickupable class; and the toggle target ("" or the lamp)."""
    T = tables()
    objects: list[Receptacle] = []

    def holders(cls: str, exclude: str | None = None) -> list[Receptacle]:
        return [rec for rec in receptacles if cls in T.can_hold[rec[1]] and rec[1] != exclude]

    lo, hi = _TARGETS.get(task_type, (1, 3))
    for _ in range(rng.randint(lo, hi)):
        rec = rng.choice(holders(obj_cls, exclude=parent_cls or None))
        objects.append((ids.object_id(obj_cls), obj_cls, rec[0]))
    toggle = ""
    if task_type == "look_at_obj_in_light":
        toggle = _LAMP
        rec = rng.choice([r for r in receptacles if r[1] in _LAMP_HOLDERS])
        objects.append((ids.object_id(_LAMP), _LAMP, rec[0]))
    for cls in sorted(c for c in rm.classes & T.pickupable if c != obj_cls and holders(c)):
        for _ in range(rng.randint(*_INSTANCES_PER_DISTRACTOR)):
            objects.append((ids.object_id(cls), cls, rng.choice(holders(cls))[0]))
    return objects, toggle


def generate(task_type: str, floor_plan: int, seed: int) -> GeneratedGame:
    """The game of (task type, floor plan, seed); raises ValueError where the room cannot host the type."""
    check_task_type(task_type)
    T = tables()
    rm = room(floor_plan)
    options = _task_options(task_type, rm)
    if not options:
        raise ValueError(f"FloorPlan{floor_plan} cannot host {task_type}; feasible floor plans: "
                         f"{[fp for fp in all_floor_plans() if _task_options(task_type, room(fp))]}")
    rng = random.Random(stable_seed(GENERATOR_VERSION, task_type, floor_plan, seed))
    obj_cls, parent_cls = rng.choice(options)

    ids = _Ids(rng, {rid for rid, _, _ in rm.receptacles} | {loc for _, _, loc in rm.receptacles})
    receptacles = _receptacles(rm, ids)
    start = ids.location()
    objects, toggle = _objects(rng, ids, rm, receptacles, task_type, obj_cls, parent_cls)

    desc = rng.choice(T.templates[task_type]).format(
        obj=obj_cls.lower(), recep=parent_cls.lower(), toggle=toggle.lower(), mrecep="")
    tid = task_id(task_type, floor_plan, seed)
    problem = _problem(tid, task_type, obj_cls, parent_cls, toggle, receptacles, objects, start)
    game = {"pddl_domain": wheel_domain(), "grammar": grammar_with_task(desc), "pddl_problem": problem,
            "solvable": True, "walkthrough": None}
    traj = {"task_id": tid, "task_type": task_type, "task_desc": desc,
            "pddl_params": {"object_target": obj_cls, "parent_target": parent_cls, "toggle_target": toggle,
                            "mrecep_target": "", "object_sliced": False},
            "scene": {"floor_plan": f"FloorPlan{floor_plan}", "scene_num": floor_plan, "seed": seed},
            "generator": GENERATOR_VERSION}
    return GeneratedGame(tid, game, traj)


def _problem(tid, task_type, obj_cls, parent_cls, toggle, receptacles, objects, start) -> str:
    T = tables()
    rec_loc = {rid: loc for rid, _, loc in receptacles}
    rec_cls = {rid: cls for rid, cls, _ in receptacles}
    locations = sorted({loc for _, _, loc in receptacles} | {start})
    decl = ["agent1 - agent"]
    decl += [f"{c}Type - otype" for c in T.otypes]
    decl += [f"{c}Type - rtype" for c in sorted(T.receptacles)]
    decl += [f"{mangle(oid)} - object" for oid, _, _ in objects]
    decl += [f"{mangle(rid)} - receptacle" for rid, _, _ in receptacles]
    decl += [f"{mangle(loc)} - location" for loc in locations]

    init = [f"(atLocation agent1 {mangle(start)})"]
    for rid, cls, loc in receptacles:
        init.append(f"(receptacleType {mangle(rid)} {cls}Type)")
        init.append(f"(receptacleAtLocation {mangle(rid)} {mangle(loc)})")
        if cls in T.openable:
            init.append(f"(openable {mangle(rid)})")
    present_objs = sorted({cls for _, cls, _ in objects})
    for r in sorted(set(rec_cls.values())):
        init += [f"(canContain {r}Type {o}Type)" for o in present_objs if o in T.can_hold[r]]
    for oid, cls, rid in objects:
        o = mangle(oid)
        init += [f"(objectType {o} {cls}Type)", f"(inReceptacle {o} {mangle(rid)})",
                 f"(objectAtLocation {o} {mangle(rec_loc[rid])})"]
        if cls in T.pickupable:
            init.append(f"(pickupable {o})")
        if cls in T.movable:
            init.append(f"(isReceptacleObject {o})")
        for ability, pred in (("Heatable", "heatable"), ("Coolable", "coolable"), ("Cleanable", "cleanable"),
                              ("Toggleable", "toggleable"), ("Sliceable", "sliceable")):
            if cls in T.ability[ability]:
                init.append(f"({pred} {o})")

    goal = T.goal_pddl[task_type].format(obj=obj_cls, recep=parent_cls, toggle=toggle, mrecep="").replace("#", "-")
    name = re.sub(r"[^A-Za-z0-9_]", "_", tid)
    return ("(define (problem gen_{name})\n(:domain alfred)\n(:objects\n        {decl}\n        )\n"
            "(:init\n        {init}\n        )\n{goal}\n").format(
                name=name, decl="\n        ".join(decl), init="\n        ".join(init), goal=goal)


# ---------------------------------------------------------------------------------- on-disk cache
def default_cache_dir() -> Path:
    """$AGENTQ_ALFWORLD_CACHE, else $XDG_CACHE_HOME/agentq/alfworld, else ~/.cache/agentq/alfworld."""
    if os.environ.get("AGENTQ_ALFWORLD_CACHE"):
        return Path(os.environ["AGENTQ_ALFWORLD_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentq" / "alfworld"


def _write_json_atomic(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def game_dir(cache_dir: str | os.PathLike, tid: str) -> Path:
    return Path(cache_dir) / f"games-{GENERATOR_VERSION}" / tid


def ensure_game(cache_dir: str | os.PathLike, tid: str) -> Path:
    """Path of the game.tw-pddl of generated task `tid`, writing the game folder on first use."""
    folder = game_dir(cache_dir, tid)
    path = folder / "game.tw-pddl"
    if not (path.exists() and (folder / "traj_data.json").exists()):
        g = generate(*parse_task_id(tid))
        _write_json_atomic(folder / "traj_data.json", g.traj_data)
        _write_json_atomic(path, g.game)
    return path


#: most games per task type in a generated split: gen_train's seeds (i // rooms, 29 rooms or more per
#: type) then stay below gen_seen's first seed, so the two splits never share a game
MAX_GEN_SIZE = 1_000_000


def _check_gen_size(key: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= int(n) <= MAX_GEN_SIZE:
        raise ValueError(f"gen_sizes{key} must be an int from 1 to {MAX_GEN_SIZE} (games per task type), got {n!r}; "
                         f"e.g. gen_sizes=100 or gen_sizes={{gen_train: 1000}} (defaults {DEFAULT_GEN_SIZES})")
    return int(n)


def gen_sizes(sizes: Mapping[str, int] | int | None) -> dict[str, int]:
    """Games per task type for each generated split, from an int (all splits) or a partial dict.

    Raises:
        ValueError: an unknown split, or a size that is not an int in [1, MAX_GEN_SIZE] (a size of 0
            or less would leave the split without games; a float or a string is refused, not truncated).
    """
    out = dict(DEFAULT_GEN_SIZES)
    if sizes is None:
        return out
    if not isinstance(sizes, Mapping):
        n = _check_gen_size("", sizes)
        return {s: n for s in GEN_SPLITS}
    bad = set(sizes) - set(GEN_SPLITS)
    if bad:
        raise ValueError(f"gen_sizes has unknown split(s) {sorted(bad)}; valid: {list(GEN_SPLITS)}")
    out.update({k: _check_gen_size(f"[{k!r}]", v) for k, v in sizes.items()})
    return out
