"""agentq/ScienceWorld-v0 on the real simulator (scienceworld 1.2.3 + Java): no mocks.

The unmarked tests share one JVM and take ~30-60 s on 2 cores; `-m slow` adds the gold paths of
all 30 tasks and an 8-env memory run (minutes).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from proc_watch import gone

pytest.importorskip("scienceworld")

import agentq.envs  # noqa: E402,F401  (registers agentq/* ids)
from agentq.agent import PromptConfig  # noqa: E402
from agentq.envs import EnvCrashedError, EpisodeOverError, UnknownTaskError  # noqa: E402
from agentq.envs.scienceworld import ScienceWorldEnv, resolve_tasks, select_tasks  # noqa: E402
from agentq.envs.scienceworld import tasks as T  # noqa: E402

ENV_ID = "agentq/ScienceWorld-v0"


def _rss_mb(pid="self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _play(env, actions):
    """Step through `actions` until the episode ends; returns (rewards, last info, terminated, truncated)."""
    rewards, info, term, trunc = [], {}, False, False
    for a in actions:
        _, r, term, trunc, info = env.step(a)
        rewards.append(r)
        if term or trunc:
            break
    return rewards, info, term, trunc


@pytest.fixture(scope="module")
def env():
    e = gym.make(ENV_ID, split="test")
    yield e
    e.close()


# ---------------------------------------------------------------------- no JVM needed
def test_task_selectors_and_errors():
    assert len(resolve_tasks(None)) == 30
    assert [t.name for t in resolve_tasks("5-x")] == ["grow-plant", "grow-fruit"]
    assert [t.num for t in resolve_tasks(["boil", "10-2", "4"])] == ["1-1", "4-1", "4-2", "4-3", "4-4", "10-2"]
    agentgym = select_tasks(exclude=["5-x", "9-x", "10-x"])
    assert len(agentgym) == 23 and not {t.family for t in agentgym} & {"5", "9", "10"}
    with pytest.raises(ValueError, match="unknown ScienceWorld task selector 'boiling'.*1-1 boil"):
        resolve_tasks(["boiling"])
    with pytest.raises(ValueError, match="no ScienceWorld task left"):
        select_tasks("1-1", exclude="1-x")
    assert T.parse_simplifications("easy") == "noElectricalAction,openDoors,selfWateringFlowerPots,teleportAction"
    assert T.parse_simplifications(["openDoors", "easy", "openContainers"]).count("openDoors") == 1
    with pytest.raises(ValueError, match="valid: .*teleportAction"):
        T.parse_simplifications("teleport")
    power = T.task_by_name()["power-component"]
    assert T.simplifications_for(power, "noElectricalAction,openDoors") == "openDoors"
    with pytest.raises(ValueError, match="expected '<task name>/<variation>'"):
        T.parse_task_id("boil")
    with pytest.raises(ValueError, match="unknown ScienceWorld task selector"):
        ScienceWorldEnv(tasks=["nope"])
    with pytest.raises(ValueError, match="variations_per_task"):
        ScienceWorldEnv(variations_per_task=0)


@pytest.mark.parametrize("kwargs, said", [
    ({"jvm_opts": "-Xss4m"}, "jvm_opts must be a list of JVM options, one str each (e.g. ['-Xss4m']), got str "
                             "('-Xss4m')"),
    ({"jvm_opts": ["-Xss4m", 4]}, "jvm_opts must be a list of JVM options, one str each (e.g. ['-Xss4m']), got "
                                  "list (['-Xss4m', 4])"),
    ({"call_timeout_s": 0}, "call_timeout_s must be a finite number > 0, got int (0)"),
    ({"call_timeout_s": -1.5}, "call_timeout_s must be a finite number > 0, got float (-1.5)"),
    ({"call_timeout_s": float("inf")}, "call_timeout_s must be a finite number > 0, got float (inf)"),
    ({"call_timeout_s": "60"}, "call_timeout_s must be a finite number > 0, got str ('60')"),
    ({"variations_per_task": 2.7}, "variations_per_task must be an int >= 1 (or None for all of a task's "
                                   "variations), got float (2.7)"),
    ({"variations_per_task": True}, "variations_per_task must be an int >= 1 (or None for all of a task's "
                                    "variations), got bool (True)"),
])
def test_bad_jvm_and_variation_arguments_are_refused_at_construction(kwargs, said):
    """jvm_opts="-Xss4m" (YAML's `jvm_opts: -Xss4m`) became one JVM option per character and the JVM
    failed at the first reset; call_timeout_s=0 timed the JVM out at once there; variations_per_task
    2.7 kept 2 variations and True 1."""
    with pytest.raises(ValueError) as e:
        ScienceWorldEnv(**kwargs)
    assert str(e.value) == said


def test_good_jvm_and_variation_arguments_still_pass():
    import numpy as np

    e = ScienceWorldEnv(jvm_opts=["-Xss4m"], call_timeout_s=5, variations_per_task=np.int64(2))
    assert (e.jvm_opts, e.call_timeout_s, e.variations_per_task) == (("-Xss4m",), 5.0, 2)
    assert ScienceWorldEnv(jvm_opts=(), variations_per_task=None).jvm_opts == ()


def test_the_jvm_call_limit_is_under_the_pools_in_code_and_in_the_configs():
    """ScienceWorld's handler for a hung JVM (restart the JVM, name the call) must fire before the env
    pool kills the whole worker: its default limit sits below the pool's, and the configs say the same."""
    import inspect

    from agentq.envs.scienceworld import jvm
    from agentq.pool import base as pool_base
    from agentq.pool.process import ProcessPool
    from agentq.pool.ray_pool import RayPool

    assert jvm.CALL_TIMEOUT_S == 100.0 < pool_base.CALL_TIMEOUT_S == 120.0
    defaults = [inspect.signature(f).parameters["call_timeout_s"].default
                for f in (ScienceWorldEnv.__init__, jvm.JVMHost.__init__, jvm.JVMHost.get)]
    assert defaults == [jvm.CALL_TIMEOUT_S] * 3
    assert [inspect.signature(c.__init__).parameters["call_timeout_s"].default for c in (ProcessPool, RayPool)] \
        == [pool_base.CALL_TIMEOUT_S] * 2
    conf = Path(__file__).resolve().parents[2] / "conf"
    assert yaml.safe_load((conf / "env" / "scienceworld.yaml").read_text())["kwargs"]["call_timeout_s"] \
        == jvm.CALL_TIMEOUT_S
    for pool in ("inline", "process", "ray"):
        assert yaml.safe_load((conf / "env_pool" / f"{pool}.yaml").read_text())["call_timeout_s"] \
            == pool_base.CALL_TIMEOUT_S, pool


# ---------------------------------------------------------------------- splits
def test_split_sizes_and_cache(env):
    u = env.unwrapped
    sizes = {s: len(u.list_tasks(s)) for s in ("train", "dev", "test")}
    assert sizes == {"train": 3592, "dev": 1796, "test": 1819}
    train, dev, test = (set(u.list_tasks(s)) for s in ("train", "dev", "test"))
    assert not (train & dev or train & test or dev & test)
    assert u.list_tasks("test")[0] == "boil/21" and u.list_tasks("train")[0] == "boil/0"
    splits = T.load_splits()
    assert splits["inclined-plane-friction-named-surfaces"]["max_variations"] == 1386
    assert [len(splits["boil"][s]) for s in ("train", "dev", "test")] == [14, 7, 9]
    # the disk cache alone (no JVM) gives the same lists
    assert T.splits_cache_path().exists()
    T.clear_split_cache()
    assert T.load_splits() == splits
    small = ScienceWorldEnv(split="dev", exclude=["5-x", "9-x", "10-x"], variations_per_task=2)
    ids = small.list_tasks("dev")
    assert len(ids) == 46 and ids[:2] == ["boil/14", "boil/15"]
    small.close()


def test_unknown_task_id_lists_choices(env):
    # (on env.unwrapped: Gymnasium 1.4's passive checker breaks the next step() if the very
    # first reset() raised)
    with pytest.raises(UnknownTaskError, match="unknown task_id 'boil/0' for split 'test'.*boil/21"):
        env.unwrapped.reset(options={"task_id": "boil/0"})   # a train variation


# ---------------------------------------------------------------------- episodes
def test_reset_info_and_failure_by_wrong_focus(env):
    obs, info = env.reset(options={"task_id": "boil/21"})     # (reset speed: eval/bench_scienceworld.py)
    assert obs.startswith("This room is called the bathroom.")
    assert info["task"].startswith("Your task is to boil lead.")
    assert info["task_id"] == "boil/21" and info["split"] == "test" and info["task_type"] == "boil"
    assert info["task_num"] == "1-1" and info["variation"] == 21
    assert info["admissible_actions"] is None and info["score"] == 0.0 and info["won"] is False
    assert "focus on OBJ" in info["action_templates"] and "pour OBJ in OBJ" in info["action_templates"]
    assert {"door", "sink", "toilet", "cup"} <= set(info["objects"])
    # conf/env/scienceworld.yaml's templates name {objects}: the agent loop's check at reset passes them
    prompt = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "env" / "scienceworld.yaml").read_text())
    assert "{objects}" in prompt["prompt"]["first_turn"] and "{objects}" in prompt["prompt"]["next_turn"]
    PromptConfig(**prompt["prompt"]).check_fields(info)
    obs, r, term, trunc, info = env.step("open door to kitchen")
    assert obs == "The door is now open." and r == 0.0 and not term and not trunc
    obs, r, term, trunc, info = env.step("go to kitchen")
    assert "stove" in info["objects"]
    obs, r, term, trunc, info = env.step("focus on stove")          # the task is about lead
    assert term and not trunc and info["failed"] and info["raw_score"] == -100
    assert info["score"] == 0.0 and r == 0.0 and info["won"] is False
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("look around")


