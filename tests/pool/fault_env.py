"""A tiny `TextEnv` that misbehaves on request, for the pool tests (built as "fault_env:FaultEnv" in
subprocess workers and Ray actors, which find this folder on sys.path).

Actions: "hang" sleeps for an hour, "slow" for a second, "crash" kills the process, "pid" names it,
"lock" returns an info the pool cannot send back (a lock), anything else echoes. Tasks "hang" and "crash" do the same on reset.
`flag`: a file; while it exists, building the env fails (a worker that cannot come back).
`fail_once`: a file; the first build that creates it fails (one worker of several cannot start).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from agentq.envs.base import TaskStep, TextEnv


class FaultEnv(TextEnv):
    def __init__(self, split: str | None = None, max_steps: int | None = None, expert: bool = False,
                 flag: str | None = None, fail_once: str | None = None):
        super().__init__(split=split, max_steps=max_steps, expert=expert)
        if flag and Path(flag).exists():
            raise RuntimeError(f"cannot build: {flag} exists")
        if fail_once:
            try:
                os.close(os.open(fail_once, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("cannot build: this is the first build")

    def _tasks(self, split: str) -> list[str]:
        return [f"t/{i}" for i in range(10)] + ["hang", "crash"]

    def _act(self, what: str) -> TaskStep:
        if what == "hang":
            time.sleep(3600)
        if what == "slow":
            time.sleep(1)
        if what == "crash":
            os._exit(3)
        if what == "lock":
            return TaskStep(obs="locked", extra={"lock": threading.Lock()})
        return TaskStep(obs=f"{what} in pid {os.getpid()}" if what == "pid" else f"echo {what}")

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        return "goal", self._act(task_id) if task_id in ("hang", "crash") else TaskStep(obs=f"start {task_id}")

    def _step_task(self, action: str) -> TaskStep:
        return self._act(action)
