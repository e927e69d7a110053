"""ALFWorld env: real games from the shared archive, generated games, experts, parse cache.

Real games come from the json_2.1.1 validation archive, unpacked into a temp folder: its path is
$AGENTQ_ALFWORLD_ARCHIVE, else ../shared/data/alfworld-json_2.1.1-valid.tar.gz from the repo
root; tests that need it skip when neither exists. Generated games go to a temp cache folder.
The full benchmark (40 real games, ≥85 % handcoded) is the `slow` test at the end; the fast tests
run a few games of each kind.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("alfworld")
pytest.importorskip("textworld")

import gymnasium as gym  # noqa: E402

import agentq.envs  # noqa: E402,F401
from agentq.agent import PromptConfig  # noqa: E402
from agentq.envs.alfworld import generator as gen  # noqa: E402
from agentq.envs.alfworld import parse_cache  # noqa: E402
from agentq.envs.alfworld.data import ALFWorldDataError  # noqa: E402
from agentq.envs.alfworld.experts import play_expert  # noqa: E402
from agentq.envs.base import SplitRefused  # noqa: E402
from agentq.eval import bench_alfworld as bench  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARCHIVE_NAME = "alfworld-json_2.1.1-valid.tar.gz"
ENV_ID = "agentq/ALFWorld-v0"
LAMP_GAME = "look_at_obj_in_light-AlarmClock-None-DeskLamp-308/trial_T20190908_222917_366542"
LAMP_GAME_OBS = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a bed 1, a desk 2, a desk 1, a drawer 6, a drawer 5, a drawer 4, a drawer 3, a drawer 2, "
    "a drawer 1, a garbagecan 1, a laundryhamper 1, a safe 1, a shelf 6, a shelf 5, a shelf 4, a shelf 3, "
    "a shelf 2, and a shelf 1.\n\nYour task is to: examine the alarmclock with the desklamp.")
GEN_GAME = "pick_two_obj_and_place/FloorPlan424/0"
GEN_GAME_OBS = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a cabinet 4, a cabinet 3, a cabinet 2, a cabinet 1, a countertop 1, a garbagecan 1, "
    "a handtowelholder 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, a toiletpaperhanger 1, and a towelholder 1."
    "\n\nYour task is to: find two spraybottle and put them in toilet.")


def _archive() -> Path | None:
    for p in (os.environ.get("AGENTQ_ALFWORLD_ARCHIVE"), REPO.parent / "shared" / "data" / ARCHIVE_NAME):
        if p and Path(p).is_file():
            return Path(p)
    return None


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    archive = _archive()
    if archive is None:
        pytest.skip(f"real ALFWorld games not available: set AGENTQ_ALFWORLD_ARCHIVE or put {ARCHIVE_NAME} "
                    f"in {REPO.parent / 'shared' / 'data'}")
    dest = tmp_path_factory.mktemp("alfworld-data")
    with tarfile.open(archive) as tf:
        if sys.version_info >= (3, 12):
            tf.extractall(dest, filter="data")
        else:
            tf.extractall(dest)
    return dest / "alfworld"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("alfworld-cache")


@pytest.fixture(scope="module")
def real_env(data_dir, cache_dir):
    env = gym.make(ENV_ID, split="valid_unseen", data_dir=str(data_dir), cache_dir=str(cache_dir), expert=True)
    yield env
    env.close()


@pytest.fixture(scope="module")
def gen_env(cache_dir):
    env = gym.make(ENV_ID, split="gen_unseen", cache_dir=str(cache_dir), expert=True)
    yield env
    env.close()


# ---------------------------------------------------------------------------------- real games
def test_make_plays_real_game_from_alfworld_data(data_dir, cache_dir, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(data_dir))
    env = gym.make(ENV_ID, split="valid_unseen", cache_dir=str(cache_dir))
    obs, info = env.reset(options={"task_id": LAMP_GAME})
    assert obs == LAMP_GAME_OBS
    assert info["task"] == "examine the alarmclock with the desklamp."
    assert info["task_type"] == "look_at_obj_in_light" and info["split"] == "valid_unseen"
    assert info["won"] is False and info["score"] == 0.0 and "expert_action" not in info
    assert len(info["admissible_actions"]) == 21 and "go to desk 1" in info["admissible_actions"]
    obs, reward, terminated, truncated, info = env.step("go to shelf 3")
    assert obs == "You arrive at shelf 3. On the shelf 3, you see a bowl 1, and a desklamp 1."
    assert (reward, terminated, truncated) == (0.0, False, False)
    env.close()


def test_real_split_sizes(real_env):
    u = real_env.unwrapped
    assert [len(u.list_tasks(s)) for s in ("valid_seen", "valid_unseen", "valid_train")] == [140, 134, 200]
    assert Counter(u.task_type(t) for t in u.list_tasks("valid_unseen")) == {
        "pick_and_place_simple": 24, "pick_two_obj_and_place": 17, "pick_clean_then_place_in_recep": 31,
        "pick_heat_then_place_in_recep": 23, "pick_cool_then_place_in_recep": 21, "look_at_obj_in_light": 18}
    assert u.list_tasks("valid_unseen")[0] == LAMP_GAME


def test_missing_data_says_how_to_get_it(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(ALFWorldDataError) as e:
        gym.make(ENV_ID, split="valid_unseen", cache_dir=str(cache_dir))
    msg = str(e.value)
    assert str(tmp_path / "json_2.1.1" / "valid_unseen") in msg
    assert "alfworld-download" in msg and "gen_train" in msg and "ALFWORLD_DATA" in msg
    env = gym.make(ENV_ID, cache_dir=str(cache_dir))          # the default split needs no data
    assert env.unwrapped.split == "gen_train"
    with pytest.raises(ALFWorldDataError):
        env.reset(options={"split": "valid_seen"})


def test_handcoded_expert_wins_known_game(real_env):
    r = play_expert(real_env, LAMP_GAME)
    assert r["won"] and r["steps"] == 12
    assert r["actions"][0] == "look" and r["actions"][-3:] == ["take alarmclock 1 from desk 2", "go to desk 1",
                                                               "use desklamp 1"]
    assert play_expert(real_env, LAMP_GAME)["actions"] == r["actions"]     # reproducible


def test_handcoded_expert_small_sample(real_env):
    """The small version of the benchmark: four fixed valid_unseen games, one per type shown."""
    ids = bench.fixed_sample(real_env.unwrapped.list_tasks(), 4, seed=3)
    res = bench.expert_eval(real_env, ids, "valid_unseen")
    assert res["n"] == 4 and res["won"] == 4, res


def test_win_reward_terminated_and_step_cap(data_dir, cache_dir):
    env = gym.make(ENV_ID, split="valid_unseen", data_dir=str(data_dir), cache_dir=str(cache_dir),
                   reward_scale=10.0, max_steps=4)
    env.reset(options={"task_id": LAMP_GAME})
    for a in ["go to desk 2", "take alarmclock 1 from desk 2", "go to desk 1"]:
        assert env.step(a)[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step("use desklamp 1")
    assert obs == "You turn on the desklamp 1."
    assert (reward, terminated, truncated, info["won"], info["score"]) == (10.0, True, False, True, 1.0)
    with pytest.raises(RuntimeError):
        env.step("look")
    env.reset(options={"task_id": LAMP_GAME})
    outs = [env.step("look")[1:4] for _ in range(4)]
    assert outs == [(0.0, False, False)] * 3 + [(0.0, False, True)]
    env.close()


def test_invalid_and_unnormalised_commands(real_env):
    obs, info = real_env.reset(options={"task_id": LAMP_GAME})
    before = info["admissible_actions"]
    obs, reward, terminated, truncated, info = real_env.step("fly to the moon")
    assert (obs, reward, terminated, truncated) == ("Nothing happens.", 0.0, False, False)
    assert info["admissible_actions"] == before and info["expert_action"] is not None
    obs, *_ = real_env.step("  Go to   SHELF 3 ")
    assert obs.startswith("You arrive at shelf 3.")


def test_check_env(data_dir, cache_dir):
    from gymnasium.utils.env_checker import check_env
    # small task lists keep the resets check_env makes (random tasks) cheap
    for kwargs in ({"split": "valid_unseen", "data_dir": str(data_dir), "task_types": ["look_at_obj_in_light"]},
                   {"split": "gen_unseen", "gen_sizes": 1}):
        env = gym.make(ENV_ID, cache_dir=str(cache_dir), expert=True, expert_type="handcoded", **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
        env.close()


# ---------------------------------------------------------------------------------- generator
def test_generator_floor_plan_split_and_sizes():
    unseen = set(gen.UNSEEN_FLOOR_PLANS)
    ids = {s: gen.list_gen_tasks(s, gen.DEFAULT_GEN_SIZES[s]) for s in gen.GEN_SPLITS}
    assert {s: len(v) for s, v in ids.items()} == {"gen_train": 3000, "gen_seen": 150, "gen_unseen": 150}
    fps = {s: {gen.parse_task_id(t)[1] for t in v} for s, v in ids.items()}
    assert fps["gen_unseen"] == unseen
    assert not (fps["gen_train"] | fps["gen_seen"]) & unseen and len(fps["gen_train"]) == 116
    assert not set(ids["gen_train"]) & set(ids["gen_seen"])
    for s, v in ids.items():
        assert Counter(t.split("/")[0] for t in v) == {t: gen.DEFAULT_GEN_SIZES[s] for t in gen.TASK_TYPES}
        assert {gen.split_of(t) for t in v} == {s}
    # Appendix B of envs.md: floor plans that can host each task type
    assert [len(gen.feasible_floor_plans(t, "gen_train")) + len(gen.feasible_floor_plans(t, "gen_unseen"))
            for t in gen.TASK_TYPES] == [120, 120, 27, 60, 30, 30]


def test_generator_is_deterministic_across_processes():
    tid = "pick_heat_then_place_in_recep/FloorPlan1/0"
    g = gen.generate(*gen.parse_task_id(tid))
    assert g.task_desc == "put a hot plate in fridge"
    assert g.traj_data["pddl_params"]["object_target"] == "Plate"
    digest = hashlib.sha256(json.dumps(g.game, sort_keys=True).encode()).hexdigest()
    assert digest == hashlib.sha256(json.dumps(gen.generate(*gen.parse_task_id(tid)).game, sort_keys=True)
                                    .encode()).hexdigest()
    code = ("import hashlib, json; from agentq.envs.alfworld import generator as g; "
            f"print(hashlib.sha256(json.dumps(g.generate(*g.parse_task_id({tid!r})).game, sort_keys=True)"
            ".encode()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.strip()
    assert out == digest
    assert gen.generate("pick_heat_then_place_in_recep", 1, 1).game != g.game


def test_generator_lamp_always_in_a_holder():
    """Appendix A's pitfall: a lamp outside any receptacle makes look_at unsolvable."""
    for fp in gen.feasible_floor_plans("look_at_obj_in_light", "gen_train"):
        g = gen.generate("look_at_obj_in_light", fp, 0)
        lines = g.game["pddl_problem"].splitlines()
        lamp = [ln.split()[2] for ln in lines if ln.strip().startswith("(inReceptacle DeskLamp")]
        assert len(lamp) == 1 and lamp[0].split("_bar_")[0] in gen._LAMP_HOLDERS, (fp, lamp)


