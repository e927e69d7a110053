"""Environment pools: many environment instances stepped in parallel, behind one interface.

The agent loop addresses environments by *env slot* (0 … num_envs−1). A pool runs each slot's
environment somewhere (this process, a subprocess worker, a Ray actor); `reset` and `step` take
a batch of slot commands and return one `EnvResult` per command, in order. A slot whose
environment or worker died yields `EnvResult(ok=False, error=...)`; the pool restarts what died,
so the next `reset` of that slot works, and the agent loop reports the episode as errored.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

import gymnasium as gym


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
        for slot in slots:
            if slot in self._live and slot not in in_call:
                self._live.discard(slot)
                self._lost[slot] = (f"{worker} restarted while this episode ran; its call for slot(s) "
                                    f"{sorted(in_call)}: {why}. This slot's environment was rebuilt, so the "
                                    "episode's state is gone")


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
            err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
            try:
                self.envs[slot].close()
            except Exception:
                pass
            try:
                self.envs[slot] = make_env(self.spec)
            except Exception as e2:
                err += f"\n(rebuilding the env failed too: {e2})"
            return EnvResult(slot, ok=False, error=err)

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """`EnvPool.reset` for this core's slots (an env that raises is rebuilt; its result is an error)."""
        return [self._run(slot, lambda env: EnvResult(slot, True, *_pair(env.reset(**kw)))) for slot, kw in items]

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """`EnvPool.step` for this core's slots (an env that raises is rebuilt; its result is an error)."""
        return [self._run(slot, lambda env: _step_result(slot, env.step(action))) for slot, action in items]

    def close(self) -> None:
        """Close every environment (errors while closing are ignored)."""
        for env in self.envs.values():
            try:
                env.close()
            except Exception:
                pass


def _pair(reset_out: tuple[str, dict]) -> tuple[str, float, bool, bool, dict]:
    obs, info = reset_out
    return obs, 0.0, False, False, info


def _step_result(slot: int, out: tuple) -> EnvResult:
    obs, reward, terminated, truncated, info = out
    return EnvResult(slot, True, obs, float(reward), bool(terminated), bool(truncated), info)


class InlinePool:
    """All environments in this process, stepped one after another (tests, debugging)."""

    def __init__(self, spec: EnvSpec, num_envs: int):
        self.num_envs = num_envs
        self.core = WorkerCore(spec, list(range(num_envs)))

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """See `EnvPool.reset`."""
        return self.core.reset(items)

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """See `EnvPool.step`."""
        return self.core.step(items)

    def close(self) -> None:
        """See `EnvPool.close`."""
        self.core.close()
