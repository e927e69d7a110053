"""`trainer.resume=<run>` continues a run exactly where its latest checkpoint left it: optimizer
state, task-sampling and minibatch RNGs, episode ids (hence sampling seeds) and the KL reference
(the run's initial policy, not the checkpoint) all come back. A run stopped after 2 steps and
resumed to 3 logs the same step-3 numbers as an uninterrupted 3-step run."""
import json

from agentq.cli import main

SMALL = ["trainer.tasks_per_step=2", "trainer.group_size=2", "env.max_steps=4", "env_pool=inline",
         "trainer.eval_every=0", "trainer.eval_num_tasks=2", "trainer.save_every=1", "trainer.ppo_epochs=2",
         "trainer.minibatch_size=2", "trainer.keep_checkpoints=5"]


def step_rows(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward_mean" in r]


def test_resume_continues_exactly(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["train", f"trainer.out_dir={full}", "trainer.steps=3", *SMALL]) == 0
    assert main(["train", f"trainer.out_dir={cut}", "trainer.steps=2", *SMALL]) == 0
    # a crash after step 3 was logged but before it was checkpointed: its row must not survive the resume
    with (cut / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "reward_mean": -1.0}) + "\n")
    assert main(["train", f"trainer.resume={cut}", "trainer.steps=3", *SMALL]) == 0

    a, b = step_rows(full), step_rows(cut)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("reward_mean", "action_tokens", "loss", "pg_loss", "kl", "grad_norm", "int8_codes_changed"):
        assert abs(a[2][key] - b[2][key]) <= 1e-6 * max(1.0, abs(a[2][key])), (key, a[2][key], b[2][key])
    assert a[2]["kl"] > 0          # the reference is the initial policy, not the step-2 checkpoint
    assert (cut / "checkpoints" / "step_000003" / "model.safetensors").exists()


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        main(["train", f"trainer.resume={tmp_path}", "trainer.steps=1", *SMALL])