def test_generator_errors_list_valid_choices():
    with pytest.raises(ValueError, match=r"feasible floor plans: \[1, 2, 3"):
        gen.generate("pick_heat_then_place_in_recep", 301, 0)      # a bedroom has no microwave
    with pytest.raises(ValueError, match="pick_and_place_simple"):
        gen.check_task_type("make_coffee")
    with pytest.raises(ValueError, match="gen_train"):
        gym.make(ENV_ID, gen_sizes={"gen_tran": 3})
    with pytest.raises(ValueError, match="valid_unseen"):
        gym.make(ENV_ID, split="valid")
    with pytest.raises(ValueError, match="planner"):
        gym.make(ENV_ID, expert_type="oracle")


def test_generated_game_first_observation_and_cache(gen_env, cache_dir):
    obs, info = gen_env.reset(options={"task_id": GEN_GAME})
    assert obs == GEN_GAME_OBS and info["task"] == "find two spraybottle and put them in toilet."
    assert info["task_type"] == "pick_two_obj_and_place" and info["split"] == "gen_unseen"
    folder = gen.game_dir(cache_dir, GEN_GAME)
    assert json.loads((folder / "traj_data.json").read_text())["pddl_params"]["parent_target"] == "Toilet"
    assert list((cache_dir / "walkthroughs").rglob("*.json"))      # the walkthrough is on disk


