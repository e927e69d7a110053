"""`bench_common.kernel_timeline` / `profiled_kernels`: the busy / idle accounting of a profiled
GPU stream (`bench_engine --profile`), against intervals worked out by hand. The kernel classes
a ceiling on a quantized step's gain sorts profiled kernels into (`kernel_class`, `gpu_s_by_class`)."""
import json

import pytest

from agentq.eval import bench_common
from agentq.eval.bench_common import kernel_timeline, profiled_kernels


def test_timeline_counts_overlaps_once_and_idle_before_each_kernel():
    # two steps of: a [0, 10), b [5, 12) (overlaps a, as under PDL), gap 3, c [15, 20); then gap 10
    step = [("a", 0.0, 10.0), ("b", 5.0, 7.0), ("c", 15.0, 5.0)]
    kernels = step + [(n, t + 30.0, d) for n, t, d in step]
    tl = kernel_timeline(kernels[::-1], steps=2)          # any order in, sorted by start inside
    # span [0, 50) = 50 per 2 steps; busy: [0,12) + [15,20) per step = 17; idle: 3 + 10 + 3 = 16 of 50
    assert tl["span_us"] == pytest.approx(25.0)
    assert tl["busy_us"] == pytest.approx(17.0)
    assert tl["idle_frac"] == pytest.approx(16 / 50)
    assert tl["kernels_per_step"] == 3.0
    assert list(tl["by_name"]) == ["a", "b", "c"]          # by recorded time: 10, 7, 5 per step
    assert tl["by_name"]["b"] == {"us": 7.0, "count": 1.0, "idle_before_us": 0.0}
    assert tl["by_name"]["c"]["idle_before_us"] == pytest.approx(3.0)        # 3 in each step
    assert tl["by_name"]["a"]["idle_before_us"] == pytest.approx(5.0)        # the 10 before step 2, per step
    # a kernel wholly inside another adds no busy time
    assert kernel_timeline([("a", 0.0, 10.0), ("b", 2.0, 3.0)])["busy_us"] == pytest.approx(10.0)
    assert kernel_timeline([])["busy_us"] == 0.0


class _TraceOnly:
    """Stand-in for a `torch.profiler.profile` with CUDA kernels (no GPU here): it only writes the
    Chrome trace that `profiled_kernels` reads, in the profiler's format."""

    def export_chrome_trace(self, path: str) -> None:
        events = [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 100.5, "dur": 20.0},
                  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 90.0, "dur": 40.0},
                  {"ph": "i", "cat": "kernel", "name": "marker", "ts": 95.0},
                  {"ph": "X", "cat": "kernel", "name": "norm", "ts": 125.0, "dur": 4.0}]
        with open(path, "w") as f:
            json.dump({"traceEvents": events}, f)


def test_profiled_kernels_keeps_only_kernel_intervals():
    assert profiled_kernels(_TraceOnly()) == [("gemm", 100.5, 20.0), ("norm", 125.0, 4.0)]


def test_engine_time_split_against_hand_numbers():
    from agentq.eval.bench_engine import time_split
    # the turns took 1.05 + 0.53 + 0.55 = 2.13 s, of which the first-turn prefill alone 0.59 s
    row = {"turns": 3, "turn_s": [1.05, 0.53, 0.55], "first_prefill_s": 0.59}
    prefill, rest = time_split(row)
    assert prefill == 0.59
    assert rest == pytest.approx(2.13 - 0.59)


def test_switches_report_the_codes_path_as_json(monkeypatch):
    """A report names the switches it ran under: the codes path (a Triton constexpr in its module)
    comes out as a plain bool that JSON can hold, and AGENTQ_* variables are listed as set."""
    from agentq.eval.bench_common import fast_path_switches
    from agentq.kernels import _interp

    monkeypatch.setenv("AGENTQ_FAST_CODES", "1")
    out = json.loads(json.dumps(fast_path_switches()))
    assert out["AGENTQ_FAST_CODES"] == "1"
    if _interp.HAVE_TRITON:
        from agentq.kernels import triton_quant

        assert out["fast_codes"] is bool(triton_quant.FAST_CODES)
    else:
        assert out["fast_codes"] is None


def test_kernel_classes_of_the_profiles_kernel_names():
    """Names as the H200 profiles of docs/bench/h200-r30 recorded them: the W8A8 GEMM (whose name
    holds "gemm" too) is int8, cuBLAS's nvjet and split-K reduction bf16, both engines' decode
    attention apart from the prefill's and flash attention (and the CUDA kernel's, round 45)."""
    names = {"_w8a8_gemm_tma_kernel": "int8_gemm", "_w8a8_gemm_kernel": "int8_gemm",
             "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT": "bf16_gemm",
             "void cublasLt::splitKreduce_kernel<32, 16, int, __nv_bfloat16>": "bf16_gemm",
             "_decode_kernel": "decode_attention", "_decode_planes_kernel": "decode_attention",
             "_combine_kernel": "decode_attention", "agentq_decode_attn_i8": "decode_attention",
             "_prefill_kernel": "attention",
             "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>": "attention",
             "_quant_rows_kernel": "other", "_add_rms_norm_kernel": "other", "_split_argmax_kernel": "other"}
    assert {n: bench_common.kernel_class(n) for n in names} == names
    by = bench_common.gpu_s_by_class([("_w8a8_gemm_kernel", 0.0, 300.0), ("nvjet_x", 5.0, 100.0),
                                      ("_w8a8_gemm_tma_kernel", 9.0, 200.0), ("_pick_kernel", 1.0, 50.0)])
    assert by == {"int8_gemm": 5e-4, "decode_attention": 0.0, "attention": 0.0, "bf16_gemm": 1e-4, "other": 5e-5}


def test_engine_decode_sweep_refuses_a_launch_that_cannot_load():
    """bench_engine refuses, before any model is built, a warps × stages pair whose stages do not fit a
    block's shared memory (its timings would have been Triton's kernel under the CUDA kernel's name)."""
    import pytest

    from agentq.eval.bench_engine import check_attn_launch_sweep

    check_attn_launch_sweep({"attn_cuda_warps": [2, 4, 8], "attn_cuda_stages": [1, 2, 6]})
    check_attn_launch_sweep({"attn_cuda_stages": [8]})          # the table's warps (2 or 4) take 8 stages
    with pytest.raises(SystemExit, match="attn_cuda_warps=8 attn_cuda_stages=7: 7 stages of 8 warps need 234 KB"):
        check_attn_launch_sweep({"attn_cuda_warps": [2, 8], "attn_cuda_stages": [2, 7]})
