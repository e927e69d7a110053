"""Held-out splits of every environment, as a published evaluation needs them: the training split and
the held-out splits share no task id and, where the environment has one, no underlying game (ALFRED
problem and room, ScienceWorld variation, WebShop goal); and a fresh process with another hash seed
lists the same tasks in the same order (an evaluation of another checkpoint plays the same tasks).

Where the splits share something by design, the test measures it and says so (TextWorldExpress coin at
the default size: few distinct games; WebShop: the products behind the goals), as the README's
evaluation paragraph states.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import agentq.envs  # noqa: F401  (registers the environments)

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf" / "env"


def _fresh_process(code: str, hash_seed: str = "4242", **env: str) -> object:
    """`code`'s last printed line as JSON, run by a new interpreter with another PYTHONHASHSEED."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONHASHSEED": hash_seed, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _disjoint(lists: dict[str, list]) -> None:
    names = list(lists)
    for i, a in enumerate(names):
        assert len(set(lists[a])) == len(lists[a]), f"{a} repeats a task"
        for b in names[i + 1:]:
            assert not set(lists[a]) & set(lists[b]), (a, b, sorted(set(lists[a]) & set(lists[b]))[:5])


# ------------------------------------------------------------------------------------ TextWorldExpress
def _twx_kwargs(conf: str) -> dict:
    kw = yaml.safe_load((CONF / conf).read_text())["kwargs"]
    return {k: kw[k] for k in ("games", "game_params", "tasks_per_game")}


@pytest.mark.parametrize("conf", ["textworld_express.yaml", "textworld_express_mapreader.yaml"])
def test_textworld_express_folds_are_disjoint_and_the_same_in_a_fresh_process(conf):
    pytest.importorskip("textworld_express")
    kw = _twx_kwargs(conf)
    game = kw["games"][0]
    env = gym.make("agentq/TextWorldExpress-v0", split="train", **kw).unwrapped
    try:
        lists = {s: env.list_tasks(s) for s in ("train", "dev", "test")}
    finally:
        env.close()
    seeds = {s: [int(t.rsplit("/", 1)[1]) for t in v] for s, v in lists.items()}
    assert {s: (v[0], v[-1], len(v)) for s, v in seeds.items()} == {
        "train": (0, 999, 1000), "dev": (10000, 10999, 1000), "test": (20000, 20999, 1000)}
    assert all(t.startswith(f"{game}/") for v in lists.values() for t in v)
    _disjoint(seeds)          # train ∩ dev was untested
    code = ("import json, gymnasium as gym, agentq.envs; "
            f"e = gym.make('agentq/TextWorldExpress-v0', split='train', **{kw!r}).unwrapped; "
            "print(json.dumps({s: e.list_tasks(s) for s in ('train', 'dev', 'test')}))")
    assert _fresh_process(code) == lists


def _twx_game(env, task_id: str, fold: str) -> str:
    """A TextWorldExpress game's fingerprint: its task, first observation and every room's `look around`
    text, reached by every move sequence (no doors: moves alone reach every room)."""
    options = {"task_id": task_id, "split": fold}
    first, info = env.reset(options=options)
    task, rooms, todo = info["task"], {}, [()]
    while todo:
        path = todo.pop()
        env.reset(options=options)
        for a in path:
            env.step(a)
        look, *_, info = env.step("look around")
        if look in rooms.values():
            continue
        rooms[path] = look
        todo += [path + (a,) for a in info["admissible_actions"] if a.startswith("move ")]
    return hashlib.sha1("\x00".join([task, first, *sorted(rooms.values())]).encode()).hexdigest()


def test_coin_at_the_default_size_has_few_games_and_dev_starts_with_training_ones():
    """conf/env/textworld_express.yaml's coin (3 rooms, no doors, no distractors) has few distinct games:
    the first 200 seeds of each fold (what `agentq pipeline` evaluates) hold 36 each; the first 200 dev
    tasks are all games of the first 200 train seeds (the same observations whatever is played), the
    first 200 test tasks none (their kitchens have a dining table). Seeds are disjoint; games are not."""
    pytest.importorskip("textworld_express")
    env = gym.make("agentq/TextWorldExpress-v0", split="train", **_twx_kwargs("textworld_express.yaml")).unwrapped
    try:
        games = {fold: [_twx_game(env, t, fold) for t in env.list_tasks(fold)[:200]] for fold in ("train", "dev", "test")}
        assert {fold: len(set(g)) for fold, g in games.items()} == {"train": 36, "dev": 36, "test": 36}
        assert set(games["dev"]) == set(games["train"]) and not set(games["test"]) & set(games["train"])
        # one pair replayed: dev's first task is a train task's game under any actions
        twin = env.list_tasks("train")[games["train"].index(games["dev"][0])]

        def play(task_id, fold):
            obs = [env.reset(options={"task_id": task_id, "split": fold})[0]]
            for a in ("move north", "move south", "move east", "move west", "take coin", "look around"):
                obs.append(env.step(a)[0])
            return obs
        assert play("coin/10000", "dev") == play(twin, "train")
    finally:
        env.close()


# ------------------------------------------------------------------------------------ ALFWorld
def _alfworld_data(tmp_path_factory) -> Path:
    archive = os.environ.get("AGENTQ_ALFWORLD_ARCHIVE") or str(REPO.parent / "shared" / "data"
                                                               / "alfworld-json_2.1.1-valid.tar.gz")
    if not Path(archive).is_file():
        pytest.skip("real ALFWorld games not available (AGENTQ_ALFWORLD_ARCHIVE or ../shared/data)")
    dest = tmp_path_factory.mktemp("alfworld-data")
    with tarfile.open(archive) as tf:
        tf.extractall(dest, **({"filter": "data"} if sys.version_info >= (3, 12) else {}))
    return dest / "alfworld"