def test_planner_walkthrough_wins_every_task_type(gen_env):
    u = gen_env.unwrapped
    ids = bench.per_type_sample(u.list_tasks("gen_unseen"), 1, u.task_type)
    res = bench.expert_eval(gen_env, ids, "gen_unseen")
    assert set(res["per_type"]) == set(gen.TASK_TYPES) and res["won"] == res["n"] == 6, res


def test_planner_expert_recovers_after_off_plan_actions(gen_env):
    obs, info = gen_env.reset(options={"task_id": GEN_GAME})
    rng = random.Random(0)
    for i in range(40):
        action = rng.choice(info["admissible_actions"]) if i < 6 else info["expert_action"]
        obs, reward, terminated, truncated, info = gen_env.step(action)
        if terminated or truncated:
            break
    assert info["won"] and info["steps"] < 30


def test_a_refused_turn_leaves_the_expert_alone(real_env, gen_env):
    """A turn the base class refused (10,001 characters) never reached the engine, but it advanced the
    expert: the handcoded one was fed the previous command again, the planner took it for an off-plan
    move and replanned. Now the expert is not asked, its action stands, and the episode is the plain one."""
    for env, split, task in ((real_env, "valid_unseen", LAMP_GAME), (gen_env, "gen_unseen", GEN_GAME)):
        plain = play_expert(env, task, split)
        _, info = env.reset(options={"task_id": task, "split": split})
        actions = [info["expert_action"]]
        _, _, _, _, info = env.step(actions[0])
        expert, asked = env.unwrapped._expert, []
        real_next = expert.next_action
        expert.next_action = lambda *a: asked.append(a) or real_next(*a)
        try:
            before = info["expert_action"]
            _, _, term, trunc, info = env.step("x" * 10_001)
        finally:
            del expert.next_action
        assert "invalid_action" in info and info["expert_action"] == before and asked == [], split
        while info["expert_action"] is not None and not (term or trunc):
            actions.append(info["expert_action"])
            _, _, term, trunc, info = env.step(actions[-1])
        assert plain["won"] and info["won"] and actions == plain["actions"], split


