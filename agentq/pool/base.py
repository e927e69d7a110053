"""Environment pools: many environment instances stepped in parallel, behind one interface.

The agent loop addresses environments by *env slot* (0 … num_envs−1). A pool runs each slot's
environment somewhere (this process, a subprocess worker, a Ray actor); `reset` and `step` take
a batch of slot commands and return one `EnvResult` per command, in order. A slot whose
environment or worker died yields `EnvResult(ok=False, error=...)`; the pool restarts what died,
so the next `reset` of that slot works, and the agent loop reports the episode as errored. A reset
that a worker died in (one killed while idle is found dead there) is retried once on the restarted
worker: no episode had started, so none is lost (`WorkerPool`).
"""
from __future__ import annotations

import numbers
import pickle
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

import gymnasium as gym

from agentq.utils.failures import FailureCounts

# Seconds one slot's env call (a reset or a step) may take in a worker pool before the worker counts as hung
# (env_pool.call_timeout_s). An env with its own call limit sets it below this, so that its handler fires
# first (ScienceWorld's JVM: envs/scienceworld/jvm.py, CALL_TIMEOUT_S).
CALL_TIMEOUT_S = 120.0


@dataclass
class EnvResult:
    """One slot's answer to a reset or step: the Gymnasium 5-tuple, or ok=False with the error
    (the env or its worker died or hung; the episode on that slot is lost)."""

    slot: int
    ok: bool
    obs: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    recovered: str | None = None    # a reset retried on a restarted worker: what happened (`WorkerPool`)


@dataclass(frozen=True)
class EnvSpec:
    """How to build one environment (picklable: sent to subprocesses and Ray actors)."""

    name: str                      # agentq registry name or gymnasium id
    kwargs: dict[str, Any]


class EnvPool(Protocol):
    """What the agent loop needs from a pool: `num_envs` slots, batched reset and step."""

    num_envs: int

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """Start an episode on each named slot.

        Args:
            items: (slot, reset kwargs {"seed": .., "options": {"task_id": .., "split": ..}}), slots distinct.
        Returns:
            One `EnvResult` per item, in order (reward 0, not terminated), or ok=False with the error.
        """
        ...

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """Step each named slot's environment with an action.

        Args:
            items: (slot, action text), slots distinct.
        Returns:
            One `EnvResult` per item, in order, or ok=False with the error.
        """
        ...

    def close(self) -> None:
        """Close every environment and stop the workers."""
        ...


class SiblingSlots:
    """What a pool of workers with several slots each must remember when it restarts one: the
    restarted worker builds fresh envs for *all* its slots, so an episode on a slot that was not in
    the failing call (a sibling) has lost its env too, without being told. Such a slot is marked
    lost; its next step is answered with an error naming the restart (never sent to the fresh env,
    which would fail one turn later with a misleading "reset needed"), until it is reset."""

    def __init__(self) -> None:
        self._live: set[int] = set()          # slots with an episode under way (reset, not yet ended)
        self._lost: dict[int, str] = {}       # slot → why its episode is gone

    def answer_lost(self, cmd: str, items: Sequence[tuple[int, Any]]) -> tuple[list, dict[int, EnvResult]]:
        """(the items to send on, the error results of lost slots' steps). A reset starts afresh."""
        if cmd == "reset":
            for slot, _ in items:
                self._lost.pop(slot, None)
            return list(items), {}
        lost = {slot: EnvResult(slot, ok=False, error=self._lost[slot]) for slot, _ in items if slot in self._lost}
        return [it for it in items if it[0] not in lost], lost

    def record(self, results: Iterable[EnvResult]) -> None:
        """Note which slots have an episode under way after a call's results."""
        for r in results:
            if r.ok and not (r.terminated or r.truncated):
                self._live.add(r.slot)
            else:
                self._live.discard(r.slot)

    def restarted(self, worker: str, slots: Iterable[int], in_call: Sequence[int], why: str) -> None:
        """`worker` (e.g. "env worker 1") was restarted, rebuilding the envs of `slots`, because of a
        call for the slots `in_call` (which get their own error); its other live slots are lost."""
        cause = f"; its call for slot(s) {sorted(in_call)}: {why}" if in_call else f" ({why})"
        for slot in slots:
            if slot in self._live and slot not in in_call:
                self._live.discard(slot)
                self._lost[slot] = (f"{worker} restarted while this episode ran{cause}. This slot's environment "
                                    "was rebuilt, so the episode's state is gone")


