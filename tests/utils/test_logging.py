"""W&B beside metrics.jsonl: a run resumed from its folder (`trainer.resume`) continues the same
W&B run (one id, the steps after the checkpoint only), and a fresh run in the folder starts a new one.
Checked with the real wandb library in offline mode, reading the record files it writes."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from agentq.cli import main

SMALL = ["trainer.tasks_per_step=2", "trainer.group_size=2", "env.max_steps=2", "env.max_new_tokens=8",
         "env_pool=inline", "trainer.eval_every=-1", "trainer.save_every=1", "trainer.save_segments=false",
         "logger=[wandb]", "wandb.mode=offline"]


def wandb_records(path: Path):
    """The protobuf records of a W&B `.wandb` file (its LevelDB-log layout: a 7-byte file header,
    32 KiB blocks of chunks with a 7-byte header each: crc, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if n == 0 and kind == 0:            # the rest of a block (padding)
            pos += left
            continue
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def wandb_runs(run_dir: Path) -> list[tuple[str, list[int]]]:
    """(W&B run id, history steps) of each offline W&B run in the folder, oldest first."""
    out = []
    for f in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        records = list(wandb_records(f))
        # W&B names the file run-<run id>.wandb; its run record, where the file holds one, agrees
        run_id = f.stem[len("run-"):]
        assert {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"} <= {run_id}, f
        out.append((run_id, [r.history.step.num for r in records if r.WhichOneof("record_type") == "history"]))
    return out


def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", *SMALL]) == 0
    assert main(["train", f"trainer.resume={run}", "trainer.steps=2"]) == 0
    runs = wandb_runs(run)
    assert len(runs) == 2, [sorted(p.relative_to(run).parts) for p in run.glob("wandb/offline-run-*/*.wandb")]
    (first, steps1), (second, steps2) = runs
    assert first == second                  # one W&B run, not a second one per resume
    assert (steps1, steps2) == ([1], [2])   # and the resume logs only the steps after the checkpoint
    # a fresh run replacing the folder's is a new W&B run, the replaced run's W&B files gone with it
    # (they stayed, and a resume of the new run continued the replaced one's W&B id)
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", "trainer.overwrite=true", *SMALL]) == 0
    (new_id, _), = wandb_runs(run)
    assert new_id != first and (run / "wandb_run_id").read_text().strip() == new_id


def test_tensorboard_holds_each_number_of_metrics_jsonl_at_its_step(tmp_path):
    """Every scalar of a metrics.jsonl row is a TensorBoard scalar of the same name at the row's step
    (float32); lists, nulls (a NaN or inf logged) and booleans stay in metrics.jsonl only."""
    import json
    import math

    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    from agentq.utils.logging import MetricsLogger

    log = MetricsLogger(tmp_path)
    log.log(1, {"reward_mean": 0.25, "episodes": 4, "k3": 1.5e-14, "loss": math.nan, "grad_norm": math.inf,
                "k3_by_turn": [1e-14, 2e-14], "flag": True})
    log.log(1, {"success_rate": 0.5, "episodes": 8}, prefix="eval/")
    log.log(2, {"reward_mean": -0.1, "episodes": 4, "k3": 2e-14, "loss": 0.5})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss"] is None and rows[0]["grad_norm"] is None and rows[0]["k3_by_turn"] == [1e-14, 2e-14]
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tb = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert sorted(tb) == ["episodes", "eval/episodes", "eval/success_rate", "k3", "loss", "reward_mean"]
    assert tb["reward_mean"] == [(1, 0.25), (2, pytest.approx(-0.1))]
    assert tb["k3"] == [(1, pytest.approx(1.5e-14, rel=1e-6)), (2, pytest.approx(2e-14, rel=1e-6))]
    assert tb["loss"] == [(2, 0.5)] and tb["eval/episodes"] == [(1, 8)] and tb["eval/success_rate"] == [(1, 0.5)]


def test_output_to_a_file_keeps_long_lines_whole(monkeypatch, capsys):
    """A log file or pipe gets a printed command on one line (rich wraps at 80 columns where it sees no
    terminal); COLUMNS still sets the width where a user gives it."""
    from agentq.utils.logging import make_console
    monkeypatch.delenv("COLUMNS", raising=False)
    line = "HTML report: agentq report runs/pipeline-" + "x" * 150
    make_console(stderr=False).print(line)
    assert capsys.readouterr().out == line + "\n"
    monkeypatch.setenv("COLUMNS", "40")
    c = make_console(stderr=False)
    assert c.width == 40
    c.print(line)
    assert len(capsys.readouterr().out.splitlines()) > 1


@pytest.mark.parametrize("errored, shown", [(0, ""), (None, ""), (3, "  errored 3")])
def test_the_step_line_says_how_many_episodes_errored(errored, shown):
    """A log file's step line never said that some of the step's episodes errored."""
    from agentq.utils.logging import step_line

    m = {"reward_mean": 0.5, "success_rate": 0.25, "turns_mean": 3.0, "k3": 1e-3, "loss": 0.1, "step_time_s": 2.0,
         **({"errored_episodes": errored} if errored is not None else {})}
    assert step_line(2, 5, m) == (f"step 2/5  reward 0.500  success 0.25  turns 3.00{shown}  k3 1.00e-03  "
                                  "loss 0.1000  step_time 2.0 s")


def test_a_progress_bar_on_a_terminal_or_told_not_to_prints_no_plain_lines(monkeypatch):
    """A terminal has the bar; training passes plain_lines=False, printing its own line per step."""
    import io

    from rich.console import Console

    import agentq.utils.logging as logging_mod

    for console, plain in ((Console(file=io.StringIO(), force_terminal=True), True),
                           (Console(file=io.StringIO()), False)):
        monkeypatch.setattr(logging_mod, "console", console)
        with logging_mod.progress(transient=True, plain_lines=plain) as prog:
            bar = prog.add_task("x", total=2, info="")
            prog.update(bar, advance=1)
            prog.advance(bar)
        assert "x: " not in console.file.getvalue()
