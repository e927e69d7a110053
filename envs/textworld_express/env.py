"""TextWorldExpress (Jansen & Côté, 2022) as an agentq `TextEnv`.

Fast (sub-millisecond steps), offline, with gold paths: the CI workhorse and the template to
copy when adding an environment. A task id is "<game>/<seed>"; splits are the game's own
folds (train / dev / test seed ranges), so held-out seeds never appear in training.
"""
from __future__ import annotations

import copy
import os
import tempfile
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar

from ..base import EnvCrashedError, TaskStep, TextEnv, positive_int, positive_number
from ..jvm_start import java_executable, launch_gateway, silence_client

# One JVM per process, shared by every TextWorldExpressEnv in it: TextWorldExpress's own class
# launches a JVM per instance (~150 MB and a second of start-up each); a worker process that owns
# 16 env slots would otherwise run 16 JVMs. Each env gets its own simulator (PythonInterface) on
# the shared gateway, or, when its call timeout differs from the first env's, on a gateway client
# of its own (the read timeout belongs to a py4j client).
# "gen" numbers the JVMs started: an env still holding an engine of a dead JVM releases it without
# touching the count of the one that replaced it.
_SHARED: dict = {"owner": None, "users": 0, "gen": 0}
#: every engine this process made (the after-fork handler below disowns them in a child)
_ENGINES: weakref.WeakSet = weakref.WeakSet()


def _engine_alive(engine) -> bool:
    if getattr(engine, "_agentq_pid", None) != os.getpid():
        return False                # a forked child's copy of its parent's engine: not this process's JVM
    proc = getattr(engine._gateway, "java_process", None)
    return proc is None or proc.poll() is None


_SIM_CLASS: list = []


def _simulator_class(base):
    """A TextWorldExpressEnv on a borrowed gateway: its close()/__del__ leave the JVM running."""
    if not _SIM_CLASS:
        _SIM_CLASS.append(type("SharedGatewaySimulator", (base,), {"close": lambda self: None,
                                                                  "__del__": lambda self: None}))
    return _SIM_CLASS[0]


def _launch_engine(heap: str, call_timeout_s: float):
    """TextWorldExpress's own engine class on a JVM with a heap cap (Java's default is a quarter of
    the machine's RAM, per worker), a bounded wait for the JVM's port (py4j's `launch_gateway` waits
    forever for a JVM that never prints it) and a gateway read timeout (a stopped JVM otherwise
    blocks the caller forever). The package's constructor hard-codes all three, so its two py4j
    names are replaced for the duration of the call (envs start engines from one thread)."""
    import textworld_express.textworld_express as twx_module

    launch, params = twx_module.launch_gateway, twx_module.GatewayParameters
    java = java_executable("TextWorldExpress", 8)
    jvm_opts = [f"-Xmx{heap}", "-XX:+ExitOnOutOfMemoryError"]
    # the constructor's one call: launch_gateway(classpath=, die_on_exit=True, cwd=, javaopts=, return_proc=True)
    twx_module.launch_gateway = lambda classpath, cwd, javaopts=(), **_: launch_gateway(
        java, classpath, cwd, [*javaopts, *jvm_opts], call_timeout_s, "the TextWorldExpress JVM",
        "call_timeout_s (env.kwargs.call_timeout_s)")
    # auto_field off: with it, py4j's first use of each Java method on an object is a field lookup and
    # then the call, two round trips, so a hung JVM took up to 2x call_timeout_s to be detected (TWX
    # reads no Java fields)
    twx_module.GatewayParameters = lambda **kw: params(**{**kw, "read_timeout": call_timeout_s, "auto_field": False})
    try:
        # the base class owns the step cap: the engine's own limit is set far above it
        return twx_module.TextWorldExpressEnv(envStepLimit=10_000)
    finally:
        twx_module.launch_gateway, twx_module.GatewayParameters = launch, params


def _acquire_engine(heap: str = "1g", call_timeout_s: float = 60.0):
    """The process's shared engine (its JVM started by the first env, with that env's heap); this
    env's calls time out after its own call_timeout_s."""
    from textworld_express import TextWorldExpressEnv as _TWX

    owner = _SHARED["owner"]
    if owner is None or not _engine_alive(owner):
        owner = _launch_engine(heap, call_timeout_s)
        owner._agentq_gen, owner._agentq_own_client = _SHARED["gen"] + 1, False
        owner._agentq_pid = os.getpid()
        _SHARED.update(owner=owner, users=1, gen=owner._agentq_gen)
        _ENGINES.add(owner)
        return owner
    eng = copy.copy(owner)
    eng.__class__ = _simulator_class(_TWX)        # closing/collecting it must not stop the shared JVM
    eng._agentq_own_client = call_timeout_s != owner._gateway.gateway_parameters.read_timeout
    if eng._agentq_own_client:
        eng._gateway = _client_with_timeout(owner._gateway, call_timeout_s)
    eng.server = eng._gateway.jvm.textworldexpress.runtime.PythonInterface()
    eng.runHistory, eng.lastStepScore, eng.seed, eng.gameName, eng.gameParams = [], 0, None, None, ""
    eng._obj_tree_tempfile = tempfile.NamedTemporaryFile()
    _SHARED["users"] += 1
    _ENGINES.add(eng)
    return eng