# ---------------------------------------------------------------------------------- parse cache
def test_parse_cache_gives_identical_outputs(real_env, gen_env):
    assert parse_cache.installed() == {"parse": True, "translation": True}
    for env, split, tid in ((real_env, "valid_unseen", LAMP_GAME), (gen_env, "gen_unseen", GEN_GAME)):
        with parse_cache.disabled():
            ref = bench.record(env, [tid], split, steps=10, seed=7)
        assert parse_cache.installed() == {"parse": True, "translation": True}
        hits = parse_cache.stats()["textgen"]["hits"]
        got = bench.record(env, [tid], split, steps=10, actions=[ref[0]["actions"]])
        assert "fly to the moon" in ref[0]["actions"]
        assert got[0]["obs"] == ref[0]["obs"] and got[0]["admissible"] == ref[0]["admissible"]
        assert parse_cache.stats()["textgen"]["hits"] > hits


def test_a_new_game_lets_the_last_games_interned_logic_objects_go(gen_env, monkeypatch):
    """textworld interns every Proposition it builds, process-wide and for good: each new game added its
    own (a worker grew ~0.85 MB a game). The env lets them go when it loads another game, which changes
    no observation or admissible command (they compare by value)."""
    from agentq.envs.alfworld import interning

    tasks = gen_env.unwrapped.list_tasks("gen_unseen")[:4]
    monkeypatch.setattr(interning, "forget_interned", lambda: 0)         # textworld as it is
    before = interning.interned_count()
    ref = bench.record(gen_env, tasks, "gen_unseen", steps=4, seed=3)
    grown = interning.interned_count() - before
    monkeypatch.undo()
    got = bench.record(gen_env, tasks, "gen_unseen", steps=4, actions=[r["actions"] for r in ref])
    assert [g["obs"] for g in got] == [r["obs"] for r in ref]
    assert [g["admissible"] for g in got] == [r["admissible"] for r in ref]
    assert grown > 1000                                  # four games' objects, kept
    assert interning.interned_count() < grown / 2        # the last game's only


def test_parse_cache_leaves_side_effect_rules_alone():
    import textworld.logic as logic
    memo = logic._parse_and_convert
    assert isinstance(memo, parse_cache._ParseMemo)
    a = logic.Rule.parse_conjunctive_query("atlocation(a:agent, l:location)")
    b = logic.Rule.parse_conjunctive_query("atlocation(a:agent, l:location)")
    assert a.preconditions == b.preconditions and a.preconditions is not b.preconditions
    assert "start" not in memo.rules and "conjunctiveQuery" in memo.rules


