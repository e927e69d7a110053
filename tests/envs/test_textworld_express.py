"""TextWorldExpress on the env contract (the template every environment follows)."""
import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agentq.envs as envs
from agentq.envs.textworld_express import TextWorldExpressEnv


def make(**kw):
    return gym.make("agentq/TextWorldExpress-v0", games=["coin"], game_params={"coin": "numLocations=2"}, **kw)


def test_check_env_passes():
    env = make()
    check_env(env.unwrapped)
    env.close()


def test_info_contract_and_gold_path_wins():
    env = make(expert=True, split="test")
    obs, info = env.reset(seed=0, options={"task_id": "coin/20005"})
    assert {"task", "task_id", "split", "admissible_actions", "won", "score", "expert_action"} <= set(info)
    assert info["task_id"] == "coin/20005" and info["split"] == "test" and info["task"].startswith("Your task is")
    assert "look around" in info["admissible_actions"]
    total, steps = 0.0, 0
    while True:
        obs, r, term, trunc, info = env.step(info["expert_action"])
        total, steps = total + r, steps + 1
        if term or trunc:
            break
    assert term and not trunc and info["won"] and info["score"] == 1.0 and total == 1.0
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("look around")


def expert_episode(env, task_id):
    obs, info = env.reset(options={"task_id": task_id})
    actions = []
    while True:
        actions.append(info["expert_action"])
        obs, r, term, trunc, info = env.step(actions[-1])
        if term or trunc:
            return actions, info["won"]


def test_expert_path_has_no_detours_and_is_the_same_on_every_reset():
    # TWX's own gold path for this task is a random walk (e.g. look around, move north, move south,
    # move east, take coin) that changes between resets; the coin is one room east.
    env = gym.make("agentq/TextWorldExpress-v0", games=["coin"], expert=True, split="train",
                   game_params={"coin": "numLocations=3,includeDoors=0,numDistractorItems=0"})
    for _ in range(5):
        assert expert_episode(env, "coin/159") == (["move east", "take coin"], True)
    env.close()


def test_expert_with_doors_still_wins():
    # paths with doors to open: erasing loops must keep the openings the path needs (checked by replay)
    env = gym.make("agentq/TextWorldExpress-v0", games=["coin"], expert=True, split="dev",
                   game_params={"coin": "numLocations=6,includeDoors=1"})
    episodes = [expert_episode(env, task) for task in env.unwrapped.list_tasks("dev")[:10]]
    assert all(won for _, won in episodes)
    assert sum(any(a.startswith("open door") for a in actions) for actions, _ in episodes) >= 5
    env.close()


#: twc test tasks whose gold paths hold capitals ("take box of Q-tips"): the engine matches its valid
#: actions exactly, and the wrapper lower-cased every action, so the expert lost each of them
TWC_CAPITALS = ["twc/20001", "twc/20003", "twc/20004", "twc/20005", "twc/20007", "twc/20013"]


def test_the_expert_wins_twc_tasks_whose_actions_have_capitals():
    env = gym.make("agentq/TextWorldExpress-v0", games=["twc"], split="test", max_steps=100, expert=True)
    for task in TWC_CAPITALS:
        actions, won = expert_episode(env, task)
        assert won and any(a != a.lower() for a in actions), (task, actions)
    env.close()


def test_actions_are_matched_to_the_engines_spelling_whatever_their_case():
    """An action equal to a valid one but for case is sent in the engine's spelling (both ways: the
    lower-case games the default run plays, twc's "Q-tips"); other text is lower-cased as before."""
    env = gym.make("agentq/TextWorldExpress-v0", games=["coin", "twc"], split="train",
                   game_params={"coin": "numLocations=3,includeDoors=0,numDistractorItems=0"})
    env.reset(options={"task_id": "coin/159"})                  # the coin is one room east
    assert env.step("  Move EAST ")[0].startswith("You are in the")
    obs, r, term, trunc, info = env.step("Take Coin")
    assert (r, term, info["won"]) == (1.0, True, True)
    env.reset(options={"task_id": "twc/20001", "split": "test"})
    assert env.step("TAKE BOX OF Q-TIPS")[0] == "You take the box of Q-tips."
    assert env.step("Dance Wildly")[0].startswith("Unknown action")
    assert env.step("HELP")[0].startswith("Your task is")          # TWX's "help", as before
    env.close()