def test_score_deltas_on_a_known_path(env):
    """lifespan-longest-lived/93: +0.5 for reaching the animals, +0.5 for focusing on the right one."""
    obs, info = env.reset(options={"task_id": "lifespan-longest-lived/93"})
    assert info["score"] == 0.0
    rewards, info, term, trunc = _play(env, ["open door to outside", "go to outside", "focus on crocodile"])
    assert rewards == [0.0, 0.5, 0.5]
    assert term and not trunc and info["won"] and info["score"] == 1.0 and info["raw_score"] == 100


def test_invalid_actions_and_truncation():
    e = gym.make(ENV_ID, split="test", max_steps=3, tasks="4-2")
    obs, info = e.reset(seed=3)
    assert info["task_type"] == "find-non-living-thing"
    obs, r, term, trunc, _ = e.step("xyzzy")
    assert obs == "No known action matches that input." and r == 0.0 and not term
    obs, r, term, trunc, _ = e.step("")
    assert not term and not trunc
    obs, r, term, trunc, info = e.step("look around")
    assert trunc and not term and not info["won"] and info["steps"] == 3
    e.close()


def test_gold_paths_through_wrapper():
    """expert=True feeds the simulator's gold sequence; it wins (score 1.0) on short tasks."""
    e = gym.make(ENV_ID, split="test", expert=True, tasks=["3-1", "4-2", "7-1"])
    for tid in ("power-component/15", "find-non-living-thing/225", "lifespan-longest-lived/93"):
        obs, info = e.reset(options={"task_id": tid})
        start = info["score"]
        rewards, term = [], False
        while info["expert_action"] is not None and not term:
            _, r, term, trunc, info = e.step(info["expert_action"])
            rewards.append(r)
        assert term and info["won"] and info["score"] == 1.0, (tid, info)
        assert sum(rewards) == pytest.approx(1.0 - start)
        assert info["expert_action"] is None
    e.close()


