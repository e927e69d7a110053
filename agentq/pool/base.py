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
from typing import Any, Protocol

import gymnasium as gym


@dataclass
class EnvResult:
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
    num_envs: int

    def reset(self, items: list[tuple[int, dict]]) -> list[EnvResult]:
        """items: (slot, reset kwargs {"seed": .., "options": {"task_id": .., "split": ..}})."""

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        """items: (slot, action)."""

    def close(self) -> None: ...


def make_env(spec: EnvSpec) -> gym.Env:
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

    def _run(self, slot: int, fn) -> EnvResult:
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
        out = []
        for slot, kw in items:
            r = self._run(slot, lambda env, kw=kw: EnvResult(slot, True, *_pair(env.reset(**kw))))
            out.append(r)
        return out

    def step(self, items: list[tuple[int, str]]) -> list[EnvResult]:
        out = []
        for slot, action in items:
            out.append(self._run(slot, lambda env, a=action: _step_result(slot, env.step(a))))
        return out

    def close(self) -> None:
        for env in self.envs.values():
            try:
                env.close()
            except Exception:
                pass


def _pair(reset_out):
    obs, info = reset_out
    return obs, 0.0, False, False, info


def _step_result(slot, out) -> EnvResult:
    obs, reward, terminated, truncated, info = out
    return EnvResult(slot, True, obs, float(reward), bool(terminated), bool(truncated), info)


class InlinePool:
    """All environments in this process, stepped one after another (tests, debugging)."""

    def __init__(self, spec: EnvSpec, num_envs: int):
        self.num_envs = num_envs
        self.core = WorkerCore(spec, list(range(num_envs)))

    def reset(self, items):
        return self.core.reset(items)

    def step(self, items):
        return self.core.step(items)

    def close(self):
        self.core.close()
