"""`eval/bench_rl_step.py` on the CPU with the tiny model: the `NAME+int8dx` entries of `--algos`
run the aligned learner with int8 dX beside the plain entry, in one process, each timed and
compared with bf16; a bad variant is refused by name."""
import pytest

from agentq.eval import bench_rl_step


def test_parse_algo_variants():
    assert bench_rl_step.parse_algo("interq", "bf16") == ("interq", "bf16")
    assert bench_rl_step.parse_algo("interq", "int8") == ("interq", "int8")
    assert bench_rl_step.parse_algo("interq+int8dx", "bf16") == ("interq", "int8")
    with pytest.raises(SystemExit, match="unknown variant"):
        bench_rl_step.parse_algo("interq+fp4", "bf16")


def test_int8dx_entry_runs_beside_the_plain_one(tmp_path):
    report = bench_rl_step.main(["--model", "tiny", "--device", "cpu", "--algos", "interq,interq+int8dx,bf16",
                                 "--episodes", "4", "--group", "2", "--turns", "2", "--prompt", "16", "--obs", "8",
                                 "--new", "4", "--warmup", "0", "--steps", "1", "--out", str(tmp_path)])
    rows = report["results"]
    assert [rows[a]["grad_input"] for a in ("interq", "interq+int8dx", "bf16")] == ["bf16", "int8", "bf16"]
    assert rows["interq+int8dx"]["learner_quant"] == rows["interq"]["learner_quant"] != rows["bf16"]["learner_quant"]
    for entry in ("interq", "interq+int8dx"):
        key = "speedup_bf16_over_" + entry.replace("+", "_")
        assert report[key] == pytest.approx(rows["bf16"]["step_s"] / rows[entry]["step_s"])
    assert (tmp_path / "bench_rl_step_tiny_dxab.json").exists()