def test_a_refused_turn_does_not_advance_the_expert():
    """The gold path was indexed by the turn count, which counts a turn the base class refused (the
    simulator never saw it): the expert then skipped a gold action and lost."""
    e = gym.make(ENV_ID, split="test", expert=True, tasks=["7-1"])
    obs, info = e.reset(options={"task_id": "lifespan-longest-lived/93"})
    gold = list(e.unwrapped._gold)
    _, _, term, trunc, info = e.step(info["expert_action"])
    _, _, term, trunc, info = e.step("x" * 10_001)
    assert "invalid_action" in info and info["expert_action"] == gold[1]
    actions = [gold[0]]
    while info["expert_action"] is not None and not (term or trunc):
        actions.append(info["expert_action"])
        _, _, term, trunc, info = e.step(actions[-1])
    assert info["won"] and actions == gold[:len(actions)]       # (the gold path may end after the win)
    e.close()


def test_admissible_actions_on_request():
    e = gym.make(ENV_ID, split="test", tasks="1-1", admissible_actions=True, include_objects=False)
    obs, info = e.reset(options={"task_id": "boil/21"})
    acts = info["admissible_actions"]
    assert len(acts) > 100 and "open door" in acts and "look around" in acts and "focus on toilet" in acts
    assert info["objects"] is None
    _, _, _, _, info = e.step("open door")
    assert "go to kitchen" in info["admissible_actions"] and "close door" in info["admissible_actions"]
    e.close()