def test_a_refused_turn_does_not_advance_the_expert():
    """The gold path was indexed by the turn count, which counts a turn the base class refused (the
    engine never saw it): the expert then skipped a gold action and lost."""
    env = gym.make("agentq/TextWorldExpress-v0", games=["coin"], expert=True, split="train",
                   game_params={"coin": "numLocations=3,includeDoors=0,numDistractorItems=0"})
    obs, info = env.reset(options={"task_id": "coin/159"})
    assert info["expert_action"] == "move east"
    obs, r, term, trunc, info = env.step("x" * 10_001)
    assert "invalid_action" in info and info["expert_action"] == "move east"
    actions = []
    while not (term or trunc):
        actions.append(info["expert_action"])
        obs, r, term, trunc, info = env.step(actions[-1])
    assert actions == ["move east", "take coin"] and info["won"]
    env.close()


def test_steps_work_after_a_first_reset_that_raised():
    """gym.make wrapped agentq's envs in Gymnasium 1.4's passive env checker, which, once the first
    reset raised (an unknown task id), broke every later step ("cannot unpack non-iterable NoneType
    object") after stepping the engine. agentq's registrations leave the checker out."""
    env = make()
    with pytest.raises(envs.UnknownTaskError):
        env.reset(options={"task_id": "coin/nope"})
    env.reset(options={"task_id": "coin/3"})
    assert all(env.step("look around")[0].startswith("You are in") for _ in range(2))
    env.close()


@pytest.mark.parametrize("n", [-1, 0, 2.5, True, "3"])
def test_tasks_per_game_must_be_a_positive_int(n):
    """-1 kept 999 of a fold's 1,000 seeds (slicing), 0 an empty split."""
    with pytest.raises(ValueError) as e:
        make(tasks_per_game=n)
    assert str(e.value) == (f"tasks_per_game must be an int >= 1 (or None for all of a fold's seeds), got "
                            f"{type(n).__name__} ({n!r})")
    assert len(make(tasks_per_game=2).unwrapped.list_tasks("dev")) == 2


@pytest.mark.parametrize("kwargs, said", [
    ({"game_params": {"cion": "numLocations=2"}},
     "game_params names ['cion'], not in games ['coin']; its keys must be games played (a key of another game "
     "would never be used; after env.kwargs.games=[...] on the command line, remove the others' with "
     "~env.kwargs.game_params.cion, or take a config of that game, e.g. env=textworld_express_mapreader)"),
    ({"game_params": {"coin": 3}},
     "game_params['coin'] must be a str of TextWorldExpress's gameParams (e.g. 'numLocations=3,includeDoors=0'; "
     "'' for the engine's defaults), got int (3)"),
    ({"game_params": "numLocations=2"},
     "game_params must be a dict {game: gameParams str} or None, got str ('numLocations=2')"),
    ({"games": ["coin", "mapreader", "coin"]},
     "games names ['coin'] more than once (['coin', 'mapreader', 'coin']); name each game once"),
    ({"call_timeout_s": 0}, "call_timeout_s must be a finite number > 0, got int (0)"),
    ({"call_timeout_s": float("inf")}, "call_timeout_s must be a finite number > 0, got float (inf)"),
    ({"call_timeout_s": True}, "call_timeout_s must be a finite number > 0, got bool (True)"),
])
def test_bad_games_params_and_timeouts_are_refused_at_construction(kwargs, said):
    """A game_params key of no game played (a typo, "cion") silently played the engine's default coin; an int
    value made the engine's call fail and killed the shared JVM as hung; a game named twice was refused only
    at the first list_tasks."""
    with pytest.raises(ValueError) as e:
        gym.make("agentq/TextWorldExpress-v0", **{"games": ["coin"], **kwargs})
    assert str(e.value) == said


