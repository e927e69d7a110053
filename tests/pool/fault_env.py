"""A tiny `TextEnv` that misbehaves on request, for the pool tests (built as "fault_env:FaultEnv" in
subprocess workers and Ray actors, which find this folder on sys.path).

Actions: "hang" sleeps for an hour, "slow" for a second, "nap" for 5 ms, "crash" kills the process, "pid"
names it, "lock" returns an info the pool cannot send back (a lock), "hog" takes memory (64 MiB every 50 ms, up to
16 GiB) until something kills the process, "big" answers with a `BIG`-character obs (more than a pipe
holds), "bigstop" writes the start of an answer of 2 × `BIG` bytes on a subprocess worker's pipe and then
stops the worker (SIGSTOP), "clock" takes 5 ms and answers with the host's monotonic time at its end,
anything else echoes. Tasks "hang"
and "crash" do the same on reset.
`flag`: a file; while it exists, building the env fails (a worker that cannot come back).
`fail_once`: a file; the first build that creates it fails (one worker of several cannot start).
`hang_marks`: a folder; "hang" first writes a file named by the pid there (the test knows it hangs now).
`engine`: start a stand-in engine subprocess that, like the JVMs' py4j --die-on-broken-pipe, runs until
its stdin pipe from this process closes; "pid" then also names its pid ("... engine <pid>").
"""
from __future__ import annotations

import gc
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from agentq.envs.base import TaskStep, TextEnv

BIG = 4 * 2 ** 20      # characters: far more than a socket pair's buffer (~200 kB)


def _send_part_then_stop() -> None:
    """Write the length header of a 2 × `BIG`-byte message and its first 64 KiB (less than a socket pair's
    buffer holds, so the write returns whether or not the pool reads) on this worker's pipe to the pool,
    then stop (SIGSTOP): an answer begun, the rest never coming. The worker's one open `Connection` is
    its end of that pipe."""
    conn = next(o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed)
    os.write(conn.fileno(), struct.pack("!i", 2 * BIG) + b"s" * 2 ** 16)
    os.kill(os.getpid(), signal.SIGSTOP)


class FaultEnv(TextEnv):
    def __init__(self, split: str | None = None, max_steps: int | None = None, expert: bool = False,
                 flag: str | None = None, fail_once: str | None = None, hang_marks: str | None = None,
                 engine: bool = False):
        super().__init__(split=split, max_steps=max_steps, expert=expert)
        self.hang_marks, self.engine = hang_marks, None
        if flag and Path(flag).exists():
            raise RuntimeError(f"cannot build: {flag} exists")
        if fail_once:
            try:
                os.close(os.open(fail_once, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("cannot build: this is the first build")
        if engine:      # its own session, as the ScienceWorld JVM: only the closed pipe can end it
            self.engine = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"],
                                           stdin=subprocess.PIPE, start_new_session=True)

    def _tasks(self, split: str) -> list[str]:
        return [f"t/{i}" for i in range(10)] + ["hang", "crash"]

    def _act(self, what: str) -> TaskStep:
        if what == "hang":
            if self.hang_marks:
                Path(self.hang_marks, str(os.getpid())).touch()
            time.sleep(3600)
        if what == "slow":
            time.sleep(1)
        if what == "nap":
            time.sleep(0.005)
        if what == "clock":
            time.sleep(0.005)
            return TaskStep(obs=f"clock {time.monotonic()!r}")
        if what == "raise":
            raise RuntimeError("boom in the env's own code")
        if what == "crash":
            os._exit(3)
        if what == "hog":
            held = []
            for _ in range(256):
                held.append(b"x" * 2 ** 26)     # written, so resident
                time.sleep(0.05)
        if what == "big":
            return TaskStep(obs="b" * BIG)
        if what == "bigstop":
            _send_part_then_stop()
        if what == "lock":
            return TaskStep(obs="locked", extra={"lock": threading.Lock()})
        if what == "pid" and self.engine is not None:
            return TaskStep(obs=f"pid in pid {os.getpid()} engine {self.engine.pid}")
        return TaskStep(obs=f"{what} in pid {os.getpid()}" if what == "pid" else f"echo {what}")

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        return "goal", self._act(task_id) if task_id in ("hang", "crash") else TaskStep(obs=f"start {task_id}")

    def _step_task(self, action: str) -> TaskStep:
        return self._act(action)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.kill()
            self.engine.wait(10)