def test_simplification_easy_uses_its_own_jvm(env):
    e = gym.make(ENV_ID, split="test", tasks="1-1", simplifications="easy")
    obs, info = e.reset(options={"task_id": "boil/21"})
    assert "A door to the kitchen (that is open)" in obs
    assert "teleport OBJ" in info["action_templates"]
    used = e.unwrapped.jvm.call(lambda gw: e.unwrapped._sim.getSimplificationsUsed())
    assert str(used) == "noElectricalAction, openDoors, selfWateringFlowerPots, teleportAction"
    env.reset(options={"task_id": "boil/21"})
    assert e.unwrapped.jvm is not env.unwrapped.jvm and e.unwrapped.jvm.pid != env.unwrapped.jvm.pid
    obs, r, term, trunc, info = e.step("teleport to kitchen")
    assert obs == "You teleport to the kitchen."
    e.close()


def test_envs_with_easy_keep_their_own_admissible_actions():
    """The simulator keeps simplifications JVM-wide, and with "easy" an electrical task loads without
    noElectricalAction: it must run on a JVM of its own flags, or each env's admissible actions
    would follow whatever the other env loaded last."""
    kw = dict(split="test", simplifications="easy", admissible_actions=True, include_objects=False,
              variations_per_task=1)
    electric = gym.make(ENV_ID, tasks=["test-conductivity"], **kw)
    other = gym.make(ENV_ID, tasks=["boil"], **kw)

    def n_connect(info):
        return sum(a.startswith("connect") for a in info["admissible_actions"])
    try:
        assert n_connect(electric.reset(seed=0)[1]) > 0
        assert n_connect(other.reset(seed=0)[1]) == 0
        assert n_connect(electric.step("look around")[4]) > 0       # after the other env's reset
        electric.reset(seed=0)
        assert n_connect(other.step("look around")[4]) == 0         # after the electrical reset
        assert electric.unwrapped.jvm is not other.unwrapped.jvm
        used = electric.unwrapped.jvm.call(lambda gw: electric.unwrapped._sim.getSimplificationsUsed())
        assert str(used) == "openDoors, selfWateringFlowerPots, teleportAction"
        # one env with both kinds of task uses both JVMs, keeping a simulator in each (no restarts)
        hosts = [electric.unwrapped.jvm, other.unwrapped.jvm]
        refs = [h.refs for h in hosts]
        mixed = gym.make(ENV_ID, tasks=["test-conductivity", "boil"], **kw)
        first = {t.split("/")[0]: t for t in reversed(mixed.unwrapped.list_tasks("test"))}
        for task in ("test-conductivity", "boil", "test-conductivity"):
            info = mixed.reset(options={"task_id": first[task]})[1]
            assert (n_connect(info) > 0) == (task == "test-conductivity")
            assert mixed.unwrapped.jvm is (electric if task == "test-conductivity" else other).unwrapped.jvm
        assert len(mixed.unwrapped._sims) == 2 and [h.refs for h in hosts] == [r + 1 for r in refs]
        mixed.close()
        assert [h.refs for h in hosts] == refs and all(h.alive() for h in hosts)
    finally:
        electric.close()
        other.close()


