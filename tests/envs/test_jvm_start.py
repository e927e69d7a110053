"""envs/jvm_start.py: the bounded wait for a gateway JVM's port, on real subprocesses (no JVM needed;
the JVM cases are in test_scienceworld.py and test_textworld_express.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentq.envs.jvm_start import first_line, java_executable, launch_gateway


def _spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, bufsize=0)


def test_a_silent_process_times_out_and_is_killed():
    proc = _spawn("import time; time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"the test JVM \(pid \d+\) did not print its port within 1 s .* "
                                           r"needs a larger some_timeout_s"):
        first_line(proc, 1.0, "the test JVM", "some_timeout_s")
    assert time.monotonic() - t0 < 10
    assert proc.returncode is not None          # killed and reaped


def test_a_partial_line_does_not_count():
    proc = _spawn("import sys, time; sys.stdout.write('12'); sys.stdout.flush(); time.sleep(60)")
    with pytest.raises(TimeoutError, match="Output so far: b'12'"):
        first_line(proc, 1.0, "the test JVM", "some_timeout_s")


def test_the_first_line_is_read_and_the_rest_stays_in_the_pipe():
    proc = _spawn("print(4321); print('chatter')")
    assert first_line(proc, 30.0, "the test JVM", "some_timeout_s") == b"4321\n"
    assert proc.stdout.read() == b"chatter\n"
    proc.wait(timeout=30)


def test_a_pipe_above_descriptor_1024_is_read():
    """A trainer with many envs holds many descriptors; select() refused one ≥ 1024 (ValueError)
    and left the process running."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files ({hard}) leaves no room above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if soft != resource.RLIM_INFINITY else soft, hard))
    held: list[int] = []
    try:
        held += [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        proc = _spawn("import time; time.sleep(0.2); print(777)")
        assert proc.stdout.fileno() >= 1024
        assert first_line(proc, 30.0, "the test JVM", "some_timeout_s") == b"777\n"
        proc.wait(timeout=30)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_timeout_of_a_month_or_more_waits_in_pieces():
    """poll() takes milliseconds in a C int: a timeout of ~25 days or inf overflowed it (and the
    process was killed)."""
    for timeout in (3e6, float("inf")):
        proc = _spawn("import time; time.sleep(0.2); print(4242)")
        assert first_line(proc, timeout, "the test JVM", "some_timeout_s") == b"4242\n"
        proc.wait(timeout=30)


def test_an_error_while_waiting_kills_the_process(monkeypatch):
    import os

    proc = _spawn("import time; print(1, end='', flush=True); time.sleep(60)")

    def broken_read(fd, n):
        raise OSError("read failed")
    monkeypatch.setattr(os, "read", broken_read)
    with pytest.raises(OSError, match="read failed"):
        first_line(proc, 30.0, "the test JVM", "some_timeout_s")
    assert proc.returncode is not None          # killed and reaped, not left running


def test_a_process_that_exits_first_gives_what_it_wrote():
    proc = _spawn("import sys; sys.stdout.write('Error: no main class')")
    assert first_line(proc, 30.0, "the test JVM", "some_timeout_s") == b"Error: no main class"
    proc.wait(timeout=30)


def test_no_java_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(RuntimeError, match=r"ScienceWorld needs Java \(>= 11.*apt-get install openjdk"):
        java_executable("ScienceWorld", 11)


def test_a_wrong_java_home_is_named(monkeypatch, tmp_path):
    """JAVA_HOME=/nonexistent with no java on PATH was reported as "JAVA_HOME is not set"."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nonexistent"))
    with pytest.raises(RuntimeError) as e:
        java_executable("ScienceWorld", 11)
    assert str(e.value) == (f"ScienceWorld needs Java (>= 11; tested with OpenJDK 17): JAVA_HOME={tmp_path}/nonexistent "
                            "has no bin/java and there is no `java` on PATH. Set JAVA_HOME to the folder that holds "
                            "bin/java, or unset it and put `java` on PATH. On Debian/Ubuntu: apt-get install "
                            "openjdk-17-jre-headless")
    monkeypatch.setenv("JAVA_HOME", "")          # set but empty: as unset
    with pytest.raises(RuntimeError, match=r": no `java` on PATH and JAVA_HOME is not set\. On Debian"):
        java_executable("ScienceWorld", 11)


def test_a_gateway_that_exits_is_reaped(tmp_path):
    """The launcher's stdout thread reaps the JVM once it exits: an env that shuts its gateway down
    does not wait for the process, which stayed a zombie in the trainer. A script stands in for
    java here (prints a port, then exits, as a JVM after its gateway's shutdown)."""
    java = tmp_path / "java"
    java.write_text("#!/bin/sh\necho 25333\nexit 0\n")
    java.chmod(0o755)
    port, proc = launch_gateway(str(java), "", None, [], 10, "the stand-in JVM", "call_timeout_s")
    assert port == 25333
    deadline = time.monotonic() + 10
    while proc.returncode is None and time.monotonic() < deadline:     # set by the thread's wait(), not ours
        time.sleep(0.05)
    assert proc.returncode == 0
    with pytest.raises(FileNotFoundError):
        open(f"/proc/{proc.pid}/stat").close()


def test_a_gateway_runs_in_its_own_session(tmp_path):
    """A terminal's Ctrl-C goes to its whole foreground process group: the TextWorldExpress JVM was in
    it and died under the env (a py4j traceback per call in flight) while the trainer stopped. A
    stand-in for java prints a port, then waits."""
    java = tmp_path / "java"
    java.write_text("#!/bin/sh\necho 25333\nexec sleep 30\n")
    java.chmod(0o755)
    _, proc = launch_gateway(str(java), "", None, [], 10, "the stand-in JVM", "call_timeout_s")
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    finally:
        proc.kill()