def _client_with_timeout(gateway, call_timeout_s: float):
    """A py4j client of the running JVM whose calls time out after call_timeout_s (py4j sets the
    read timeout per client); it knows the JVM's process, so a hung JVM can be killed through it."""
    from py4j.java_gateway import GatewayParameters, JavaGateway

    params = gateway.gateway_parameters
    return JavaGateway(gateway_parameters=GatewayParameters(address=params.address, port=params.port,
                                                            auth_token=params.auth_token, auto_field=False,
                                                            read_timeout=call_timeout_s),
                       java_process=gateway.java_process)


def _release_engine(eng) -> None:
    """An env stops using its engine `eng` (its own gateway client, if it has one, is closed); the
    last env of the running JVM stops it. An engine of a JVM that has died and been replaced
    leaves the replacement's count alone. A forked child's copy of its parent's engine is left
    alone: its sockets and JVM are the parent's (see `_forget_in_child`)."""
    if getattr(eng, "_agentq_pid", None) != os.getpid():
        return
    if eng._agentq_own_client:
        silence_client(eng._gateway)        # its objects outlive the JVM, whose last env may close next
        eng._gateway.close()
    if eng._agentq_gen != _SHARED["gen"]:
        return
    _SHARED["users"] -= 1
    if _SHARED["users"] <= 0 and _SHARED["owner"] is not None:
        owner = _SHARED["owner"]
        try:
            owner.close()                   # py4j's shutdown leaves the client connected where the JVM had died
        finally:
            silence_client(owner._gateway)
            _SHARED["owner"], _SHARED["users"] = None, 0


_inherited: list = []


def _forget_in_child() -> None:
    # A forked child (e.g. gymnasium's AsyncVectorEnv) must neither talk to its parent's JVM (py4j
    # replies would cross on the shared sockets) nor stop it: its envs start a JVM of their own.
    # The parent's engines stay referenced and inert here: close()/__del__ would shut the parent's
    # gateway down, a collected JavaObject would message it, a collected temp file would unlink
    # the parent's file; the child's copy of the JVM's stdin is closed, so the JVM still dies with
    # the parent (py4j's die-on-broken-pipe).
    for eng in list(_ENGINES):
        _inherited.append(eng)
        if not (_SIM_CLASS and isinstance(eng, _SIM_CLASS[0])):
            eng.__class__ = _simulator_class(type(eng))
        silence_client(eng._gateway)
        closer = getattr(getattr(eng, "_obj_tree_tempfile", None), "_closer", None)
        if closer is not None:
            closer.delete = False
        proc = getattr(eng._gateway, "java_process", None)
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except Exception:
                pass
    _ENGINES.clear()
    _SHARED.update(owner=None, users=0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)

_SEEDS: dict = {}   # (split, games, params) → the fold's seeds, shared by all envs in the process

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")


def _without_detours(env, reset_kw: dict, gold: list[str]) -> list[str]:
    """The gold path with its loops erased. TWX draws some gold paths (coin) as random walks from an
    unseeded JVM RNG, so the same task gives different paths, with back-and-forth moves, on each
    reset; demonstrations would then differ run to run and teach wandering. Replaying the path and
    cutting every stretch that returns to an earlier state (room, contents, inventory, score) leaves
    the same detour-free path every time, without doors (includeDoors=0, conf/env/'s coin). The result
    is checked by replay; if it does not win, the original path is kept. With doors (coin's engine
    defaults) the state, one room's text, misses doors opened in other rooms: cutting a loop that opened
    one loses it, the replay fails and the random walk is kept, so the path differs between resets."""
    def state(info):
        return info["look"], info["inventory"], info["score"]

    env.reset(**reset_kw)
    states = [state(env.step("look around")[3])]        # a look changes nothing, and reads the state
    path: list[str] = []
    env.reset(**reset_kw)
    for action in gold:
        key = state(env.step(action)[3])
        if key in states:                     # back where we were: drop the loop
            cut = states.index(key)
            del states[cut + 1:], path[cut:]
        else:
            states.append(key)
            path.append(action)
    env.reset(**reset_kw)
    info = {}
    for action in path:
        info = env.step(action)[3]
    return path if info.get("tasksuccess") else gold