# ---------------------------------------------------------------------------------- config
def test_config_makes_a_working_env(cache_dir):
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load((REPO / "conf" / "env" / "alfworld.yaml").read_text())
    twx = yaml.safe_load((REPO / "conf" / "env" / "textworld_express.yaml").read_text())
    assert set(cfg) == set(twx) and set(cfg["prompt"]) == set(twx["prompt"])
    assert cfg["name"] == "alfworld" and cfg["max_steps"] == 50 and cfg["train_split"] == "gen_train"
    kwargs = dict(cfg["kwargs"], cache_dir=str(cache_dir))
    env = agentq.envs.make(cfg["name"], split=cfg["train_split"], max_steps=cfg["max_steps"], expert=False, **kwargs)
    assert env.unwrapped.splits[0] == cfg["train_split"]
    obs, info = env.reset(seed=0)
    text = cfg["prompt"]["first_turn"].format(task=info["task"], obs=obs, actions=cfg["prompt"]["actions"].format(
        actions=", ".join(info["admissible_actions"])))
    assert "Your task is to: " in text and "Admissible actions: go to" in text
    PromptConfig(**cfg["prompt"]).check_fields(info)         # the agent loop's check at reset
    env.close()


# ---------------------------------------------------------------------------------- benchmark
@pytest.mark.slow
def test_benchmark_handcoded_40_valid_unseen_and_planner(data_dir, tmp_path):
    report = bench.main(["--data-dir", str(data_dir), "--cache-dir", str(tmp_path), "--skip", "speed"])
    assert report["handcoded"]["n"] == 40 and report["handcoded"]["success"] >= 0.85, report["handcoded"]
    for split in ("gen_seen", "gen_unseen"):
        assert report["planner"][split]["success"] == 1.0 and report["planner"][split]["n"] == 12



# ---------------------------------------------------------------------------------- held-out selection
def test_eval_num_tasks_30_covers_every_task_type_of_valid_unseen(data_dir, cache_dir):
    from agentq.config import load_config
    from agentq.eval.evaluate import choose_eval_tasks

    over = ["env=alfworld", f"env.kwargs.data_dir={data_dir}", f"env.kwargs.cache_dir={cache_dir}"]
    sel = choose_eval_tasks(load_config(over), "valid_unseen", 30)
    assert sel.method == "stratified" and sel.num_available == 134 and len(sel.tasks) == 30
    assert sorted(sel.per_type) == sorted(gen.TASK_TYPES)
    assert all(chosen >= 1 for chosen, _ in sel.per_type.values()), sel.per_type
    # the first 30 of the type-sorted list (what eval played before) leave types out
    first = choose_eval_tasks(load_config(over + ["eval.selection=first"]), "valid_unseen", 30)
    assert sum(1 for chosen, _ in first.per_type.values() if chosen) < len(gen.TASK_TYPES)


def test_a_stopped_eval_on_alfworlds_default_folder_notices_its_games_changing(data_dir, cache_dir, tmp_path,
                                                                             monkeypatch, tiny_model_dir):
    """With data_dir null and $ALFWORLD_DATA unset, the games come from ~/.cache/alfworld, which
    env.kwargs leaves unnamed: the fingerprint of a stopped `agentq eval` covered no data then, and a
    re-download there resumed it with the old games' episodes. The env now names the split's folder."""
    from agentq.config import load_config
    from agentq.eval.evaluate import choose_eval_tasks, open_partial

    home = tmp_path / "home"
    shutil.copytree(data_dir / "json_2.1.1" / "valid_seen", home / ".cache" / "alfworld" / "json_2.1.1" / "valid_seen")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    cfg = load_config(["env=alfworld", f"env.kwargs.cache_dir={cache_dir}", "device=cpu"])
    assert OmegaConf.select(cfg, "env.kwargs.data_dir") is None         # the default folder is not a setting
    games = home / ".cache" / "alfworld" / "json_2.1.1" / "valid_seen"
    sel = choose_eval_tasks(cfg, "valid_seen", 3)
    assert sel.data_folder == str(games)
    out = tmp_path / "out"
    out.mkdir()

    def key() -> str:
        partial = open_partial(cfg, out, str(tiny_model_dir), sel, ("cpu", "float32"))
        partial.discard()
        return partial.key

    before = key()
    assert key() == before
    game = games / sel.tasks[0] / "traj_data.json"
    game.write_text(game.read_text() + " ")                             # a game rewritten in place
    assert key() != before
    # a generated split reads no files; a given data_dir names that folder's split
    u = gym.make(ENV_ID, split="gen_unseen", cache_dir=str(cache_dir)).unwrapped
    assert u.data_folder("gen_unseen") is None
    assert u.data_folder("valid_seen") == str(games)
    given = gym.make(ENV_ID, split="valid_seen", data_dir=str(data_dir), cache_dir=str(cache_dir)).unwrapped
    assert given.data_folder("valid_seen") == str((data_dir / "json_2.1.1" / "valid_seen").absolute())