def check_items(cmd: str, items: Sequence[Any], num_envs: int) -> None:
    """Refuse a malformed `reset` / `step` call before any of it runs, so a bad call costs no episode.

    Raises:
        TypeError: an item is not a (slot, payload) pair, a slot not an int, a reset's kwargs not a
        dict, a step's action not a str.
        ValueError: a slot outside 0 … num_envs−1, or named twice (its two results would collide).
    """
    what = "reset kwargs" if cmd == "reset" else "action"
    seen: set[int] = set()
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"env pool {cmd}: each item must be a (slot, {what}) pair, got {item!r:.80}")
        slot, payload = item
        if isinstance(slot, bool) or not isinstance(slot, numbers.Integral):
            raise TypeError(f"env pool {cmd}: slot must be an int, got {type(slot).__name__} ({slot!r:.40})")
        if not 0 <= int(slot) < num_envs:
            raise ValueError(f"env pool {cmd}: slot {slot} does not exist; valid: 0 … {num_envs - 1}")
        if int(slot) in seen:
            raise ValueError(f"env pool {cmd}: slot {slot} named twice in one call")
        seen.add(int(slot))
        if cmd == "reset" and not isinstance(payload, Mapping):
            raise TypeError(f"env pool reset: slot {slot}'s reset kwargs must be a dict like "
                            f"{{'seed': .., 'options': {{'task_id': ..}}}}, got {type(payload).__name__}")
        if cmd == "step" and not isinstance(payload, str):
            raise TypeError(f"env pool step: slot {slot}'s action must be a str, got {type(payload).__name__}")


def encode_items(cmd: str, items: Sequence[tuple[int, Any]]) -> bytes:
    """One worker's share of a call, pickled by the pool before anything is sent (a payload that cannot
    be pickled raises here, so no worker runs half a call)."""
    try:
        return pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(f"env pool {cmd}: the items of slot(s) {[it[0] for it in items]} cannot be sent to a "
                        f"worker ({type(e).__name__}: {e}); nothing was sent") from None


def pack_results(results: list[EnvResult]) -> bytes:
    """A worker's results pickled for the trip back. A result that cannot be pickled (an env's info
    holding a lock, ...) becomes an error result: that episode is lost, not the worker or the call's
    other results (the subprocess and Ray pools pickle alike, so they answer alike)."""
    try:
        return pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return pickle.dumps([_sendable(r) for r in results], protocol=pickle.HIGHEST_PROTOCOL)


def _sendable(r: EnvResult) -> EnvResult:
    try:
        pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL)
        return r
    except Exception as e:
        return EnvResult(r.slot, ok=False, error=f"the environment's result cannot be sent back to the pool "
                                                 f"({type(e).__name__}: {e}); the episode is lost")


def make_env(spec: EnvSpec) -> gym.Env:
    """Build one environment from its spec (in whichever process calls it).

    Args:
        spec: the registry name and constructor kwargs.
    Returns:
        The Gymnasium environment.
    """
    import agentq.envs as envs   # registers agentq/* ids in this process

    return envs.make(spec.name, **spec.kwargs)