def _checked_game_params(game_params: Any, games: list[str]) -> dict[str, str]:
    """`game_params` (None: no game's), else a ValueError naming what is wrong: a key that is not one
    of `games` (a typo, {"cion": ...}, silently played the engine's default coin) or a value that is
    not a str (an int made the engine's call fail and the shared JVM was killed as hung)."""
    if game_params is None:
        return {}
    if not isinstance(game_params, Mapping):
        raise ValueError(f"game_params must be a dict {{game: gameParams str}} or None, got "
                         f"{type(game_params).__name__} ({game_params!r:.60})")
    extra = [g for g in game_params if g not in games]
    if extra:
        raise ValueError(f"game_params names {extra}, not in games {games}; its keys must be games played "
                         "(a key of another game would never be used; after env.kwargs.games=[...] on the command "
                         f"line, remove the others' with ~env.kwargs.game_params.{extra[0]}, or take a config of "
                         "that game, e.g. env=textworld_express_mapreader)")
    for game, params in game_params.items():
        if not isinstance(params, str):
            raise ValueError(f"game_params[{game!r}] must be a str of TextWorldExpress's gameParams (e.g. "
                             f"'numLocations=3,includeDoors=0'; '' for the engine's defaults), got "
                             f"{type(params).__name__} ({params!r:.60})")
    return dict(game_params)