# ---------------------------------------------------------------------------------- settings refused in one line
@pytest.mark.parametrize("sizes, where, got", [
    (-3, "gen_sizes", "-3"), (0, "gen_sizes", "0"), (2.5, "gen_sizes", "2.5"), ("abc", "gen_sizes", "'abc'"),
    (True, "gen_sizes", "True"), ({"gen_train": 0}, "gen_sizes['gen_train']", "0"),
    (1_000_001, "gen_sizes", "1000001")])
def test_gen_sizes_that_would_empty_or_overlap_a_split_are_refused(sizes, where, got):
    """gen_sizes=-3 or 0 made gen_train empty (a RuntimeError at the first reset), 2.5 a TypeError
    ('float' object is not iterable), "abc" an 'unknown split(s) ['a', 'b', 'c']' message."""
    with pytest.raises(ValueError) as e:
        gen.gen_sizes(sizes)
    assert str(e.value).startswith(f"{where} must be an int from 1 to 1000000 (games per task type), got {got};")
    assert gen.gen_sizes(5) == {"gen_train": 5, "gen_seen": 5, "gen_unseen": 5}
    assert gen.gen_sizes({"gen_seen": 2}) == {"gen_train": 500, "gen_seen": 2, "gen_unseen": 25}
    assert len(gen.list_gen_tasks("gen_train", gen.gen_sizes(5)["gen_train"])) == 30


@pytest.mark.parametrize("scale", ["abc", 0, -1.0, float("nan"), float("inf"), True])
def test_reward_scale_must_be_a_positive_number(scale, cache_dir):
    """reward_scale='abc' was "could not convert string to float: 'abc'", naming no setting; 0 or a
    negative scale was accepted (a win then rewarded nothing, or was punished)."""
    with pytest.raises(ValueError, match=r"^reward_scale must be a positive finite number \(the reward of a win; "):
        gym.make(ENV_ID, cache_dir=str(cache_dir), reward_scale=scale)


def _eval_refusal(tmp_path, overrides: list[str]) -> str:
    """`agentq eval`'s one-line refusal (its ConfigError) for these overrides, before a model loads."""
    from agentq.config import ConfigError, load_config
    from agentq.eval.evaluate import evaluate

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    cfg = load_config(["env=alfworld", f"checkpoint={ckpt}", "device=cpu", f"eval.out_dir={tmp_path / 'out'}",
                       *overrides])
    with pytest.raises(ConfigError) as e:
        evaluate(cfg)
    assert not (tmp_path / "out").exists()
    return str(e.value)


def test_missing_data_is_one_line_in_agentq_eval(tmp_path, cache_dir, monkeypatch):
    """A missing data folder ended `agentq eval env=alfworld` with a traceback (ALFWorldDataError was
    a FileNotFoundError only; eval reports the env's ValueErrors as one line)."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    assert issubclass(ALFWorldDataError, ValueError) and issubclass(ALFWorldDataError, FileNotFoundError)
    msg = _eval_refusal(tmp_path, [f"env.kwargs.cache_dir={cache_dir}"])
    # a refusal of the split (`SplitRefused`): the line starts with the key that gave it, not the env
    assert msg.startswith("split='valid_unseen': ALFWorld split 'valid_unseen' not found: "
                          f"{tmp_path / 'nowhere' / 'json_2.1.1' / 'valid_unseen'} does not exist")
    assert "\n" not in msg and "alfworld-download" in msg
    # the way out without a download is the split to give that key, not only the generated splits' names
    assert msg.endswith("which needs no download: gen_unseen in place of valid_unseen.")


def test_missing_data_under_agentq_eval_split_names_the_key_it_reads(tmp_path, cache_dir, monkeypatch):
    """`agentq eval split=valid_seen` without the games said to set env.eval_split=gen_seen, which that
    command does not read (split= gives its split): the env cannot know the key, so its hint names the
    generated split only and agentq's line starts with the key."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    msg = _eval_refusal(tmp_path, [f"env.kwargs.cache_dir={cache_dir}", "split=valid_seen"])
    assert msg.startswith("split='valid_seen': ALFWorld split 'valid_seen' not found: ")
    assert msg.endswith("which needs no download: gen_seen in place of valid_seen.")
    assert "env.eval_split" not in msg and "env.train_split" not in msg