class WorkerCore:
    """Owns the environments of some slots and runs commands on them. Shared by every pool kind,
    so in-process, subprocess and Ray pools behave identically."""

    def __init__(self, spec: EnvSpec, slots: list[int]):
        self.spec = spec
        self.envs: dict[int, gym.Env] = {}
        for s in slots:
            self.envs[s] = make_env(spec)

    def _run(self, slot: int, fn: Callable[[gym.Env], EnvResult]) -> EnvResult:
        try:
            return fn(self.envs[slot])
        except Exception as e:   # the episode is lost, the worker lives on; rebuild the env
            # the innermost frames: the env's own line and agentq's hook around it (limit=4, the
            # outermost, showed only this worker and gymnasium's wrappers)
            err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-6)}"
            try:
                self.envs[slot].close()
            except Exception:
                pass
            try:
                self.envs[slot] = make_env(self.spec)
            except Exception as e2:
                err += f"\n(rebuilding the env failed too: {e2})"
            return EnvResult(slot, ok=False, error=err)

    def reset(self, items: list[tuple[int, dict]], progress: Callable[[], None] | None = None) -> list[EnvResult]:
        """`EnvPool.reset` for this core's slots (an env that raises is rebuilt; its result is an error).
        `progress`: called after each slot's call (a worker tells the pool, which then finds a hang
        within one `call_timeout_s` of the last call that finished)."""
        return self._each(self._results("reset", items), progress)

    def step(self, items: list[tuple[int, str]], progress: Callable[[], None] | None = None) -> list[EnvResult]:
        """`EnvPool.step` for this core's slots (an env that raises is rebuilt; its result is an error);
        `progress` as in `reset`."""
        return self._each(self._results("step", items), progress)

    def _results(self, cmd: str, items: list) -> Iterator[EnvResult]:
        """The result of each slot's `cmd` ("reset" or "step"), in turn, as its env call ends."""
        if cmd not in ("reset", "step"):
            raise ValueError(f"unknown worker command {cmd!r}")
        for slot, arg in items:
            if cmd == "reset":
                yield self._run(slot, lambda env: EnvResult(slot, True, *_pair(env, env.reset(**arg))))
            else:
                yield self._run(slot, lambda env: _step_result(slot, env, env.step(arg)))

    @staticmethod
    def _each(results: Iterator[EnvResult], progress: Callable[[], None] | None) -> list[EnvResult]:
        out = []
        for r in results:
            out.append(r)
            if progress is not None:
                progress()
        return out

    def call(self, cmd: str, blob: bytes, progress: Callable[[], None] | None = None) -> bytes:
        """`reset` or `step` on items pickled by `encode_items`; the results pickled by `pack_results`
        (how the subprocess pool calls a worker); `progress` as in `reset`."""
        return pack_results(self._each(self._results(cmd, pickle.loads(blob)), progress))

    def call_ticking(self, cmd: str, blob: bytes, tick_s: float) -> Iterator[tuple[str, Any]]:
        """`call` as a stream (how the Ray pool calls an actor): ("tick", 0) as it starts, ("tick", the
        slots' calls finished so far) after a slot's call that ends `tick_s` or more after the last
        tick, then ("ok", the packed results). A tick after every call cost a Ray object each (~0.2 ms
        of the actor's time, more than a fast env's step); a call ends at most `tick_s` after a tick
        without one, which the pool adds to its wait (`RayPool._answer`)."""
        out: list[EnvResult] = []
        told = time.monotonic()
        yield "tick", 0             # the actor's clock starts here, not at the send (it may start later)
        for r in self._results(cmd, pickle.loads(blob)):
            out.append(r)
            if time.monotonic() - told >= tick_s:
                told = time.monotonic()
                yield "tick", len(out)
        yield "ok", pack_results(out)

    def close(self) -> None:
        """Close every environment (errors while closing are ignored)."""
        for env in self.envs.values():
            try:
                env.close()
            except Exception:
                pass


def _pair(env: gym.Env, reset_out: Any) -> tuple[str, float, bool, bool, dict]:
    if not _returns(reset_out, 2):
        raise _contract_error(env, "reset", "(obs, info)", reset_out)
    obs, info = reset_out
    return obs, 0.0, False, False, info


def _step_result(slot: int, env: gym.Env, out: Any) -> EnvResult:
    if not _returns(out, 5):
        raise _contract_error(env, "step", "(obs, reward, terminated, truncated, info)", out)
    obs, reward, terminated, truncated, info = out
    return EnvResult(slot, True, obs, float(reward), bool(terminated), bool(truncated), info)


def _returns(out: Any, n: int) -> bool:
    """`out` is a Gymnasium result of `n` items, its info (the last) a mapping."""
    return isinstance(out, tuple) and len(out) == n and isinstance(out[-1], Mapping)


def _contract_error(env: gym.Env, method: str, shape: str, out: Any) -> TypeError:
    """An env's public `method` (overridden, not its `_reset_task`/`_step_task` hook) returned other
    than Gymnasium's `shape`: named, not a "too many values to unpack" from the pool's code."""
    from agentq.envs.base import returned_types     # a broken env only: this module loads without the envs

    return TypeError(f"{type(env.unwrapped).__name__}.{method} must return {shape} as Gymnasium's Env.{method} does, "
                     f"got {returned_types(out)}")


class InlinePool:
    """All environments in this process, stepped one after another (tests, debugging)."""

    def __init__(self, spec: EnvSpec, num_envs: int):
        self.num_envs = num_envs
        self.core = WorkerCore(spec, list(range(num_envs)))

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """See `EnvPool.reset`."""
        check_items("reset", items, self.num_envs)
        return self.core.reset(items)

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """See `EnvPool.step`."""
        check_items("step", items, self.num_envs)
        return self.core.step(items)

    def close(self) -> None:
        """See `EnvPool.close`."""
        self.core.close()


