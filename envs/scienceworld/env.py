"""ScienceWorld (Wang et al., 2022) as an agentq `TextEnv`: fast, heap-capped, crash-aware.

    import gymnasium as gym, agentq.envs
    env = gym.make("agentq/ScienceWorld-v0", split="test", tasks=["1-x", "4-x"])
    obs, info = env.reset(seed=0)            # info["task"], info["action_templates"], info["objects"]
    obs, reward, terminated, truncated, info = env.step("open door to kitchen")

* Task ids are "<task name>/<variation>" ("boil/21"); splits are the simulator's train/dev/test
  variation lists (3,592 / 1,796 / 1,819 over the 30 tasks). `tasks=` / `exclude=` take task
  names, numbers ("5-1") or families ("5-x"); see `tasks.py`.
* Reset = `load(task, variation)` + "look around" (tens of ms), not the package's reset (seconds).
  Step = the simulator's step + score + completion calls, plus the visible objects.
* Reward = change of score / 100. `info["score"]` is the score in [0, 1]; a negative simulator
  score means the task failed: the episode terminates with `won=False`, `score=0`, and the reward
  takes back what was earned (rewards always sum to the final score minus the score at reset).
  `won` = score 100. `truncated` at `max_steps` (default 100).
* `info["action_templates"]` (e.g. "open OBJ", "pour OBJ in OBJ") and `info["objects"]` (the
  object names the parser accepts right now) are for prompts. The full valid-action list
  (~2,000 strings, ~100 ms a step) is only built with `admissible_actions=True`; otherwise
  `info["admissible_actions"]` is None.
* One JVM per worker process (heap cap `jvm_heap`, default 1g) hosts the simulators of every env
  in that process; see `jvm.py`. If the JVM dies, `step`/`reset` raise `EnvCrashedError` and the
  next `reset` restarts it. The simulator's simplifications are JVM-wide, so a task runs on the JVM
  of its own flags (`tasks.simplifications_for`): with "easy", the electrical tasks get a second JVM.
* `expert=True`: the simulator's gold action sequence (generated at reset, 0.1–20 s) feeds
  `info["expert_action"]`, valid as long as the agent follows it.
"""
from __future__ import annotations

from typing import Any, ClassVar, Sequence

from ..base import EnvCrashedError, TaskStep, TextEnv, positive_int, positive_number
from . import tasks as T
from .jvm import CALL_TIMEOUT_S, JVMHost, parse_size

_SEP = "\x1e"   # joins Java string lists into one string: one round trip instead of one per item