def test_check_env():
    from gymnasium.utils.env_checker import check_env
    e = gym.make(ENV_ID, split="train", tasks=["7-x", "4-2"])
    check_env(e.unwrapped, skip_render_check=False)
    e.close()


# ---------------------------------------------------------------------- JVM: sharing, cap, crashes
def test_envs_share_one_heap_capped_jvm_and_restart_after_kill():
    # own JVM (distinct options), so killing it does not touch the other tests' JVM
    envs = [gym.make(ENV_ID, split="test", tasks=["4-x", "7-x"], jvm_opts=["-Dagentq.test=crash"]) for _ in range(3)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    host = envs[0].unwrapped.jvm
    assert all(e.unwrapped.jvm is host for e in envs) and host.refs >= 3
    with open(f"/proc/{host.pid}/cmdline") as f:
        cmd = f.read().split("\0")
    assert "-Xmx1g" in cmd and "py4j.GatewayServer" in cmd
    old_pid, old_gen = host.pid, host.generation

    os.kill(old_pid, signal.SIGKILL)                 # the JVM dies mid-episode
    deadline = time.time() + 10
    while not gone(old_pid) and time.time() < deadline:
        time.sleep(0.05)
    for e in envs:                                   # every episode on that JVM is reported as errored
        with pytest.raises(EnvCrashedError, match="is dead"):
            e.step("look around")
    with pytest.raises(EpisodeOverError, match="lost"):   # and the episode stays over until reset
        envs[0].step("look around")

    obs, info = envs[0].reset(options={"task_id": "lifespan-longest-lived/93"})   # restarts the JVM
    assert host.alive() and host.pid != old_pid and host.generation == old_gen + 1
    rewards, info, term, _ = _play(envs[0], ["open door to outside", "go to outside", "focus on crocodile"])
    assert info["won"] and rewards == [0.0, 0.5, 0.5]
    # env 1's simulator died with the old JVM: its episode is over for step(), and the hook itself
    # refuses the simulator of the old JVM generation
    with pytest.raises(EpisodeOverError, match="lost"):
        envs[1].step("look around")
    with pytest.raises(EnvCrashedError, match="restarted"):
        envs[1].unwrapped._step_task("look around")
    envs[1].reset(options={"task_id": "find-animal/225"})
    assert envs[1].unwrapped.jvm.pid == host.pid
    for e in envs:
        e.close()
    assert not host.alive()                          # the last close stops the JVM


def test_java_objects_outliving_their_jvm_do_not_reach_for_it(caplog):
    """py4j tells the JVM about every JavaObject Python collects. Once the JVM is killed, or stopped
    by the last close, those messages must not go out: each would be a refused connection that py4j
    logs as an ERROR traceback from inside the garbage collector (which, on CPython 3.11, broke an
    unrelated `ast.parse` in a later test)."""
    import gc
    import logging

    caplog.set_level(logging.DEBUG, logger="py4j")
    e = gym.make(ENV_ID, split="test", tasks=["4-x"], jvm_opts=["-Dagentq.test=orphans"])
    e.reset(seed=0)
    host, kept = e.unwrapped.jvm, [e.unwrapped._sim]     # a JavaObject that outlives its JVM
    old_pid = host.pid
    os.kill(old_pid, signal.SIGKILL)
    while not gone(old_pid):
        time.sleep(0.05)
    with pytest.raises(EnvCrashedError, match="is dead"):
        e.step("look around")                            # (py4j logs this call's own refusals)
    caplog.clear()
    e.reset(seed=1)                                      # a new JVM; the old simulator is dropped
    kept.append(e.unwrapped._sim)
    e.close()                                            # the last close stops the new JVM too
    assert not host.alive()
    kept.clear()
    gc.collect()
    errors = [r.getMessage() for r in caplog.records if r.name.startswith("py4j") and r.levelno >= logging.ERROR]
    assert errors == []
    assert not [r for r in caplog.records if "connect to the Java server" in r.getMessage()]


def test_hung_jvm_times_out_and_restarts():
    # (a cold JVM on a busy 2-core machine may need a few seconds for the first calls)
    e = gym.make(ENV_ID, split="test", tasks="7-1", call_timeout_s=8.0)
    e.reset(options={"task_id": "lifespan-longest-lived/93"})
    host = e.unwrapped.jvm
    pid = host.pid
    os.kill(pid, signal.SIGSTOP)                     # alive but not answering
    try:
        t0 = time.perf_counter()
        with pytest.raises(EnvCrashedError, match="stopped answering"):
            e.step("open door to outside")
        assert 7.5 < time.perf_counter() - t0 < 40   # the read timeout, then stopping the JVM
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    obs, info = e.reset(options={"task_id": "lifespan-longest-lived/93"})
    assert host.pid != pid and obs.startswith("This room is called")
    e.close()


def test_a_jvm_that_never_prints_its_port_times_out_at_start():
    """A real JVM suspended before `main` by a debug agent (JDWP, suspend=y, quiet) never prints
    its port: reset() raises TimeoutError within call_timeout_s, naming the setting, and the JVM is
    killed (it used to wait in readline() forever, and its JVM, in a session of its own, outlived
    the process)."""
    from jvm_procs import SUSPEND_AT_START, check_start_timed_out, first_reset, kill_marked_jvms, new_marker

    marker = new_marker()
    try:
        out = first_reset(ENV_ID, dict(split="test", tasks="1-1", call_timeout_s=5,
                                       jvm_opts=[SUSPEND_AT_START, f"-D{marker}"]))
    finally:
        leaked = kill_marked_jvms(marker)
    check_start_timed_out(out, marker, leaked)


def test_a_killed_workers_jvm_that_never_started_dies_with_it():
    """A pool worker hung in a JVM start (here a real JVM suspended before `main`: the env's own
    100 s start limit is far off) is killed by the pool after its call_timeout_s. Its JVM, in a
    session of its own and not yet reading the stdin pipe that ends it later, used to outlive it;
    the kernel's parent-death signal now ends it with the worker. The pool's restarted worker may
    start another, which must end when close() kills that worker."""
    import threading

    from jvm_procs import SUSPEND_AT_START, kill_marked_jvms, marked_jvms, new_marker

    from agentq.pool import EnvSpec, make_pool

    def wait_until(check, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    marker = new_marker()
    pool = make_pool("process", EnvSpec("scienceworld", dict(split="test", tasks="1-1",
                                                              jvm_opts=[SUSPEND_AT_START, f"-D{marker}"])),
                     1, num_workers=1, call_timeout_s=4, start_timeout_s=60)
    results: list = []
    try:
        call = threading.Thread(target=lambda: results.extend(pool.reset([(0, {"seed": 0})])), daemon=True)
        call.start()
        assert wait_until(lambda: marked_jvms(marker) != [], timeout_s=30), "the worker started no JVM"
        first_jvm = marked_jvms(marker)[0]
        call.join(timeout=60)
        assert not call.is_alive() and len(results) == 1 and not results[0].ok, results
        first_ended = wait_until(lambda: first_jvm not in marked_jvms(marker), timeout_s=10)
    finally:
        pool.close()
        all_ended = wait_until(lambda: marked_jvms(marker) == [], timeout_s=10)
        leaked = kill_marked_jvms(marker)
    assert first_ended, "the killed worker's JVM outlived it"
    assert all_ended and leaked == []


def test_heap_cap_is_enforced_and_oom_is_a_crash():
    """-Xmx is real: a 24 MB heap cannot hold the simulator, the JVM exits on OutOfMemoryError and
    the env reports EnvCrashedError (with the JVM's notice) instead of hanging."""
    e = gym.make(ENV_ID, split="test", tasks="10-2", jvm_heap="24m")
    with pytest.raises(EnvCrashedError, match="OutOfMemoryError"):
        e.reset(seed=0)
    e.close()
    with pytest.raises(ValueError, match="bad JVM memory size"):
        ScienceWorldEnv(jvm_heap="lots")


_EIGHT_ENVS = """
import json, gymnasium as gym, agentq.envs
nums = ["1-1", "2-3", "3-4", "4-4", "6-1", "7-3", "8-1", "9-2"]
envs = [gym.make("agentq/ScienceWorld-v0", split="test", tasks=n) for n in nums]
for i, e in enumerate(envs):
    e.reset(seed=i)
for _ in range(10):
    for e in envs:
        e.step("look around")
def rss(pid="self"):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
hosts = {id(e.unwrapped.jvm) for e in envs}
print(json.dumps({"python": rss(), "jvm": rss(envs[0].unwrapped.jvm.pid), "jvms": len(hosts)}))
for e in envs:
    e.close()
"""


def test_eight_envs_memory_smoke():
    """8 envs on 8 tasks in one JVM: total RSS of a process hosting them + its JVM well under 1.2 GB.
    Measured in a fresh interpreter (as an env worker is): this test process holds models and more."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _EIGHT_ENVS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["jvms"] == 1
    assert m["python"] + m["jvm"] < 1200, m


# ---------------------------------------------------------------------- slow
@pytest.mark.slow
def test_gold_paths_all_tasks():
    """The gold path wins on the first test variation of at least 28 of the 30 tasks."""
    e = gym.make(ENV_ID, split="test", expert=True, max_steps=1000)
    ids = e.unwrapped.list_tasks("test")
    won = {}
    for t in T.all_tasks():
        tid = next(i for i in ids if i.split("/")[0] == t.name)
        _, info = e.reset(options={"task_id": tid})
        term = trunc = False
        while info["expert_action"] is not None and not (term or trunc):
            _, _, term, trunc, info = e.step(info["expert_action"])
        won[t.num] = info["won"]
    e.close()
    assert sum(won.values()) >= 28, won


@pytest.mark.slow
def test_eight_envs_long_episodes_stay_under_cap():
    """8 envs on the heaviest tasks (10-x, 9-x, 5-x …), interleaved, 60 turns each, most of them
    "wait" (10 simulated ticks): RSS of this process + the shared JVM stays under 1.2 GB."""
    nums = ["10-2", "10-1", "9-3", "9-2", "5-2", "5-1", "2-3", "8-1"]
    envs = [gym.make(ENV_ID, split="test", tasks=n) for n in nums]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    host = envs[0].unwrapped.jvm
    cycle = ["look around", "wait", "inventory", "wait", "wait1"]
    peak = 0.0
    for k in range(60):
        for e in envs:
            _, _, term, trunc, _ = e.step(cycle[k % len(cycle)])
            if term or trunc:
                e.reset()
        peak = max(peak, _rss_mb() + _rss_mb(host.pid))
    assert peak < 1200, peak
    for e in envs:
        e.close()


def test_eval_num_tasks_30_covers_every_task_type_of_test(env):
    from agentq.config import load_config
    from agentq.eval.evaluate import choose_eval_tasks

    sel = choose_eval_tasks(load_config(["env=scienceworld"]), "test", 30)
    assert sel.method == "stratified" and sel.num_available == 1819 and len(sel.tasks) == 30
    assert len(sel.per_type) == 30 and all(chosen == 1 for chosen, _ in sel.per_type.values()), sel.per_type
    # the type read off the id is the one the episode reports
    _, info = env.reset(options={"task_id": sel.tasks[-1]})
    assert info["task_type"] == env.unwrapped.task_type(sel.tasks[-1])