@dataclass
class Heard:
    """What a pool read from a busy worker while it waited on another (workers tick as their env calls
    end): the time of its last tick and how many calls had finished by then, then perhaps the whole
    answer (`ended`) or why reading it failed."""

    last: float = 0.0
    ticks: int = 0
    ended: bool = False
    answer: Any = None
    failure: BaseException | None = None


def hung_message(cmd: str, n: int, ticks: int, call_timeout_s: float, tick_s: float | None = None) -> str:
    """Why a worker sent `cmd` for `n` slots counts as hung once no env call ended within
    `call_timeout_s` of the last of its `ticks` (the same words for both pool kinds where each call
    ticks). `tick_s`: a Ray actor's spacing of its ticks (`WorkerCore.call_ticking`), where calls that
    end soon after a tick are counted only at the next."""
    if tick_s is not None:
        what = (f"no env call finished within {call_timeout_s:g} s ({ticks} reported finished; an actor "
                f"reports at most every {tick_s:g} s)")
    elif not ticks:
        what = f"its first env call did not finish within {call_timeout_s:g} s"
    elif ticks >= n:
        what = f"all {n} env calls finished, the answer did not come within {call_timeout_s:g} s"
    else:
        what = f"{ticks} env call(s) finished, the next did not finish within {call_timeout_s:g} s"
    return f"hung: no answer to {cmd} of {n} slot(s): {what} (env_pool.call_timeout_s={call_timeout_s:g}); killed"


