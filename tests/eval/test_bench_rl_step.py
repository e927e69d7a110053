"""`eval/bench_rl_step.py` on the CPU with the tiny model: the `NAME+int8dx` and `NAME+allhead`
entries of `--algos` run the learner with int8 dX or the LM head at every position beside the plain
entry, in one process, each timed and compared with the bf16 entry of the same head; a bad variant
is refused by name; `--activation-checkpointing` reaches both learners."""
import pytest

from agentq.eval import bench_rl_step


def test_parse_algo_variants():
    actions = {"grad_input": "bf16", "head_tokens": "actions", "share_prefix": True}
    assert bench_rl_step.parse_algo("interq", "bf16") == ("interq", actions)
    assert bench_rl_step.parse_algo("interq", "int8") == ("interq", dict(actions, grad_input="int8"))
    assert bench_rl_step.parse_algo("interq+int8dx", "bf16") == ("interq", dict(actions, grad_input="int8"))
    assert bench_rl_step.parse_algo("bf16+allhead", "bf16") == ("bf16", dict(actions, head_tokens="all"))
    assert bench_rl_step.parse_algo("interq+int8dx+allhead", "bf16") == ("interq", dict(
        actions, grad_input="int8", head_tokens="all"))
    assert bench_rl_step.parse_algo("bf16+noshare", "bf16") == ("bf16", dict(actions, share_prefix=False))
    with pytest.raises(SystemExit, match="unknown variant"):
        bench_rl_step.parse_algo("interq+fp4", "bf16")


def test_baselines_have_the_same_head():
    ran = ["interq", "bf16", "interq+allhead", "bf16+allhead"]
    assert [bench_rl_step.baseline_of(e, ran) for e in ran] == ["bf16", "bf16", "bf16+allhead", "bf16+allhead"]
    assert bench_rl_step.baseline_of("interq+allhead", ["interq+allhead", "bf16"]) == "bf16"
    assert bench_rl_step.baseline_of("interq", ["interq"]) is None
    ran = ["interq", "bf16", "interq+noshare", "bf16+noshare", "interq+allhead+noshare"]
    assert [bench_rl_step.baseline_of(e, ran) for e in ran[2:]] == ["bf16+noshare", "bf16+noshare", "bf16"]


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
    # one count per timed step where Triton is there to count; the CPU's torch paths compile nothing
    assert all(rows[a]["timed_step_compiles"] in ([0], []) for a in rows)


def test_allhead_entries_score_every_position_and_are_compared_alike(tmp_path):
    report = bench_rl_step.main(["--model", "tiny", "--device", "cpu", "--algos",
                                 "interq,bf16,interq+allhead,bf16+allhead", "--episodes", "4", "--group", "2",
                                 "--turns", "2", "--prompt", "16", "--obs", "8", "--new", "4", "--warmup", "0",
                                 "--steps", "1", "--pack-tokens", "64", "--out", str(tmp_path)])
    rows = report["results"]
    assert [rows[a]["head_tokens"] for a in ("interq", "bf16", "interq+allhead", "bf16+allhead")] == \
        ["actions", "actions", "all", "all"]
    assert report["speedup_bf16_over_interq_allhead"] == pytest.approx(
        rows["bf16+allhead"]["step_s"] / rows["interq+allhead"]["step_s"])
    assert report["speedup_head_actions_over_all_bf16"] == pytest.approx(
        rows["bf16+allhead"]["step_s"] / rows["bf16"]["step_s"])
    # the same episodes, their action tokens scored either way: the same mismatch
    assert rows["interq"]["mismatch"]["k3"] == pytest.approx(rows["interq+allhead"]["mismatch"]["k3"], rel=1e-4)
    assert (tmp_path / "bench_rl_step_tiny_headab.json").exists()


def test_activation_checkpointing_reaches_both_learners(tmp_path):
    report = bench_rl_step.main(["--model", "tiny", "--device", "cpu", "--algos", "interq,bf16", "--episodes", "4",
                                 "--group", "2", "--turns", "2", "--prompt", "16", "--obs", "8", "--new", "4",
                                 "--warmup", "0", "--steps", "1", "--activation-checkpointing", "--out", str(tmp_path),
                                 "--plot"])
    rows = report["results"]
    assert rows["interq"]["activation_checkpointing"] and rows["bf16"]["activation_checkpointing"]
    assert rows["interq"]["peak_gib"] is None          # no CUDA peak on the CPU
    assert (tmp_path / "bench_rl_step_tiny_ckpt.json").exists()
    assert (tmp_path / "bench_rl_step_tiny_ckpt.png").read_bytes()[:4] == b"\x89PNG"      # --plot