def test_games_without_params_play_the_engines_defaults():
    env = gym.make("agentq/TextWorldExpress-v0", games=["coin", "mapreader"], game_params={"coin": "numLocations=2"},
                   call_timeout_s=7.5).unwrapped
    assert env.game_params == {"coin": "numLocations=2", "mapreader": ""} and env.call_timeout_s == 7.5
    assert TextWorldExpressEnv(game_params=None).game_params == {"coin": ""}


def test_a_step_before_the_first_reset():
    """gym.make's order-enforcing wrapper refuses it with Gymnasium's error; the bare class with EpisodeOverError."""
    with pytest.raises(gym.error.ResetNeeded):
        make().step("look around")
    with pytest.raises(envs.EpisodeOverError, match="call reset\\(\\) first"):
        TextWorldExpressEnv().step("look around")


def test_step_cap_truncates_and_is_never_a_win():
    env = make(max_steps=3)
    env.reset(seed=0, options={"task_id": "coin/7"})
    outs = [env.step("inventory") for _ in range(3)]
    assert [o[3] for o in outs] == [False, False, True] and not any(o[2] for o in outs)
    assert not outs[-1][4]["won"]


def test_invalid_action_is_a_handled_turn():
    env = make()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("dance wildly")
    assert r == 0.0 and not term and not trunc and "Unknown action" in obs


def test_splits_are_stable_and_disjoint():
    env = make().unwrapped
    train, dev, test = (env.list_tasks(s) for s in ("train", "dev", "test"))
    assert len(train) == len(dev) == len(test) == 1000
    assert train[:2] == ["coin/0", "coin/1"] and test[0] == "coin/20000"
    assert not (set(train) & set(test)) and not (set(dev) & set(test))
    with pytest.raises(envs.UnknownTaskError, match="unknown task_id"):
        env.reset(options={"task_id": "coin/20000", "split": "train"})
    with pytest.raises(ValueError, match="valid: \\['train', 'dev', 'test'\\]"):
        env.list_tasks("validation")


def test_unknown_env_ids_list_the_valid_choices():
    with pytest.raises(gym.error.NameNotFound, match="valid names: \\['alfworld', 'scienceworld', 'textworld_express', 'webshop'\\]"):
        envs.make("alfworl")
    with pytest.raises(ValueError, match="unknown TextWorldExpress game"):
        gym.make("agentq/TextWorldExpress-v0", games=["chess"])
    with pytest.raises(ValueError, match="games is empty; name one or more of \\['cookingworld'"):
        gym.make("agentq/TextWorldExpress-v0", games=[])        # (not an IndexError at the first reset)


def test_envs_in_one_process_share_one_jvm_and_stay_independent():
    a, b = make(expert=True).unwrapped, make(expert=True).unwrapped
    a.reset(options={"task_id": "coin/3"})
    b.reset(options={"task_id": "coin/4"})
    assert a._env._gateway is b._env._gateway and a._env.server != b._env.server
    obs_a, *_ = a.step("look around")
    obs_b, *_ = b.step("look around")
    fresh = make().unwrapped
    fresh.reset(options={"task_id": "coin/3"})
    assert fresh.step("look around")[0] == obs_a
    a.close(), b.close(), fresh.close()