class WorkerPool:
    """The dispatch that the subprocess and Ray pools share, so both answer a call alike.

    Slot s lives in worker s mod num_workers. A call's items are checked and pickled before any is
    sent (`check_items`, `encode_items`): bad input raises and runs nothing. Every worker's answer, or
    its death or hang (no answer within n × `call_timeout_s` for n items; a subprocess worker, which
    ticks after each env call, within `call_timeout_s` of its last tick), is read before any worker
    restarts, so no answer is left behind for a later call; a call interrupted before its answers were
    read (KeyboardInterrupt, ...) restarts those workers at the next call for the same reason. A dead or
    hung worker is killed and started again (`SiblingSlots` for its other slots); a reset it died in (one
    found dead at the call: killed while idle) is sent once more to the restarted worker, as no episode
    had started on its slots (`_retry_resets`; its answers are marked `EnvResult.recovered`, counted in
    `recovered_episodes`). A worker that cannot be started again is down: its slots answer with errors
    and it is tried again at its next call.
    No endless restart loop: after `max_failures_in_a_row` failed starts of one worker in a row, or as
    many calls of one command (reset, step) in a row that it died or hung in without completing one (it
    starts, then dies at every step), the call raises, once its results are in and the worker restarted.
    Each command is counted on its own: a completed step starts the count of steps again, while the
    resets a restarted worker completes between its deaths in steps (an agent loop's reset, step, ...)
    do not (`FailureCounts`, shared with the rollout workers). Subclasses provide `_launch`, `_await`,
    `_kill`, `_submit`, `_answer` and `close`.
    """

    kind = "env worker"             # how errors name a worker ("env worker 1")
    max_failures_in_a_row = 3       # of one worker in a row: failed starts, or calls of one command it died / hung in

    def _setup(self, spec: EnvSpec, num_envs: int, num_workers: int, call_timeout_s: float,
               start_timeout_s: float) -> None:
        if num_workers < 1:
            raise ValueError(f"env_pool.num_workers must be ≥ 1, got {num_workers}")
        for key, value in (("call_timeout_s", call_timeout_s), ("start_timeout_s", start_timeout_s)):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"env_pool.{key} must be > 0, got {value!r}")
        self.spec, self.num_envs = spec, num_envs
        self.call_timeout_s, self.start_timeout_s = float(call_timeout_s), float(start_timeout_s)
        self.num_workers = min(num_workers, num_envs)
        self._slots = {w: [s for s in range(num_envs) if s % self.num_workers == w] for w in range(self.num_workers)}
        self._siblings = SiblingSlots()
        self.restarts = 0
        self.recovered_episodes = 0      # slots whose reset answered on a retry after their worker died in it
        self._failures = FailureCounts(self.max_failures_in_a_row, lambda w: f"{self.kind} {w} ({self.spec.name})")
        self._pending: set[int] = set()              # workers sent a command whose answer was not read
        self._heard: dict[int, Heard] = {}           # busy worker → what was read from it before its turn (`_hear`)

    # ------------------------------------------------------------------ one worker (subclasses)
    def _launch(self, w: int) -> None:
        """Start worker `w` without waiting for it."""
        raise NotImplementedError

    def _await(self, w: int, timeout: float) -> str | None:
        """Wait until `w` has built its envs: None, or why it did not (then it is killed)."""
        raise NotImplementedError

    def _kill(self, w: int) -> None:
        raise NotImplementedError

    def _submit(self, w: int, cmd: str, blob: bytes) -> Any:
        """Send `w` a command: a handle for `_answer`, or None when it cannot be sent (dead)."""
        raise NotImplementedError

    def _answer(self, w: int, handle: Any, timeout: float, cmd: str, sent_at: float, n: int) -> tuple[bytes | None, str]:
        """(the packed results, ""), or (None, "hung") when none came within `timeout` s, or (None, why it
        failed: "died (...)", "hung: ..." found sooner, ...) for the answer to `cmd` of `n` slots sent
        at `sent_at` (time.monotonic())."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    #: what reading a busy worker's next message (`_read_next`) raises when the worker failed
    _unreadable: tuple[type[BaseException], ...] = ()

    def _read_next(self, v: int) -> tuple[str, Any]:
        """The next message of busy worker `v`, which its pool found ready to read: ("tick", what its
        pool notes of it, `_note_tick`) or the answer's (status, payload)."""
        raise NotImplementedError

    def _note_tick(self, heard: Heard, payload: Any) -> None:
        """Note in `heard` a tick read now (its `last` and `ticks`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared
    def _hear(self, v: int) -> None:
        """Read one message of busy worker `v` before its turn (while the pool waits on another): a tick
        is noted, an answer or a failure kept for `_answer` (which reports it as if read then)."""
        heard = self._heard.setdefault(v, Heard())
        try:
            status, payload = self._read_next(v)
        except self._unreadable as e:
            heard.failure, heard.ended = e, True
            return
        if status == "tick":
            self._note_tick(heard, payload)
        else:
            heard.answer, heard.ended = payload, True

    def _start_all(self) -> None:
        """Start every worker and wait for all (one `start_timeout_s`); if one fails, none is left."""
        try:
            for w in range(self.num_workers):
                self._launch(w)
            deadline = time.monotonic() + self.start_timeout_s
            for w in range(self.num_workers):
                problem = self._await(w, max(0.0, deadline - time.monotonic()))
                if problem is not None:
                    raise RuntimeError(f"{self.kind} {w} failed to start ({self.spec.name}): {problem}")
        except BaseException:
            self.close()
            raise

    def _restart(self, why: dict[int, str], in_call: dict[int, list[int]]) -> dict[int, str | None]:
        """Kill and start again each worker of `why` (all launched before any is awaited); their live
        slots outside `in_call` are lost. Returns worker → None (up again) or why it is down."""
        for w in why:
            self._kill(w)
            # pending until its start message is read: a call interrupted before that (Ctrl-C) leaves the
            # message in the pipe, and the next call must not read it as its answer (`_dispatch` restarts it)
            self._pending.add(w)
            self._launch(w)
            self.restarts += 1
        deadline = time.monotonic() + self.start_timeout_s
        out: dict[int, str | None] = {}
        for w, cause in why.items():
            out[w] = self._await(w, max(0.0, deadline - time.monotonic()))
            self._pending.discard(w)
            self._failures.start_ended(w, out[w])
            self._siblings.restarted(f"{self.kind} {w}", self._slots[w], in_call.get(w, []), cause)
        return out

    def _dispatch(self, cmd: str, items: Sequence[tuple[int, Any]]) -> list[EnvResult]:
        check_items(cmd, items, self.num_envs)
        if self._pending:           # an interrupted call's answers are still in flight: never read them as ours
            stale, self._pending = self._pending, set()
            self._restart({w: "a call to it was interrupted before its answer was read" for w in sorted(stale)}, {})
        send, results = self._siblings.answer_lost(cmd, items)
        by_worker: dict[int, list] = {}
        for it in send:
            by_worker.setdefault(it[0] % self.num_workers, []).append(it)
        blobs = {w: encode_items(cmd, its) for w, its in by_worker.items()}
        # a worker left down by a failed start is tried again first; still down, its items are answered
        for w, problem in self._restart({w: "it was down" for w in blobs if w in self._failures.down}, {}).items():
            if problem is not None:
                del blobs[w]
                results.update(_errors(by_worker[w], f"{self.kind} {w} is down: it could not be started ({problem})"))
        failed = self._exchange(cmd, by_worker, blobs, results)
        in_call = {w: [it[0] for it in by_worker[w]] for w in failed}
        up = self._restart(failed, in_call)
        errors = {w: f"{self.kind} {w} {failed[w]}; {_restart_note(problem)}" for w, problem in up.items()}
        if cmd == "reset":
            errors = self._retry_resets(by_worker, blobs, failed, up, results, errors)
        for w, error in errors.items():
            results.update(_errors(by_worker[w], error))
        self._siblings.record(results.values())
        self._failures.raise_if_given_up()
        return [results[it[0]] for it in items]

    def _exchange(self, cmd: str, by_worker: dict[int, list], blobs: dict[int, bytes],
                  results: dict[int, EnvResult]) -> dict[int, str]:
        """Send each worker its blob, then read every answer into `results`; returns worker → why it
        failed (died, hung) for those that did not answer."""
        self._pending.update(blobs)
        handles = {w: self._submit(w, cmd, blob) for w, blob in blobs.items()}
        t0 = time.monotonic()
        failed: dict[int, str] = {}
        for w, handle in handles.items():
            n = len(by_worker[w])
            budget = self.call_timeout_s * n       # every worker started at t0: its own budget from then
            reply, why = self._answer(w, handle, max(0.0, t0 + budget - time.monotonic()), cmd, t0, n)
            self._pending.discard(w)
            if reply is not None:
                results.update((r.slot, r) for r in pickle.loads(reply))
                self._failures.call_completed(w, cmd)
                continue
            if why == "hung":
                why = (f"hung: no answer to {cmd} of {n} slot(s) within {budget:g} s "
                       f"(env_pool.call_timeout_s={self.call_timeout_s:g}); killed")
            failed[w] = why
            self._failures.call_failed(w, cmd, why)
        return failed

    def _retry_resets(self, by_worker: dict[int, list], blobs: dict[int, bytes], failed: dict[int, str],
                      up: dict[int, str | None], results: dict[int, EnvResult], errors: dict[int, str]) -> dict[int, str]:
        """Send a reset again, once, to each worker that died in it (found dead at the call, e.g. killed
        while idle, or died during it) and is up again: no episode on its slots has started, so nothing
        is lost by playing them on the fresh worker. A hang is not retried (the env may hang again: a
        second wait of call_timeout_s), nor a worker whose failed resets in a row reached the give-up
        limit. Each try counts as a call (`FailureCounts`) and each restart in `restarts`.

        Args:
            by_worker, blobs: the call's items and pickled shares by worker; failed: worker → why it
            failed the first try; up: its restart (None: up); results: filled in; errors: worker → the
            error its slots would answer with.
        Returns:
            `errors` less the workers whose retry answered (their results marked `recovered`), the
            others' errors naming both tries.
        """
        retry = {w: blobs[w] for w, why in failed.items()
                 if up[w] is None and why.startswith("died") and not self._given_up(w, "reset")}
        again = self._exchange("reset", by_worker, retry, results)
        up_again = self._restart(again, {w: [it[0] for it in by_worker[w]] for w in again})
        errors = dict(errors)
        for w in retry:
            first = f"{self.kind} {w} {failed[w]}; restarted"
            if w in again:
                errors[w] = f"{first}, and the reset retried on it: {again[w]} again; {_restart_note(up_again[w])}"
                continue
            del errors[w]
            for slot, _ in by_worker[w]:
                if results[slot].ok:        # an env that raised in the retried reset is that env's error
                    results[slot].recovered = f"{first}; the reset was retried on it (no episode had started)"
                    self.recovered_episodes += 1
        return errors

    def _given_up(self, w: int, cmd: str) -> bool:
        """Whether worker `w`'s failed calls of `cmd` in a row reached the limit (the call then raises)."""
        return self._failures.failed_calls.get((w, cmd), (0, ""))[0] >= self._failures.limit

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """See `EnvPool.reset`; a dead or hung worker's slots answer with errors (the worker restarts). A
        worker that died in the reset is restarted and the reset retried on it once (`_retry_resets`)."""
        return self._dispatch("reset", items)

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """See `EnvPool.step`; a dead or hung worker's slots answer with errors (the worker restarts)."""
        return self._dispatch("step", items)


def _restart_note(problem: str | None) -> str:
    """How a worker's restart went, for its slots' errors."""
    return "restarted" if problem is None else f"could not be restarted ({problem}); tried again at its next call"


def _errors(items: Iterable[tuple[int, Any]], error: str) -> dict[int, EnvResult]:
    return {it[0]: EnvResult(it[0], ok=False, error=error) for it in items}
