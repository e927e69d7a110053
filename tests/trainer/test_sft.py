"""`agentq sft`'s output folder is guarded as an RL run folder is (one process at a time, an earlier
run refused unless trainer.overwrite=true), and a validation share that leaves nothing to train on
is a clear error, not a division by zero."""
import json

import pytest

from agentq.cli import main
from agentq.trainer.run_dir import RunDirError, claim_run_dir

SMALL = ["sft.num_demos=2", "sft.epochs=1", "sft.batch_size=2", "env_pool=inline"]


def metrics_steps(folder):
    return [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_sft_folder_is_locked_and_not_mixed_with_an_earlier_run(tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["sft", f"sft.out_dir={out}", *SMALL]) == 0
    first = (out / "metrics.jsonl").read_text()
    assert metrics_steps(out) == [0, 1, 1]          # val loss before, the one step, the epoch row
    assert main(["sft", f"sft.out_dir={out}", *SMALL]) == 2
    assert "(sft.out_dir) already holds a run (metrics.jsonl, tb, checkpoint, sft_summary.json)" in \
        " ".join(capsys.readouterr().err.split())
    assert (out / "metrics.jsonl").read_text() == first
    from agentq.config import load_config
    from agentq.trainer.sft import sft

    lock = claim_run_dir(out, resume=True, overwrite=False)      # another process's run
    try:
        with pytest.raises(RunDirError, match="in use by another agentq process"):
            sft(load_config([f"sft.out_dir={out}", "trainer.overwrite=true", *SMALL]))
    finally:
        lock.close()
    assert main(["sft", f"sft.out_dir={out}", "trainer.overwrite=true", *SMALL]) == 0
    assert metrics_steps(out) == [0, 1, 1]          # the new run's rows only


def test_a_validation_share_that_leaves_no_training_demo_is_named(tmp_path, capsys):
    # 2 demos at 0.9: round(1.8) = 2 held out, none to train on
    assert main(["sft", f"sft.out_dir={tmp_path / 'sft'}", "sft.val_fraction=0.9", *SMALL]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "sft.val_fraction=0.9 leaves no demonstration to train on (2 usable, 2 held out for validation)" in said
    assert not (tmp_path / "sft" / "checkpoint").exists()