def test_noshare_entries_compute_every_prompt_and_are_compared_alike(tmp_path):
    """Groups sharing a 40-token prompt, packed: the default computes it once per group, `+noshare`
    per row; the same episodes, so the same mismatch, and each compared with bf16 alike."""
    report = bench_rl_step.main(["--model", "tiny", "--device", "cpu", "--algos",
                                 "interq,bf16,interq+noshare,bf16+noshare", "--episodes", "4", "--group", "2",
                                 "--group-prompt", "--turns", "2", "--prompt", "40", "--obs", "8", "--new", "4",
                                 "--warmup", "0", "--steps", "1", "--pack-tokens", "256", "--out", str(tmp_path)])
    rows = report["results"]
    assert [rows[a]["share_prefix"] for a in ("interq", "bf16", "interq+noshare", "bf16+noshare")] == \
        [True, True, False, False]
    assert report["speedup_bf16_over_interq_noshare"] == pytest.approx(
        rows["bf16+noshare"]["step_s"] / rows["interq+noshare"]["step_s"])
    assert report["speedup_shared_prefix_over_none_bf16"] == pytest.approx(
        rows["bf16+noshare"]["step_s"] / rows["bf16"]["step_s"])
    assert rows["interq"]["mismatch"]["k3"] == pytest.approx(rows["interq+noshare"]["mismatch"]["k3"], rel=1e-4)
    assert (tmp_path / "bench_rl_step_tiny_shareab_groupprompt.json").exists()


def test_host_profile_tables_name_the_engine_and_learner_calls(capsys):
    """`--host-profile` prints cProfile tables of one rollout and one old_ref pass, in which the
    engine's `generate` and the learner's `logprobs` appear (the calls the tables are meant to split)."""
    bench_rl_step.main(["--model", "tiny", "--device", "cpu", "--algos", "interq", "--episodes", "2", "--group", "2",
                        "--turns", "2", "--prompt", "8", "--obs", "4", "--new", "2", "--warmup", "0", "--steps", "1",
                        "--host-profile", "--profile-rows", "60"])
    out = capsys.readouterr().out
    rollout = out.split("--- host profile: interq: one rollout")[1].split("--- host profile: interq: old_ref")[0]
    old_ref = out.split("--- host profile: interq: old_ref")[1]
    assert "(generate)" in rollout and "(logprobs)" not in rollout
    assert "(logprobs)" in old_ref and "(generate)" not in old_ref


def test_gpu_time_ceiling_against_hand_numbers():
    """rollout: 1.0 s of bf16 kernels, 0.35 s of its cuBLAS time moved to int8 (0.4 - the 0.05 s LM
    head the quantized engine keeps in bf16) at 2x and 0.4 s of decode attention at 2x:
    1 - 0.175 - 0.2 = 0.625 s, 1.6x; update: 0.2 s moved (0.6 - 0.4 s of backward): 0.9 s, 1.111x;
    together 2.0 / 1.525 s."""
    zero = dict.fromkeys(("int8_gemm", "decode_attention", "attention", "bf16_gemm", "other"), 0.0)
    bf16 = {"rollout": dict(zero, bf16_gemm=0.4, decode_attention=0.4, attention=0.05, other=0.15),
            "update": dict(zero, bf16_gemm=0.6, attention=0.2, other=0.2)}
    quant = {"rollout": dict(zero, bf16_gemm=0.05, int8_gemm=0.3, decode_attention=0.25, other=0.3),
             "update": dict(zero, bf16_gemm=0.4, int8_gemm=0.15, attention=0.2, other=0.3)}
    ceil = bench_rl_step.gpu_time_ceiling(bf16, quant, gemm_ratio=2.0, attention_ratio=2.0)
    assert ceil == pytest.approx({"rollout": 1.6, "update": 1 / 0.9, "step": 2.0 / 1.525})
    # the quantized algo's own kernel times do not enter: only what it leaves in cuBLAS does
    slower = {p: dict(d, other=d["other"] + 1.0) for p, d in quant.items()}
    assert bench_rl_step.gpu_time_ceiling(bf16, slower, 2.0, 2.0) == ceil


def test_kv_read_ratio_counts_codes_and_scales():
    from agentq.kernels import QuantSpec

    # bf16: 2 x 128 x 2 bytes a position and head; int8: 2 x (128 + a 4-byte scale); fp8 per tensor: 2 x 128
    assert bench_rl_step.kv_read_ratio(QuantSpec.preset("w8a8_kv8"), 128) == pytest.approx(512 / 264)
    assert bench_rl_step.kv_read_ratio(QuantSpec.preset("w8a8_fp8kv"), 128) == 2.0
    assert bench_rl_step.kv_read_ratio(QuantSpec.preset("w8a8"), 128) == 1.0
