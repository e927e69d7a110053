"""SIGTERM (`kill <pid>`, a scheduler's stop) during `agentq train` / `pipeline` / `eval` stops the run as
Ctrl-C does: one line saying where it stands and how to go on, exit status 130, the handler before it back."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from agentq.cli import main, sigterm_as_ctrl_c


class Terminated(Exception):
    """What the tests' own SIGTERM handler raises: a SIGTERM the command left unhandled."""


@pytest.fixture
def own_sigterm_handler():
    def terminated(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    yield terminated
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_in_the_block_is_a_keyboard_interrupt_and_the_handler_is_restored(own_sigterm_handler):
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_ctrl_c():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pthread_sigmask(signal.SIG_BLOCK, [])        # a bytecode boundary: the handler runs
    assert signal.getsignal(signal.SIGTERM) is own_sigterm_handler
    with sigterm_as_ctrl_c(enabled=False):
        assert signal.getsignal(signal.SIGTERM) is own_sigterm_handler


def test_a_sigterm_an_earlier_block_took_is_not_the_next_blocks_stop(own_sigterm_handler, monkeypatch):
    """`main` ends a stopped command by the signal that stopped it (`_stopped_by`): a SIGTERM taken by
    an earlier block of the same process must not turn a later Ctrl-C into a SIGTERM."""
    from agentq import cli

    monkeypatch.setattr(cli, "_stopped_by", [])
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_ctrl_c():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert cli._stopped_by == [signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_ctrl_c():
            raise KeyboardInterrupt          # Ctrl-C
    assert cli._stopped_by == []
    cli._stopped_by.append(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_ctrl_c(enabled=False):
            raise KeyboardInterrupt
    assert cli._stopped_by == []


def test_off_the_main_thread_no_handler_is_installed(own_sigterm_handler):
    seen, errors = [], []

    def worker():
        try:
            with sigterm_as_ctrl_c():
                seen.append(signal.getsignal(signal.SIGTERM))
        except Exception as e:      # signal.signal off the main thread: ValueError
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors == [] and seen == [own_sigterm_handler]


@pytest.mark.parametrize("env_pool", ["inline", "ray"])
def test_sigterm_during_train_says_where_the_run_stands(env_pool, tmp_path, monkeypatch, capsys, own_sigterm_handler):
    # ray: a local cluster, whose `ray.init` installs its own SIGTERM handler (sys.exit(15): no resume line)
    if env_pool == "ray":
        pytest.importorskip("ray")
    from agentq.trainer import rl

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"

    def terminated_at_once(self):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_BLOCK, [])
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(rl.RLTrainer, "_train", terminated_at_once)
    quick = [f"env_pool={env_pool}", "env.max_steps=2", "env.max_new_tokens=8", "trainer.steps=1",
             "trainer.tasks_per_step=1", "trainer.group_size=2", "trainer.eval_num_tasks=1"]
    assert main(["train", *quick, f"trainer.out_dir={run}"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(
        f"agentq: interrupted: run folder {run} has no checkpoint yet; start it again with agentq train ")
    assert signal.getsignal(signal.SIGTERM) is own_sigterm_handler


STOPPED_BY_SIGTERM = """
import os, signal, sys
from agentq.cli import main
from agentq.trainer import rl

def terminated_at_once(self):
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])
    raise AssertionError("SIGTERM did not stop the run")

rl.RLTrainer._train = terminated_at_once
sys.argv = ["agentq", "train", "env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8", "trainer.steps=1",
            "trainer.tasks_per_step=1", "trainer.group_size=2", "trainer.eval_num_tasks=1", "trainer.out_dir=run"]
sys.exit(main())
"""


def test_the_command_ends_by_the_sigterm_it_was_sent(tmp_path):
    """A job scheduler (or a parent) sees the process end by the SIGTERM it sent, not by a SIGINT."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STOPPED_BY_SIGTERM], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1].startswith("agentq: interrupted: run folder run has no checkpoint yet")
