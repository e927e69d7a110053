"""`trainer.old_logp`: recompute (default) or bypass, which is refused at start-up wherever it would
not give recompute's numbers, and a 1-step run in bypass mode that logs what recompute logs.

The run comparison makes attention's dtype independent of grad mode (the fp32 CPU learner's
training pass would otherwise differ from its π_old pass: `grad_pass_refusal`), as in
tests/learner/test_old_logp_bypass.py."""
import json

import pytest
import torch

from agentq.algos import make_objective
from agentq.cli import main
from agentq.config import ConfigError, load_config
from agentq.kernels import attention
from agentq.trainer.rl import old_logp_mode

CPU, BF16, FP32 = torch.device("cpu"), torch.bfloat16, torch.float32
# one step, 2 tasks x 2 episodes, no evaluation: a few seconds
SMALL = ["trainer.tasks_per_step=2", "trainer.group_size=2", "env.max_steps=3", "env_pool=inline",
         "trainer.eval_every=-1", "trainer.steps=1", "trainer.save_segments=true"]


def mode_of(overrides: list[str], dtype: torch.dtype = BF16) -> str:
    cfg = load_config(overrides)
    return old_logp_mode(cfg, make_objective(cfg.algo.objective, **dict(cfg.algo.objective_params or {})), CPU, dtype)


def test_recompute_is_the_default_and_bypass_passes_where_exact():
    assert load_config([]).trainer.old_logp == "recompute" and mode_of([]) == "recompute"
    assert mode_of(["trainer.old_logp=bypass"]) == "bypass"
    # one minibatch holding the step's 8 x 4 trajectories is still one optimizer step
    assert mode_of(["trainer.old_logp=bypass", "trainer.minibatch_size=32"]) == "bypass"
    assert mode_of(["trainer.old_logp=recompute", "trainer.ppo_epochs=3", "algo=ais"], FP32) == "recompute"


@pytest.mark.parametrize("overrides, dtype, match", [
    (["trainer.ppo_epochs=2"], BF16, "ppo_epochs=2"),
    (["trainer.minibatch_size=16"], BF16, "minibatch_size=16 < 32 trajectories"),
    (["algo=ais"], BF16, "objective 'ais'.*row_local_prepare=False"),
    (["placement=split"], BF16, "placement.mode=split"),
    ([], FP32, "float32 learner's training forward computes attention in torch.float32"),
])
def test_bypass_is_refused_where_inexact(overrides, dtype, match):
    with pytest.raises(ValueError, match=f"trainer.old_logp=bypass is exact only .*{match}"):
        mode_of(["trainer.old_logp=bypass", *overrides], dtype)


def test_an_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="trainer.old_logp='fast'.*one of \\['recompute', 'bypass'\\]"):
        load_config(["trainer.old_logp=fast"])


def step_row(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if "reward_mean" in r)


def test_a_bypass_step_logs_what_recompute_logs(tmp_path, monkeypatch):
    monkeypatch.setattr(attention, "attention_accum_dtype",
                        lambda dtype, device: torch.float64 if dtype == torch.float32 else dtype)
    rows = {}
    for mode in ("recompute", "bypass"):
        out = tmp_path / mode
        assert main(["train", f"trainer.out_dir={out}", f"trainer.old_logp={mode}", *SMALL]) == 0
        rows[mode] = step_row(out)
        assert (out / "segments").is_dir()
    re, by = rows["recompute"], rows["bypass"]
    assert re.keys() == by.keys()
    assert (re["old_logp_bypass"], by["old_logp_bypass"]) == (0, 1)
    assert re["old_ref_time_s"] > 0 and by["old_ref_time_s"] >= 0
    timing = {k for k in re if k.endswith("_s") or k in ("tokens_per_s", "old_logp_bypass", "learner_threads")}
    for k in sorted(set(re) - timing):
        assert by[k] == pytest.approx(re[k], rel=1e-6, abs=1e-9, nan_ok=True), k
    assert re["k3"] > 0 and re["alpha_min"] <= 1.0 and re["optimizer_steps"] == 1
