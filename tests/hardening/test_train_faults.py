"""`agentq train` under faults: a stopped and a killed env worker mid-run cost their episodes
(counted, errors written), not the run; a step without a usable episode is logged and skipped, and
a run where that keeps happening stops with the reason."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from agentq.cli import main
from conftest import REPO

SMALL = ["env=textworld_express", "env.max_steps=3", "env.max_new_tokens=12", "trainer.tasks_per_step=2",
         "trainer.group_size=2", "trainer.eval_every=-1"]


def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_steps_without_usable_episodes_are_skipped(tiny_model_dir, tmp_path):
    # the first prompt alone exceeds the context: every episode ends "context" with no action token
    run = tmp_path / "r"
    args = ["train", *SMALL, f"model.path={tiny_model_dir}", "env_pool=inline", "env.max_context_tokens=8"]
    assert main([*args, "trainer.steps=2", f"trainer.out_dir={run}"]) == 0
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2] and all(r["skipped_step"] == 1 and r["end_context"] == 1.0 and r["episodes"] == 4 for r in got)
    assert (run / "checkpoints" / "step_000002" / "model.safetensors").exists()


def test_a_run_of_skipped_steps_stops_with_the_reason(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "r"
    args = ["train", *SMALL, f"model.path={tiny_model_dir}", "env_pool=inline", "env.max_context_tokens=8"]
    assert main([*args, "trainer.steps=5", "trainer.max_skipped_steps=2", f"trainer.out_dir={run}"]) == 1
    err = capsys.readouterr().err
    assert "2 steps in a row had no usable episode" in err and "env.max_context_tokens=8" in err
    assert [r["step"] for r in rows(run)] == [1]        # step 2 raised before its row


def env_workers(proc: psutil.Process) -> list[psutil.Process]:
    return [c for c in proc.children(recursive=False)
            if "spawn_main" in " ".join(c.cmdline()) and "resource_tracker" not in " ".join(c.cmdline())]


def test_stopped_and_killed_workers_cost_episodes_not_the_run(tiny_model_dir, tmp_path):
    run = tmp_path / "r"
    cmd = [sys.executable, "-m", "agentq.cli", "train", *SMALL, f"model.path={tiny_model_dir}", "env_pool=process",
           "env_pool.num_workers=2", "env_pool.call_timeout_s=10", "trainer.steps=3", f"trainer.out_dir={run}"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not ((run / "metrics.jsonl").exists() and rows(run)):    # step 1 is done: workers idle
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-3000:]
            time.sleep(0.05)
        stopped, killed = env_workers(psutil.Process(p.pid))
        stopped.send_signal(signal.SIGSTOP)
        killed.send_signal(signal.SIGKILL)
        out, err = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2, 3]
    # each worker owns 2 of the 4 slots. The signals land after step 1's row is written, usually before
    # step 2's episodes reach the workers; on a loaded machine a worker, or both, may already have
    # finished its step-2 episodes (the learner's update still running), and what happens to it is then
    # counted in step 3. The stopped worker hangs in the reset: its 2 episodes are lost. The killed one
    # is found dead at a reset, before any episode on it began: restarted, the reset retried on it, its
    # episodes played (`env_recovered_episodes`; they were lost too before). The run goes on.
    errored = [r["errored_episodes"] for r in got]
    assert errored in ([0, 2, 0], [0, 0, 2]), errored
    assert all(r.get("skipped_step", 0) == 0 for r in got)
    errors = [json.loads(line) for line in (run / "errors.jsonl").read_text().splitlines()]
    assert len(errors) == 2 and [sum(e["step"] == s for e in errors) for s in (1, 2, 3)] == errored
    assert all("hung" in e["error"] for e in errors)
    # each row logs the env workers restarted since the one before: the hung one and the dead one
    assert sum(r["env_worker_restarts"] for r in got) == 2 and all(r["rollout_worker_restarts"] == 0 for r in got)
    assert sum(r["env_recovered_episodes"] for r in got) == 2
    totals = json.loads((run / "train_summary.json").read_text())["totals"]
    assert totals == {"errored_episodes": 2, "eval_errored_episodes": 0, "env_worker_restarts": 2,
                      "rollout_worker_restarts": 0, "env_recovered_episodes": 2}
    assert not stopped.is_running() or stopped.status() == psutil.STATUS_ZOMBIE


def test_workers_killed_while_idle_cost_no_episode_and_are_counted_in_steps_evaluations_and_totals(
        tiny_model_dir, tmp_path, monkeypatch):
    """Env worker 0 is killed (SIGKILL) while idle twice: before step 2 and before the final evaluation.
    The next reset found it dead and lost every episode on its slots (runs r2/r3), and a restart during an
    evaluation was logged nowhere (run ek1: eval/errors 12, env_worker_restarts 0 everywhere). Now each
    reset is retried on the restarted worker: no episode errors, step 2's row counts one restart and its
    2 recovered episodes (slots 0 and 2 of 4), the evaluation's row and eval.json one restart and 1
    recovered episode (slot 0 of its 2), and train_summary.json's totals both."""
    from agentq.trainer.rl import RLTrainer
    from proc_watch import gone, wait_until

    step, evaluate = RLTrainer.step, RLTrainer.evaluate

    def kill_worker_0(trainer: RLTrainer) -> None:
        pid = trainer.pool.worker_pid(0)
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: gone(pid))

    def step_after_a_kill(self: RLTrainer, n: int) -> dict:
        if n == 2:
            kill_worker_0(self)
        return step(self, n)

    def evaluate_after_a_kill(self: RLTrainer, n: int, num_tasks: int | None) -> dict:
        kill_worker_0(self)
        return evaluate(self, n, num_tasks)
    monkeypatch.setattr(RLTrainer, "step", step_after_a_kill)
    monkeypatch.setattr(RLTrainer, "evaluate", evaluate_after_a_kill)
    run = tmp_path / "r"
    args = [a for a in SMALL if not a.startswith("trainer.eval_every=")]
    assert main(["train", *args, f"model.path={tiny_model_dir}", "env_pool=process", "env_pool.num_workers=2",
                 "trainer.eval_every=0", "trainer.eval_num_tasks=2", "trainer.steps=2",
                 f"trainer.out_dir={run}"]) == 0
    got = rows(run)
    steps, (ev,) = [r for r in got if "reward_mean" in r], [r for r in got if "eval/errors" in r]
    assert [(r["step"], r["episodes"], r["errored_episodes"], r["env_worker_restarts"], r["env_recovered_episodes"])
            for r in steps] == [(1, 4, 0, 0, 0), (2, 4, 0, 1, 2)]
    assert (ev["step"], ev["eval/episodes"], ev["eval/errors"], ev["eval/env_worker_restarts"],
            ev["eval/env_recovered_episodes"], ev["eval/rollout_worker_restarts"]) == (2, 2, 0, 1, 1, 0)
    report = json.loads((run / "eval" / "step_000002" / "eval.json").read_text())
    assert (report["errors"], report["env_worker_restarts"], report["env_recovered_episodes"]) == (0, 1, 1)
    assert not (run / "errors.jsonl").exists() or not (run / "errors.jsonl").read_text().strip()
    totals = json.loads((run / "train_summary.json").read_text())["totals"]
    assert totals == {"errored_episodes": 0, "eval_errored_episodes": 0, "env_worker_restarts": 2,
                      "rollout_worker_restarts": 0, "env_recovered_episodes": 3}


