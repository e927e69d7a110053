"""Bounded start-up of a py4j gateway JVM (ScienceWorld's and TextWorldExpress's).

A py4j `GatewayServer` prints the port it listens on as the first line of its stdout. py4j's own
`launch_gateway` reads that line with a plain `readline()`, which waits forever for a JVM that
started but never gets that far (suspended by a debug agent in `JAVA_TOOL_OPTIONS` or the JVM
options, stopped, a `java` wrapper that hangs): the env's `reset()` would hang, and with it an
inline pool's trainer, which has no worker to kill. Here that wait has a deadline.
"""
from __future__ import annotations

import math
import os
import select
import shutil
import subprocess
import threading
import time
from typing import Sequence

from agentq.utils.process import dies_with_this_process


def java_executable(needed_by: str, min_version: int) -> str:
    """`$JAVA_HOME/bin/java`, else `java` on PATH.

    Args:
        needed_by: the environment that needs Java; min_version: the oldest Java it runs on (both
            named in the error).
    Returns:
        The path of the java executable.
    Raises:
        RuntimeError: neither exists; the message says how to install Java, and names a JAVA_HOME that
            holds no bin/java (it said "JAVA_HOME is not set" of a wrong one).
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    java = shutil.which("java")
    if java is None:
        why = (f"JAVA_HOME={home} has no bin/java and there is no `java` on PATH. Set JAVA_HOME to the folder that "
               "holds bin/java, or unset it and put `java` on PATH" if home else
               "no `java` on PATH and JAVA_HOME is not set")
        raise RuntimeError(f"{needed_by} needs Java (>= {min_version}; tested with OpenJDK 17): {why}. "
                           "On Debian/Ubuntu: apt-get install openjdk-17-jre-headless")
    return java


def first_line(proc: subprocess.Popen, timeout_s: float, what: str, setting: str) -> bytes:
    """The first line `proc` writes to its stdout, waiting at most `timeout_s` for it.

    Args:
        proc: a process started with stdout=PIPE, whose stdout nothing has read yet.
        timeout_s: seconds the whole line may take.
        what: the process, for the error ("the ScienceWorld JVM").
        setting: the option that raises the limit, for the error.
    Returns:
        The line with its newline, or what came before EOF (the process exited first).
    Raises:
        TimeoutError: no whole line within `timeout_s`; the process was killed.
    """
    assert proc.stdout is not None
    fd, line = proc.stdout.fileno(), b""
    # poll(), not select(): select() refuses descriptors ≥ 1024 (a trainer with many envs has them)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    deadline = time.monotonic() + timeout_s
    finished = False
    try:
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            # a minute at most per wait: poll() takes milliseconds in a C int (a month would overflow)
            if left > 0 and not poller.poll(math.ceil(min(left, 60.0) * 1000)):
                continue                      # the deadline is checked again above
            if left <= 0:
                raise TimeoutError(f"{what} (pid {proc.pid}) did not print its port within {timeout_s:g} s of "
                                   f"starting (killed); a slower start needs a larger {setting}. A JVM that never "
                                   f"gets there may be suspended by a debug agent (JAVA_TOOL_OPTIONS, JVM options). "
                                   f"Output so far: {line[-200:]!r}")
            byte = os.read(fd, 1)       # one byte at a time: what follows the line stays in the pipe
            if not byte:
                break
            line += byte
        finished = True
    finally:
        if not finished:                # timed out, or an error while waiting: no JVM is left behind
            proc.kill()
            proc.wait()
    return line


def launch_gateway(java: str, classpath: str, cwd: str | None, javaopts: Sequence[str], timeout_s: float,
                   what: str, setting: str) -> tuple[int, subprocess.Popen]:
    """py4j's `launch_gateway(classpath=..., die_on_exit=True, cwd=..., javaopts=..., return_proc=True)`
    with the wait for the port bounded (`first_line`); the JVM's stdout is drained, its stderr dropped.

    Args:
        java: the java executable (`java_executable`).
        classpath: the engine's jar(s); py4j's own jar is prepended.
        cwd: the JVM's working folder. javaopts: options before the main class.
        timeout_s, what, setting: as in `first_line`.
    Returns:
        (the gateway's port, the JVM process).
    Raises:
        RuntimeError: the JVM exited or printed something else first.
        TimeoutError: no port within `timeout_s` (the JVM was killed).
    """
    from py4j.java_gateway import find_jar_path

    cmd = [java, "-classpath", os.pathsep.join((find_jar_path(), classpath)), *javaopts,
           "py4j.GatewayServer", "--die-on-broken-pipe", "0"]
    # its own session: a terminal's Ctrl-C (SIGINT to the foreground process group) ended the JVM under
    # the env's feet, each call in flight then a py4j traceback; it ends with this process instead (stdin
    # pipe, --die-on-broken-pipe; the parent-death signal)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd=cwd, bufsize=0, start_new_session=True, preexec_fn=dies_with_this_process())
    line = first_line(proc, timeout_s, what, setting)
    if not line.strip().isdigit():
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what} failed to start ({' '.join(cmd)}): its first output was {line[-500:]!r}")
    threading.Thread(target=_drain_and_reap, args=(proc,), daemon=True, name=f"jvm-{proc.pid}-stdout").start()
    return int(line), proc


def silence_client(gateway) -> None:
    """Mark `gateway`'s py4j client disconnected, so that it sends nothing more (py4j has no public
    switch for this). Every py4j JavaObject tells the JVM when Python collects it; through a client
    whose JVM has stopped, each of those messages is a refused connection that py4j logs as an ERROR
    with a traceback, from inside the garbage collector, long after the JVM ended (on CPython 3.11
    such a traceback formatted in the middle of an `ast.parse` broke the parse). py4j's own
    `close()` closes the client's sockets but leaves it connected: the next message opens a new one.
    Call it before closing the client: a collection during the close must not send either."""
    client = getattr(gateway, "_gateway_client", None)
    if client is not None:
        client.is_connected = False


def _drain_and_reap(proc: subprocess.Popen) -> None:
    """Read the JVM's stdout until EOF (a JVM blocks once the pipe is full), then reap it: EOF means
    it exited, and an env that shut its gateway down does not wait for the process (a zombie)."""
    assert proc.stdout is not None
    try:
        while os.read(proc.stdout.fileno(), 1 << 16):
            pass
    except (OSError, ValueError):
        pass
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:      # stdout closed, process alive: whoever stops it reaps it
        pass