def test_a_dead_jvm_is_an_env_crash_and_the_next_reset_recovers():
    env = make().unwrapped
    env.reset(options={"task_id": "coin/3"})
    env._env._gateway.java_process.kill()
    env._env._gateway.java_process.wait()
    with pytest.raises(envs.EnvCrashedError, match="JVM died"):
        env.step("look around")
    # the crash ended the episode: a further step is refused, never answered by a fresh JVM (which
    # would "step" a game it never loaded and end it as a silent loss) ...
    with pytest.raises(envs.EpisodeOverError, match="\\(lost: its last step raised EnvCrashedError\\)"):
        env.step("take coin")
    # ... and the engine itself starts no JVM mid-episode either
    with pytest.raises(envs.EnvCrashedError, match="no engine for this episode"):
        env._step_task("take coin")
    assert env._env is None
    obs, info = env.reset(options={"task_id": "coin/3"})
    assert info["task_id"] == "coin/3" and env.step("look around")[0]
    env.close()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in "Tt"


def test_a_hung_jvm_is_detected_within_one_call_timeout():
    """py4j's auto_field made the first use of each Java method a field lookup and then the call, each
    with its own read timeout: a SIGSTOPped JVM took 2x call_timeout_s to be declared hung."""
    import os
    import signal
    import time

    first, own = make().unwrapped, make(call_timeout_s=3.0).unwrapped
    first.reset(options={"task_id": "coin/3"})
    own.reset(options={"task_id": "coin/4"})          # its own py4j client (a timeout unlike the first's)
    jvm = first._env._gateway.java_process
    os.kill(jvm.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while not _stopped(jvm.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(envs.EnvCrashedError, match="stopped answering \\(call_timeout_s=3\\)"):
            own.step("look around")
        assert time.monotonic() - t0 < 4.5
    finally:
        try:
            os.kill(jvm.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    jvm.wait(timeout=30)                              # killed as hung
    first.close(), own.close()


def _in_forked_child(parent_env, conn):
    """What a forked child sees of its parent's env, and of an env of its own (sent to the parent)."""
    import gc

    out = {}
    try:
        try:
            parent_env.step("look around")
            out["inherited_step"] = "answered"
        except envs.EnvCrashedError:
            out["inherited_step"] = "EnvCrashedError"
        parent_env.close()                    # the parent's JVM is not this process's to stop
        gc.collect()
        own = make().unwrapped
        own.reset(options={"task_id": "coin/3"})
        out["jvm_pid"] = own._env._gateway.java_process.pid
        out["obs"] = own.step("look around")[0]
        own.close()
    except Exception as e:                    # reported to the parent, which fails the test
        out["error"] = repr(e)
    conn.send(out)


def test_a_forked_child_starts_its_own_jvm_and_leaves_the_parents_alone():
    """gymnasium's AsyncVectorEnv forks on Linux: a child must not talk to its parent's JVM over the
    inherited py4j sockets (replies would cross), nor stop it; its envs start a JVM of their own."""
    import multiprocessing as mp

    env = make().unwrapped
    env.reset(options={"task_id": "coin/3"})
    parent_jvm = env._env._gateway.java_process
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_in_forked_child, args=(env, send))
    child.start()
    assert recv.poll(180), "the forked child did not answer"
    out = recv.recv()
    child.join(60)
    assert child.exitcode == 0 and "error" not in out, out
    assert out["inherited_step"] == "EnvCrashedError"
    assert out["jvm_pid"] != parent_jvm.pid and out["obs"].startswith("You are in")
    assert parent_jvm.poll() is None                                 # the parent's JVM still runs ...
    assert env.step("look around")[0].startswith("You are in")      # ... and answers its env
    env.close()


def test_engines_outliving_their_jvm_do_not_reach_for_it(caplog):
    """Once the JVM is killed, or stopped by the last close, collecting an engine or its JavaObjects
    must not open sockets to the dead port: py4j logs each refusal as an ERROR traceback from inside
    the garbage collector (on CPython 3.11 that broke an unrelated `ast.parse` in a later test)."""
    import gc
    import logging

    caplog.set_level(logging.DEBUG, logger="py4j")
    env = make().unwrapped
    env.reset(options={"task_id": "coin/3"})
    kept = [env._env, env._env.server]
    env._env._gateway.java_process.kill()
    env._env._gateway.java_process.wait()
    with pytest.raises(envs.EnvCrashedError, match="JVM died"):
        env.step("look around")
    caplog.clear()
    env.reset(options={"task_id": "coin/3"})            # a new JVM; the dead one's engine is released
    kept += [env._env, env._env.server]
    env.close()                                         # the last close stops the new JVM
    kept[-2]._gateway.java_process.wait(timeout=30)
    kept.clear()
    gc.collect()
    errors = [r.getMessage() for r in caplog.records if r.name.startswith("py4j") and r.levelno >= logging.ERROR]
    assert errors == []


def test_an_engine_with_a_client_of_its_own_does_not_reach_for_its_stopped_jvm(caplog):
    """An env whose call_timeout_s is not the JVM starter's talks through a py4j client of its own
    (`_client_with_timeout`). py4j's close() leaves a client connected, so the Java objects it made,
    collected after the last env stopped the JVM, each logged a refused connection as a py4j ERROR
    (seen from a later ScienceWorld test's garbage collection)."""
    import gc
    import logging

    caplog.set_level(logging.DEBUG, logger="py4j")
    first, own = make().unwrapped, make(call_timeout_s=7.0).unwrapped
    first.reset(options={"task_id": "coin/3"})
    own.reset(options={"task_id": "coin/4"})
    assert own._env._agentq_own_client and not first._env._agentq_own_client
    kept, jvm = [own._env, own._env.server], first._env._gateway.java_process
    own.close()
    first.close()                                       # the last close stops the JVM
    jvm.wait(timeout=30)
    caplog.clear()
    kept.clear()
    gc.collect()
    errors = [r.getMessage() for r in caplog.records if r.name.startswith("py4j") and r.levelno >= logging.ERROR]
    assert errors == []


def _first_reset(env_vars: dict) -> str:
    from jvm_procs import first_reset

    return first_reset("agentq/TextWorldExpress-v0", dict(games=["coin"], call_timeout_s=5), env_vars)


def test_a_jvm_that_never_prints_its_port_times_out_at_start():
    """A real JVM suspended before `main` by a debug agent in JAVA_TOOL_OPTIONS (JDWP, suspend=y,
    quiet) never prints its port: reset() raises TimeoutError within call_timeout_s, naming the
    setting, and the JVM is killed (py4j's launch_gateway waited in readline() forever)."""
    from jvm_procs import SUSPEND_AT_START, check_start_timed_out, kill_marked_jvms, new_marker

    marker = new_marker()
    try:
        out = _first_reset({"JAVA_TOOL_OPTIONS": f"{SUSPEND_AT_START} -D{marker}"})
    finally:
        leaked = kill_marked_jvms(marker)
    check_start_timed_out(out, marker, leaked)


def test_missing_java_is_a_clear_error(tmp_path):
    out = _first_reset({"PATH": str(tmp_path), "JAVA_HOME": ""})
    assert "RuntimeError after" in out and "TextWorldExpress needs Java (>= 8" in out, out


def test_mapreader_config_has_a_real_horizon():
    """conf/env/textworld_express_mapreader.yaml (the sweep's task): the expert wins every one of the
    first 10 train tasks in 4–6 turns (a way to the coin and a way back), within the step cap."""
    from omegaconf import OmegaConf

    from agentq.config import load_config

    cfg = load_config(["env=textworld_express_mapreader"])
    env = gym.make("agentq/TextWorldExpress-v0", split="train", max_steps=int(cfg.env.max_steps), expert=True,
                   **OmegaConf.to_container(cfg.env.kwargs))
    turns = []
    for task in env.unwrapped.list_tasks("train")[:10]:
        _, info = env.reset(options={"task_id": task})
        for n in range(1, int(cfg.env.max_steps) + 1):
            _, _, term, trunc, info = env.step(info["expert_action"])
            if term or trunc:
                break
        assert info["won"], task
        turns.append(n)
    env.close()
    assert min(turns) >= 4 and max(turns) <= 6 and sum(turns) / len(turns) > 4.2