def test_a_resumed_run_keeps_counting_its_skipped_steps(tiny_model_dir, tmp_path, capsys):
    """Two skipped steps before the checkpoint and one after reach max_skipped_steps=3, as in a run
    that was never stopped: the count is part of the trainer state."""
    run = tmp_path / "r"
    args = ["train", *SMALL, f"model.path={tiny_model_dir}", "env_pool=inline", "env.max_context_tokens=8",
            "trainer.max_skipped_steps=3"]
    assert main([*args, "trainer.steps=2", f"trainer.out_dir={run}"]) == 0
    assert main([*args, "trainer.steps=4", f"trainer.resume={run}", f"trainer.out_dir={run}"]) == 1
    assert "3 steps in a row had no usable episode" in capsys.readouterr().err
    assert [r["step"] for r in rows(run)] == [1, 2]      # step 3 raised before its row


GAVE_UP = ("env worker 0 (textworld_express) died or hung in 3 reset calls in a row without completing one "
           "(restarted after each); giving up: died (exit code 3)")
DIED = "env worker 0 died (exit code 3); restarted"


@pytest.mark.parametrize("stops_in", ["reset", "prefill_counts"])
def test_a_run_that_gives_up_on_a_worker_records_the_stopping_steps_lost_episodes(stops_in, tiny_model_dir, tmp_path,
                                                                                  monkeypatch, capsys):
    """A worker given up on (`RunAborted`) stopped the run inside the step: the step's errors.jsonl rows
    were written after its collection only, so the give-up call's episodes were never recorded, nor the
    ones lost earlier in that step to restarted calls. Here the pool's first reset loses episode 0 as a
    restarted worker does, then the run is stopped by the second reset (episode 2 in it, with
    trainer.max_concurrent=2), or by the rollout backend's `prefill_counts` closing the collection. Each of
    the step's lost episodes has its row before the run stops: episode 0 with its own error, every other
    one that had not ended naming the stop."""
    from agentq.pool.base import EnvResult, InlinePool
    from agentq.rollout.torch_engine.engine import TorchEngine
    from agentq.utils.errors import RunAborted

    resets, counts = [], []
    reset, prefill_counts = InlinePool.reset, TorchEngine.prefill_counts

    def first_loses_one_second_gives_up(self, items):
        resets.append(items)
        if len(resets) == 2 and stops_in == "reset":
            raise RunAborted(GAVE_UP)
        out = reset(self, items)
        return [EnvResult(out[0].slot, ok=False, error=DIED), *out[1:]] if len(resets) == 1 else out

    def second_gives_up(self):
        counts.append(1)
        if len(counts) == 2 and stops_in == "prefill_counts":
            raise RunAborted(GAVE_UP)
        return prefill_counts(self)

    monkeypatch.setattr(InlinePool, "reset", first_loses_one_second_gives_up)
    monkeypatch.setattr(TorchEngine, "prefill_counts", second_gives_up)
    run = tmp_path / "r"
    assert main(["train", *SMALL, f"model.path={tiny_model_dir}", "env_pool=inline", "trainer.max_concurrent=2",
                 "trainer.steps=1", f"trainer.out_dir={run}"]) == 1
    assert f"agentq: run stopped: {GAVE_UP}" in capsys.readouterr().err
    assert not (run / "metrics.jsonl").exists() or not rows(run)        # stopped before the step's row
    errors = {e["episode_id"]: e for e in map(json.loads, (run / "errors.jsonl").read_text().splitlines())}
    assert all(e["step"] == 1 and e["split"] == "train" and e["task_id"] for e in errors.values())
    assert errors.pop(0)["error"] == DIED
    stopped = f"the run stopped before this episode ended: {GAVE_UP}"
    if stops_in == "reset":     # 2 was in the stopping call, 3 in it or queued; 1 ran on (seen), unless it had ended
        assert {2, 3} <= set(errors) <= {1, 2, 3} and all(e["error"] == stopped for e in errors.values())
    else:                       # every episode had ended: only the lost one has a row
        assert errors == {}