@pytest.mark.parametrize("split, generated", [("valid_unseen", "gen_unseen"), ("valid_seen", "gen_seen"),
                                              ("valid_train", "gen_seen"), ("train", "gen_train")])
def test_missing_data_names_the_generated_split_that_stands_in(tmp_path, cache_dir, monkeypatch, split, generated):
    """The error named the generated splits, but not the one that plays in place of `split`; it names
    no setting (it named env.eval_split, which `agentq eval split=...` does not read)."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(ALFWorldDataError) as e:
        gym.make(ENV_ID, split=split, cache_dir=str(cache_dir))
    assert isinstance(e.value, SplitRefused)
    assert str(e.value).endswith(f"(gen_train, gen_seen or gen_unseen), which needs no download: {generated} "
                                 f"in place of {split}.")
    assert "env." not in str(e.value)


@pytest.mark.parametrize("split", ["gen_seen", "valid_seen"])
@pytest.mark.parametrize("override, said", [("env.kwargs.task_types=[bogus]", "unknown ALFWorld task type 'bogus'"),
                                            ("env.kwargs.expert_type=x", "unknown expert_type 'x'")])
def test_a_refusal_of_the_envs_settings_does_not_blame_the_split_in_agentq_eval(tmp_path, cache_dir, data_dir,
                                                                                 split, override, said):
    """`agentq eval split=valid_seen` with a bad env.kwargs value said "split='valid_seen': env=alfworld:
    ...", as if the split were at fault: it put the split's key before every refusal of the env's."""
    msg = _eval_refusal(tmp_path, [f"env.kwargs.cache_dir={cache_dir}", f"env.kwargs.data_dir={data_dir}",
                                   f"split={split}", override])
    assert msg.startswith(f"env=alfworld: {said}") and "split=" not in msg, msg


def test_empty_task_types_is_refused(cache_dir):
    """task_types=[] silently kept all six types (as null does)."""
    with pytest.raises(ValueError, match=r"^task_types is empty; give null \(all six\) or some of \['pick_and_place_simple'"):
        gym.make(ENV_ID, cache_dir=str(cache_dir), task_types=[])
    env = gym.make(ENV_ID, cache_dir=str(cache_dir), task_types="look_at_obj_in_light", gen_sizes=2)
    assert env.unwrapped.list_tasks() == ["look_at_obj_in_light/FloorPlan205/0", "look_at_obj_in_light/FloorPlan210/0"]
    assert len(gym.make(ENV_ID, cache_dir=str(cache_dir), task_types=None, gen_sizes=2).unwrapped.list_tasks()) == 12


def test_the_data_roots_source_is_the_users_setting_not_alfworlds_own(monkeypatch, tmp_path):
    """`import alfworld` sets $ALFWORLD_DATA to its default when unset, and the missing-data error then
    said the default came "from $ALFWORLD_DATA" (`agentq eval`, importing later, said it right)."""
    from pathlib import Path

    from agentq.envs.alfworld.data import data_root

    default = Path("~/.cache/alfworld").expanduser()
    monkeypatch.setenv("ALFWORLD_DATA", str(default))
    assert data_root() == (default, "alfworld's default (ALFWORLD_DATA unset, or set to it)")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    assert data_root() == (tmp_path, "$ALFWORLD_DATA")
    monkeypatch.delenv("ALFWORLD_DATA")
    assert data_root() == (default, "alfworld's default (ALFWORLD_DATA unset, or set to it)")
    assert data_root(tmp_path / "x") == (tmp_path / "x", "data_dir argument")
    # agentq's config copies $ALFWORLD_DATA into env.kwargs.data_dir: that data_dir came from the variable
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    assert data_root(str(tmp_path.absolute())) == (tmp_path, "$ALFWORLD_DATA")
    assert data_root(tmp_path / "x") == (tmp_path / "x", "data_dir argument")