def test_alfworld_real_splits_share_no_game_and_valid_unseen_no_room_with_training(tmp_path_factory):
    """valid_seen / valid_unseen / valid_train share no task id, trial or ALFRED problem; valid_unseen
    (env.eval_split) plays only the four unseen rooms, none of which gen_train (env.train_split) uses;
    the lists are the same in a fresh process."""
    pytest.importorskip("alfworld")
    from agentq.envs.alfworld import generator as gen
    from agentq.envs.alfworld.data import list_real_games, split_dir

    conf = yaml.safe_load((CONF / "alfworld.yaml").read_text())
    assert (conf["train_split"], conf["eval_split"]) == ("gen_train", "valid_unseen")
    data = _alfworld_data(tmp_path_factory)
    real = ("valid_seen", "valid_unseen", "valid_train")
    ids = {s: list_real_games(s, data) for s in real}
    assert {s: len(v) for s, v in ids.items()} == {"valid_seen": 140, "valid_unseen": 134, "valid_train": 200}
    _disjoint(ids)
    _disjoint({s: [t.split("/")[1] for t in v] for s, v in ids.items()})                 # ALFRED trials
    _disjoint({s: [hashlib.sha1((split_dir(s, data) / t / "initial_state.pddl").read_bytes()).hexdigest()
                   for t in v] for s, v in ids.items()})                                  # the problems
    rooms = {s: {int(json.loads((split_dir(s, data) / t / "traj_data.json").read_text())["scene"]["floor_plan"]
                     .removeprefix("FloorPlan")) for t in v} for s, v in ids.items()}
    gen_train_rooms = {gen.parse_task_id(t)[1] for t in gen.list_gen_tasks("gen_train", gen.DEFAULT_GEN_SIZES["gen_train"])}
    assert rooms["valid_unseen"] == set(gen.UNSEEN_FLOOR_PLANS) and not rooms["valid_unseen"] & gen_train_rooms
    assert rooms["valid_seen"] <= gen_train_rooms          # "seen": the training rooms, by design
    code = ("import json; from agentq.envs.alfworld.data import list_real_games; "
            f"print(json.dumps({{s: list_real_games(s, {str(data)!r}) for s in {real!r}}}))")
    assert _fresh_process(code) == ids


# ------------------------------------------------------------------------------------ ScienceWorld
def test_scienceworld_splits_from_a_fresh_jvm_match_and_partition_each_tasks_variations(tmp_path):
    """The splits come from the simulator (then a disk cache): a new process with an empty cache asks a
    new JVM and gets the same lists; each task's train / dev / test variations partition 0 … max − 1."""
    pytest.importorskip("scienceworld")
    from agentq.envs.scienceworld import tasks as T

    code = ("import json, gymnasium as gym, agentq.envs; "
            "e = gym.make('agentq/ScienceWorld-v0', split='train').unwrapped; "
            "print(json.dumps({s: e.list_tasks(s) for s in ('train', 'dev', 'test')})); e.close()")
    first = _fresh_process(code, "1", AGENTQ_CACHE=str(tmp_path / "a"))
    assert _fresh_process(code, "2", AGENTQ_CACHE=str(tmp_path / "b")) == first
    assert (tmp_path / "b" / "scienceworld").is_dir()            # it computed its own, not a shared cache
    assert {s: len(v) for s, v in first.items()} == {"train": 3592, "dev": 1796, "test": 1819}
    _disjoint(first)
    splits = json.loads(next((tmp_path / "a" / "scienceworld").glob("splits-*.json")).read_text())["tasks"]
    assert len(splits) == 30
    for name, s in splits.items():
        assert sorted(s["train"] + s["dev"] + s["test"]) == list(range(s["max_variations"])), name
    assert first["test"] == T.split_task_ids(splits, T.all_tasks(), "test")


# ------------------------------------------------------------------------------------ WebShop
def test_webshop_splits_share_no_goal_but_most_test_products_are_train_products():
    """Splits are goal index ranges of the shuffled goal list, as in WebShop: no goal (product, text,
    options, price limit) is in two splits, and a fresh process lists and builds the same goals. A
    product has several goals, so the products are shared: 375 of the 500 test goals ask for a product
    some train goal asks for (WebShop's own split is by instruction too)."""
    conf = yaml.safe_load((CONF / "webshop.yaml").read_text())
    env = gym.make("agentq/WebShop-v0", split=conf["train_split"], **conf["kwargs"]).unwrapped
    goals = env.shop.goals

    def key(tid):
        g = goals[int(tid)]
        return json.dumps([g["asin"], g["instruction_text"], g["goal_options"], g["price_upper"]], sort_keys=True)
    lists = {s: env.list_tasks(s) for s in ("train", "dev", "test")}
    _disjoint(lists)
    _disjoint({s: [key(t) for t in v] for s, v in lists.items()})
    train_products = {goals[int(t)]["asin"] for t in lists["train"]}
    assert sum(goals[int(t)]["asin"] in train_products for t in lists["test"]) == 375
    code = ("import json, yaml, gymnasium as gym, agentq.envs; "
            f"c = yaml.safe_load(open({str(CONF / 'webshop.yaml')!r})); "
            "e = gym.make('agentq/WebShop-v0', split=c['train_split'], **c['kwargs']).unwrapped; "
            "g = e.shop.goals; "
            "print(json.dumps({s: [[t, g[int(t)]['asin'], g[int(t)]['instruction_text']] for t in e.list_tasks(s)] "
            "for s in ('train', 'dev', 'test')}))")
    assert _fresh_process(code) == {s: [[t, goals[int(t)]["asin"], goals[int(t)]["instruction_text"]] for t in v]
                                    for s, v in lists.items()}
