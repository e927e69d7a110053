"""`agentq train` on a local Ray cluster: 2 rollout-worker actors and a 2-rank gloo learner
(placement=split) against the single-process run (placement=single) with the same seeds.

What "matches" means, asserted below: step 1's rollouts are the same episodes token for token
(reward, success, turns, action tokens, the rollout-side numbers are equal exactly), and every
learner number of step 1 (loss, pg_loss, kl, grad_norm, clip_frac, k3) agrees within 1e-4 relative
(1e-7 absolute): the 2 ranks sum fp32 gradients of other micro-batch compositions, nothing else
differs. Step 2 runs on both (after a weight sync to 2 workers) without errored episodes."""
import json

import pytest

from agentq.cli import main

SMALL = ["trainer.tasks_per_step=2", "trainer.group_size=2", "env.max_steps=3", "env_pool=inline",
         "trainer.eval_every=-1", "trainer.steps=2", "trainer.ppo_epochs=1", "trainer.minibatch_size=2",
         "trainer.micro_batch_size=1", "env.max_new_tokens=12"]
DISTRIBUTED = ["placement=split", "placement.rollout_workers=2", "placement.learner_ranks=2",
               "placement.cpus_per_actor=0.5", "ray.num_cpus=2", "placement.timeout_s=300"]
EXACT = ("reward_mean", "success_rate", "turns_mean", "action_tokens", "episodes", "errored_episodes",
         "invalid_action_rate")
CLOSE = ("loss", "pg_loss", "kl", "grad_norm", "clip_frac", "k3")


def rows(run):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward_mean" in r]


def test_two_workers_and_two_ranks_match_the_single_process_first_step(tmp_path):
    pytest.importorskip("ray")
    import ray

    single, split = tmp_path / "single", tmp_path / "split"
    assert main(["train", f"trainer.out_dir={single}", *SMALL]) == 0
    try:
        assert main(["train", f"trainer.out_dir={split}", *SMALL, *DISTRIBUTED]) == 0
    finally:
        if ray.is_initialized():
            ray.shutdown()
    a, b = rows(single), rows(split)
    assert [r["step"] for r in b] == [1, 2]
    for k in EXACT:
        assert a[0][k] == b[0][k], (k, a[0][k], b[0][k])
    print({k: (a[0][k], b[0][k]) for k in EXACT + CLOSE})
    for k in CLOSE:
        assert b[0][k] == pytest.approx(a[0][k], rel=1e-4, abs=1e-7), (k, a[0][k], b[0][k])
    assert a[0]["action_tokens"] > 0 and a[0]["grad_norm"] > 0
    assert b[1]["errored_episodes"] == 0 and b[1]["episodes"] == 4
    assert (split / "checkpoints" / "step_000002" / "model.safetensors").exists()