class ScienceWorldEnv(TextEnv):
    splits: ClassVar[tuple[str, ...]] = T.SPLITS
    default_max_steps: ClassVar[int] = 100

    def __init__(self, tasks: str | Sequence[str] | None = None, exclude: str | Sequence[str] | None = None,
                 simplifications: str | Sequence[str] | None = "", variations_per_task: int | None = None,
                 admissible_actions: bool = False, include_objects: bool = True,
                 jvm_heap: str = "1g", jvm_opts: Sequence[str] = (), call_timeout_s: float = CALL_TIMEOUT_S, **kwargs):
        """
        tasks: selectors of the tasks to use (None = all 30): names ("boil"), numbers ("1-1"),
            families ("5-x"); a list or a comma string.
        exclude: selectors to drop, e.g. ["5-x", "9-x", "10-x"] (long-horizon families).
        simplifications: "easy" (teleport, self-watering pots, open doors, no electrical actions) and/or
            teleportAction, selfWateringFlowerPots, openContainers, openDoors, noElectricalAction.
        variations_per_task: keep the first N variations of each task in every split, an int >= 1 (None = all).
        admissible_actions: build the valid-action list every step (slow: ~70-100 ms); default off.
        include_objects: put the visible objects into info["objects"] every step (~1-5 ms).
        jvm_heap: the JVM's -Xmx ("1g", "768m"); jvm_opts: extra JVM options, a list of str (not one str).
        call_timeout_s: a JVM call taking longer counts as a hung JVM (killed, EnvCrashedError); > 0.
        """
        super().__init__(**kwargs)
        self.tasks = T.select_tasks(tasks, exclude)
        self._by_name = {t.name: t for t in self.tasks}
        self.simplifications = T.parse_simplifications(simplifications)
        # (2.7 kept 2 variations, True 1)
        self.variations_per_task = (None if variations_per_task is None
                                    else positive_int("variations_per_task", variations_per_task,
                                                      "all of a task's variations"))
        self.want_admissible = bool(admissible_actions)
        self.include_objects = bool(include_objects)
        parse_size(jvm_heap)
        self.jvm_heap = str(jvm_heap)
        # a str (a YAML `jvm_opts: -Xss4m`) became one option per character, and the JVM failed at the first reset
        if isinstance(jvm_opts, str) or not isinstance(jvm_opts, Sequence) or not all(
                isinstance(o, str) for o in jvm_opts):
            raise ValueError(f"jvm_opts must be a list of JVM options, one str each (e.g. ['-Xss4m']), got "
                             f"{type(jvm_opts).__name__} ({jvm_opts!r:.60})")
        self.jvm_opts = tuple(jvm_opts)
        self.call_timeout_s = positive_number("call_timeout_s", call_timeout_s)
        # The simulator keeps the flags of the last load JVM-wide, so each flag string a task loads
        # with (`T.simplifications_for`) has its own JVM host; this env keeps one simulator in each
        # host it used (an "easy" env alternating electrical and other tasks switches between two).
        self._hosts: dict[str, JVMHost] = {}               # flag string → acquired host
        self._sims: dict[str, tuple[Any, int]] = {}        # flag string → (simulator, its JVM generation)
        self._host: JVMHost | None = None                  # the episode's host, simulator, generation
        self._sim = None
        self._sim_gen = -1
        self._gold: list[str] = []
        self._templates: dict[tuple[int, str], list[str]] = {}
        self._points = 0
        self._cur: T.SWTask = self.tasks[0]
        self._variation = 0
        self._templates_now: list[str] = []

    # ------------------------------------------------------------------ JVM plumbing
    def _get_host(self, simplifications: str | None = None) -> JVMHost:
        """This process's JVM for our options and `simplifications` (the flags a task loads with;
        None: the env's), (re)started if needed. One JVM only ever loads one flag string: otherwise
        another env's reset would change this env's admissible actions mid-episode."""
        simpl = self.simplifications if simplifications is None else simplifications
        host = JVMHost.get(self.jvm_heap, self.jvm_opts, simpl, self.call_timeout_s)
        old = self._hosts.get(simpl)
        if old is not host:
            host.acquire()
            self._drop_sim(simpl)
            if old is not None:
                old.release()
            self._hosts[simpl] = host
        self._host = host
        return host

    @property
    def jvm(self) -> JVMHost | None:
        """The JVM host of this env's episode (None before the first reset)."""
        return self._host

    def _ensure_sim(self, simpl: str):
        """The episode's simulator: this env's one in the host of `simpl` (a new one when that host
        has none of this env, or restarted since it was made)."""
        host = self._hosts[simpl]
        sim, gen = self._sims.get(simpl, (None, -1))
        if sim is None or gen != host.generation:
            self._sim = None
            self._sims.pop(simpl, None)
            gen = host.generation
            sim = host.call(lambda gw: gw.jvm.scienceworld.runtime.pythonapi.PythonInterface(), gen)
            self._sims[simpl] = (sim, gen)
        self._host, self._sim, self._sim_gen = host, sim, gen
        return sim

    def _drop_sim(self, simpl: str) -> None:
        """Forget this env's simulator in the host of `simpl`, detaching it while its JVM still runs."""
        sim, gen = self._sims.pop(simpl, (None, -1))
        host = self._hosts.get(simpl)
        if sim is self._sim:
            self._sim = None
        if host is not None and sim is not None and host.alive() and gen == host.generation:
            try:
                host.call(lambda gw: gw.detach(sim))
            except Exception:
                pass

    def _call(self, fn):
        """Run fn(gateway, sim) on this episode's simulator; JVM death → EnvCrashedError."""
        from py4j.protocol import Py4JJavaError
        host, sim = self._host, self._sim
        if host is None or sim is None:
            raise EnvCrashedError("ScienceWorld simulator is gone (JVM crashed or env closed); call reset()")
        try:
            return host.call(lambda gw: fn(gw, sim), self._sim_gen)
        except Py4JJavaError as e:
            # The simulator threw: its state is unknown, so this episode ends as errored and the
            # next reset makes a new simulator (the JVM is fine and stays up).
            self._sim = None
            self._sims = {k: v for k, v in self._sims.items() if v[0] is not sim}
            raise EnvCrashedError(f"ScienceWorld simulator raised a Java exception: {e}") from e

    # ------------------------------------------------------------------ TextEnv hooks
    def _tasks(self, split: str) -> list[str]:
        splits = self._splits()
        return T.split_task_ids(splits, self.tasks, split, self.variations_per_task)

    def task_type(self, task_id: str) -> str:
        return T.parse_task_id(task_id)[0]

    def _splits(self) -> dict:
        try:
            return T.load_splits()
        except RuntimeError:   # not cached yet: compute with our JVM
            host = self._get_host()
            return T.load_splits(host.call)

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        name, variation = T.parse_task_id(task_id)
        task = self._by_name[name]
        simpl = T.simplifications_for(task, self.simplifications)
        self._get_host(simpl)
        self._ensure_sim(simpl)
        expert = self.expert

        def work(gw, sim):
            err = sim.load(task.name, variation, simpl, expert)
            if err:
                raise RuntimeError(f"ScienceWorld could not load {task_id!r}: {err}")
            gold = _strings(gw, sim.getGoldActionSequence()) if expert else []
            obs = sim.step("look around")
            score, completed = sim.getScore(), sim.getCompleted()
            goal = sim.getTaskDescription()
            key = (self._sim_gen, simpl)
            if key not in self._templates:
                self._templates[key] = _strings(gw, sim.getPossibleActions())
            return obs, score, completed, goal, gold, self._step_extras(gw, sim)

        self._cur, self._variation, self._gold = task, variation, []
        obs, score, completed, goal, gold, extras = self._call(work)
        self._gold = gold
        self._points = 0
        self._templates_now = self._templates[(self._sim_gen, simpl)]
        return str(goal), self._to_step(str(obs), score, completed, extras, reset=True)

    def _step_task(self, action: str) -> TaskStep:
        action = action.strip()

        def work(gw, sim):
            obs = sim.step(action)
            return obs, sim.getScore(), sim.getCompleted(), self._step_extras(gw, sim)

        obs, score, completed, extras = self._call(work)
        return self._to_step(str(obs), score, completed, extras)

    def _step_extras(self, gw, sim) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.include_objects:
            out["objects"] = _strings(gw, sim.getPossibleObjects())
        if self.want_admissible:
            out["admissible"] = _strings(gw, sim.getValidActionObjectCombinations())
        return out

    def _to_step(self, obs: str, score01: float, completed: bool, extras: dict, reset: bool = False) -> TaskStep:
        raw = int(round(100 * float(score01)))        # the simulator's score, -100..100
        failed = raw < 0
        won = raw >= 100
        points = 0 if failed else min(raw, 100)       # integer points: rewards are exact multiples of 0.01
        reward = 0.0 if reset else (points - self._points) / 100.0
        self._points = points
        extra = {"task_type": self._cur.name, "task_num": self._cur.num, "variation": self._variation,
                 "raw_score": raw, "failed": failed, "action_templates": list(self._templates_now),
                 "objects": extras.get("objects")}
        return TaskStep(obs=obs, reward=reward, done=bool(completed) or failed or won, won=won, score=points / 100.0,
                        admissible_actions=extras.get("admissible"), extra=extra)

    def _expert_action(self) -> str | None:
        i = self._engine_steps          # a turn the base class refused never reached the simulator
        return self._gold[i] if i < len(self._gold) else None

    def close(self):
        for simpl in list(self._sims):
            self._drop_sim(simpl)
        hosts, self._hosts, self._host, self._sim = self._hosts, {}, None, None
        for host in hosts.values():
            host.release()
        super().close()


def _strings(gw, jlist) -> list[str]:
    text = str(gw.jvm.java.lang.String.join(_SEP, jlist))
    return text.split(_SEP) if text else []