def test_missing_data_from_alfworld_data_names_the_variable_in_agentq_eval(tmp_path, cache_dir, monkeypatch):
    """ALFWORLD_DATA=/nonexistent said "root /nonexistent from data_dir argument": the config copies the
    variable into env.kwargs.data_dir, a setting the user never gave."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    msg = _eval_refusal(tmp_path, [f"env.kwargs.cache_dir={cache_dir}"])
    assert f"(root {tmp_path / 'nowhere'} from $ALFWORLD_DATA; splits present there: none)" in msg, msg
    (tmp_path / "again").mkdir()
    msg = _eval_refusal(tmp_path / "again", [f"env.kwargs.cache_dir={cache_dir}",
                                             f"env.kwargs.data_dir={tmp_path / 'elsewhere'}"])
    assert f"(root {tmp_path / 'elsewhere'} from data_dir argument; splits present there: none)" in msg, msg


def test_an_empty_alfworld_data_is_unset(cache_dir):
    """ALFWORLD_DATA= (set but empty) ended `agentq eval split=gen_unseen` with `FileNotFoundError: ''` from
    inside `import alfworld`; agentq reads it as unset, and a generated split needs no data."""
    code = ("import os, gymnasium as gym, agentq.envs; "
            f"env = gym.make('agentq/ALFWorld-v0', split='gen_unseen', cache_dir={str(cache_dir)!r}); "
            "obs, info = env.reset(); print(obs.splitlines()[0]); print(os.environ['ALFWORLD_DATA'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "ALFWORLD_DATA": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["-= Welcome to TextWorld, ALFRED! =-", str(Path("~/.cache/alfworld").expanduser())]


def _one_game_tree(data_dir: Path, root: Path) -> Path:
    """A copy of valid_unseen under `root` holding the lamp game only; its folder."""
    import shutil

    folder = root / "json_2.1.1" / "valid_unseen" / LAMP_GAME
    shutil.copytree(data_dir / "json_2.1.1" / "valid_unseen" / LAMP_GAME, folder)
    return folder


def test_a_damaged_game_file_is_named(data_dir, cache_dir, tmp_path):
    """One damaged game file failed the whole split with "Expecting value: line 1 column 1 (char 0)",
    naming no file."""
    from agentq.envs.alfworld.data import ALFWorldGameError

    folder = _one_game_tree(data_dir, tmp_path / "data")
    env = gym.make(ENV_ID, split="valid_unseen", data_dir=str(tmp_path / "data"), cache_dir=str(cache_dir))
    assert env.unwrapped.list_tasks() == [LAMP_GAME]
    (folder / "traj_data.json").write_text("garbage")            # read when the game loads
    with pytest.raises(ALFWorldGameError, match=rf"^ALFWorld game file {folder}/traj_data.json is damaged "):
        env.reset(options={"task_id": LAMP_GAME})
    (folder / "game.tw-pddl").write_text("garbage")               # read when the split is listed
    want = (f"ALFWorld game file {folder / 'game.tw-pddl'} is damaged (Expecting value: line 1 column 1 (char 0)): "
            "unpack the archive again (or run `alfworld-download`)")
    fresh = gym.make(ENV_ID, split="valid_unseen", data_dir=str(tmp_path / "data"), cache_dir=str(cache_dir))
    with pytest.raises(ALFWorldGameError) as e:
        fresh.unwrapped.list_tasks()
    assert isinstance(e.value, SplitRefused) and str(e.value) == want
    msg = _eval_refusal(tmp_path, [f"env.kwargs.cache_dir={cache_dir}", f"env.kwargs.data_dir={tmp_path / 'data'}"])
    assert msg == f"split='valid_unseen': {want}"
    (folder / "game.tw-pddl").write_text("[]")
    with pytest.raises(ALFWorldGameError, match=r"is damaged \(a JSON list, not an object\): unpack the archive"):
        fresh.unwrapped.list_tasks("valid_unseen")


@pytest.mark.parametrize("split", ["gen_unseeen", "valid_unseen"])
def test_alfworld_prepare_refuses_a_split_in_one_line(split, tmp_path, cache_dir, capsys, monkeypatch):
    """`python -m agentq.eval.alfworld_prepare --split gen_unseeen` (or a real split without its games)
    ended with a traceback; it ends as the agentq commands do on bad input: one line, exit status 2."""
    from agentq.eval import alfworld_prepare

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit) as e:
        alfworld_prepare.main(["--split", split, "--cache-dir", str(cache_dir)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    if split == "gen_unseeen":
        assert err == ("alfworld_prepare: --split gen_unseeen: unknown split 'gen_unseeen' for ALFWorldEnv; valid: "
                       "['gen_train', 'gen_seen', 'gen_unseen', 'valid_seen', 'valid_unseen', 'valid_train', 'train']\n")
    else:
        assert err.startswith("alfworld_prepare: --split valid_unseen: ALFWorld split 'valid_unseen' not found: "
                              f"{tmp_path / 'nowhere' / 'json_2.1.1' / 'valid_unseen'} does not exist (root "
                              f"{tmp_path / 'nowhere'} from $ALFWORLD_DATA; ")