class TextWorldExpressEnv(TextEnv):
    splits: ClassVar[tuple[str, ...]] = ("train", "dev", "test")
    default_max_steps: ClassVar[int] = 50
    # a reset is a few milliseconds in the JVM: 1,000 training tasks take ~10 s, once per settings
    openings_listable: ClassVar[bool] = True

    def __init__(self, games: str | list[str] | tuple[str, ...] = ("coin",), game_params: dict[str, str] | None = None,
                 tasks_per_game: int | None = None, jvm_heap: str = "1g", call_timeout_s: float = 60.0,
                 **kwargs):
        """
        games: one or several of GAMES; tasks of all of them are listed, interleaved by seed.
        game_params: per game of `games`, TextWorldExpress's gameParams string, e.g.
            {"coin": "numLocations=2,includeDoors=0,numDistractorItems=0"} (a game left out: the engine's defaults).
        tasks_per_game: keep only the first N seeds of each fold, an int >= 1 (None = all 1,000).
        jvm_heap: the JVM's -Xmx ("1g", "512m"); call_timeout_s: a JVM call taking longer counts as a
            hung JVM (killed, EnvCrashedError). The process's JVM is shared: the first env's heap holds;
            each env's calls time out after its own call_timeout_s (py4j's delete of a collected
            Java object goes through the client that made it, so it waits that env's timeout).
        """
        super().__init__(**kwargs)
        from ..scienceworld.jvm import parse_size   # the same Java size syntax (no JVM started)

        parse_size(jvm_heap)
        self.jvm_heap, self.call_timeout_s = str(jvm_heap), positive_number("call_timeout_s", call_timeout_s)
        games = [games] if isinstance(games, str) else list(games)
        bad = [g for g in games if g not in GAMES]
        if bad:
            raise ValueError(f"unknown TextWorldExpress game(s) {bad}; valid: {list(GAMES)}")
        if not games:
            raise ValueError(f"games is empty; name one or more of {list(GAMES)}")
        twice = [g for g, n in Counter(games).items() if n > 1]
        if twice:           # (refused only at the first list_tasks: every task id twice)
            raise ValueError(f"games names {twice} more than once ({games}); name each game once")
        self.games = games
        # a game without params plays the engine's defaults ("")
        self.game_params = {g: "" for g in games} | _checked_game_params(game_params, games)
        # (-1 kept all seeds but the last through slicing, 0 an empty split, 2.5 a TypeError at the first reset)
        self.tasks_per_game = (None if tasks_per_game is None
                               else positive_int("tasks_per_game", tasks_per_game, "all of a fold's seeds"))
        self._env = None
        self._gold: list[str] = []
        self._valid: list[str] = []             # the engine's valid actions now

    def _engine(self, restart: bool):
        if self._env is not None and not _engine_alive(self._env):
            eng, self._env = self._env, None
            _release_engine(eng)
            if not restart:        # mid-episode: the game state is gone with the JVM
                raise EnvCrashedError("TextWorldExpress JVM died (or is the JVM of the process this one was forked "
                                      "from); the episode is lost (reset() restarts it)")
        if self._env is None:
            if not restart:        # a fresh engine mid-episode would play a game that was never loaded
                raise EnvCrashedError("TextWorldExpress has no engine for this episode (its JVM died or the "
                                      "process was forked); the episode is lost (reset() restarts it)")
            self._env = _acquire_engine(self.jvm_heap, self.call_timeout_s)
        return self._env

    def _call(self, fn, restart: bool = False):
        """Run an engine call; a dead JVM becomes EnvCrashedError (the episode is reported as errored).
        restart=True (reset, task lists) brings a new JVM up instead."""
        from py4j.protocol import Py4JError, Py4JJavaError

        try:
            return fn(self._engine(restart))
        except EnvCrashedError:
            raise
        except Py4JJavaError:
            raise                   # a Java exception: the JVM itself is fine
        except Exception as e:
            proc = getattr(getattr(self._env, "_gateway", None), "java_process", None)
            if isinstance(e, Py4JError) and proc is not None and proc.poll() is None:
                # running but not answering (read timeout, broken protocol): unusable, so stop it
                proc.kill()
                proc.wait(timeout=10)
                raise EnvCrashedError(f"TextWorldExpress JVM stopped answering (call_timeout_s="
                                      f"{self.call_timeout_s:g}): {type(e).__name__}: {e}; killed, the episode "
                                      "is lost (reset() restarts it)") from e
            if self._env is not None and not _engine_alive(self._env):
                raise EnvCrashedError(f"TextWorldExpress JVM died: {type(e).__name__}: {e}") from e
            raise

    def _tasks(self, split: str) -> list[str]:
        key = (split, tuple(self.games), tuple(sorted(self.game_params.items())))
        if key not in _SEEDS:
            def query(env):
                # Seeds per fold are the same for every game; the engine wants a reset before queries.
                env.reset(seed=0, gameFold="train", gameName=self.games[0], gameParams=self.game_params[self.games[0]])
                return {"train": env.getValidSeedsTrain, "dev": env.getValidSeedsDev,
                        "test": env.getValidSeedsTest}[split]()
            _SEEDS[key] = list(self._call(query, restart=True))
        seeds = _SEEDS[key]
        if self.tasks_per_game is not None:
            seeds = seeds[: self.tasks_per_game]
        return [f"{g}/{s}" for s in seeds for g in self.games]

    def task_type(self, task_id: str) -> str:
        return task_id.rsplit("/", 1)[0]

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        game, seed = task_id.rsplit("/", 1)

        def reset(env):
            kw = dict(seed=int(seed), gameFold=split, gameName=game, gameParams=self.game_params[game])
            gold = []
            if self.expert:
                env.reset(**kw, generateGoldPath=True)
                gold = _without_detours(env, kw, list(env.getGoldActionSequence()))
            obs, info = env.reset(**kw)
            return obs, info, gold
        obs, info, self._gold = self._call(reset, restart=True)
        self._score = 0.0
        return info["taskDescription"], self._to_step(obs, info, game=game)

    def _engine_action(self, action: str) -> str:
        """What the engine is sent for `action`. The engine matches its valid actions exactly, case
        included ("take box of Q-tips" in twc), so an action equal to a valid one but for case becomes
        that one; any other text goes lower-cased, as before (the engine answers "Unknown action";
        "HELP" is TWX's "help"). The agent loop's admissibility check ignores case alike."""
        text = action.strip()
        if text in self._valid:
            return text
        low = text.lower()
        return next((a for a in self._valid if a.lower() == low), low)

    def _step_task(self, action: str) -> TaskStep:
        command = self._engine_action(action)
        obs, _, _, info = self._call(lambda env: env.step(command))
        assert self._task_id is not None                  # step() checks an episode is running
        return self._to_step(obs, info, game=self._task_id.rsplit("/", 1)[0])

    def _to_step(self, obs: str, info: dict, game: str) -> TaskStep:
        score = max(0.0, float(info["score"]))
        reward, self._score = score - self._score, score
        won, failed = bool(info["tasksuccess"]), bool(info["taskfailure"])
        self._valid = sorted(info["validActions"])
        return TaskStep(obs=obs.strip(), reward=reward, done=won or failed, won=won, score=score,
                        admissible_actions=list(self._valid), extra={"task_type": game})

    def _expert_action(self) -> str | None:
        # The gold path is a fixed sequence: correct as long as the agent followed it (a turn the
        # base class refused never reached the engine, so it does not count)
        i = self._engine_steps
        return self._gold[i] if i < len(self._gold) else None

    def close(self):
        if self._env is not None:
            eng, self._env = self._env, None
            _release_engine(eng)
