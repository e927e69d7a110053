"""The 2-device RL-step script (`agentq.eval.bench_distributed_gpu`) on CPU: two gloo processes, each
holding a rollout engine and a learner rank (the GPU machine runs the same code over NCCL).

Asserted: the 2-rank gradient equals the one-process gradient of the same batch within 1e-4·max|g|
(fp32 sums re-associated), both ranks hold the same gradient and, after the optimizer steps, the
same weights; the weight sync changed int8 codes; the split episodes are token for token the ones a
single engine plays (per-episode seeds; fp32 on CPU). Throughput ratios are printed, not asserted
(two processes share this machine's cores)."""
import json

from agentq.eval.bench_distributed_gpu import main


def test_two_processes_run_one_rl_step_with_the_one_process_gradient(tmp_path):
    assert main(["--device", "cpu", "--model", "tiny", "--batch", "8", "--prompt", "32", "--turns", "2",
                 "--new", "8", "--learn-episodes", "16", "--minibatch", "8", "--micro", "4",
                 "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "distributed-cpu-tiny.json").read_text())
    g = report["gradient"]
    assert g["rows"] == 16 and g["max_abs_grad"] > 0
    assert g["max_abs_diff_over_max_abs"] <= 1e-4
    assert report["checks"] == {"gradient_within_tolerance": True, "ranks_equal": True, "replicas_equal": True}
    step = report["rl_step"]
    assert step["optimizer_steps"] == 2 and step["int8_codes_changed"] > 0
    assert report["rollout"]["episodes_same_tokens_split_vs_one"] == "8/8"
