"""The CPU int8 GEMM dispatch (kernels/cpu_gemm.py): every path gives torch._int_mm's bits, on random
shapes with sums past fp32's exact range (|acc| > 2^24) and K not a multiple of the fp32 chunk, and
the path is chosen, overridden and reported as documented."""
import pytest
import torch

from agentq.kernels import QuantSpec, cpu_gemm, quant, ste

SPEC = QuantSpec.preset("w8a8_kv8")
# (M, K, N): a decode row, odd sizes, K across 1, 2 and 3 fp32 chunks of 1024 (and not a multiple of it)
SHAPES = [(1, 1, 1), (1, 256, 1024), (7, 1023, 5), (32, 1024, 96), (33, 1025, 65), (5, 2049, 17), (64, 3000, 24),
          (257, 512, 300)]


def _codes(shape, gen, extreme_rows=True):
    """Random int8 codes; row 0 all -128 so its products (+16384 each) drive |acc| to K·2^14."""
    t = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
    if extreme_rows:
        t[0] = -128
    return t


@pytest.mark.parametrize("path", cpu_gemm.PATHS)
def test_every_path_gives_int_mm_bits(path):
    gen = torch.Generator().manual_seed(0)
    biggest = 0
    for m, k, n in SHAPES:
        x_q, w_q = _codes((m, k), gen), _codes((n, k), gen)
        ref = torch._int_mm(x_q, w_q.t())
        got = cpu_gemm.run_path(path, x_q, w_q)
        assert got.dtype == torch.int32 and torch.equal(got, ref), (path, m, k, n)
        assert torch.equal(got, quant.int8_matmul_ref(x_q, w_q))
        biggest = max(biggest, int(ref.abs().max()))
    assert biggest == 3000 * 128 * 128 > 2 ** 24     # the sums really leave fp32's exact integers


@pytest.mark.parametrize("path", cpu_gemm.PATHS)
def test_as_float_equals_the_int32_cast_from_int8_or_fp32_codes(path):
    """int8_matmul_as_float (the linears' entry: codes possibly held in fp32) is int8_matmul(...).float()
    bit for bit, sign of zero included (an all-zero row times negative codes)."""
    gen = torch.Generator().manual_seed(3)
    with cpu_gemm.use_path(path):
        for m, k, n in SHAPES:
            x_q, w_q = _codes((m, k), gen), _codes((n, k), gen)
            x_q[-1] = 0
            ref = torch._int_mm(x_q, w_q.t()).float()
            for xc, wc in ((x_q, w_q), (x_q.float(), w_q.float()), (x_q.float(), w_q)):
                got = cpu_gemm.int8_matmul_as_float(xc, wc)
                assert got.dtype == torch.float32 and torch.equal(got, ref), (path, m, k, n)
                assert torch.equal(torch.signbit(got), torch.signbit(ref))


def test_fp32_path_stays_exact_when_matmul_precision_is_lowered():
    """'medium'/'high' let BLAS use bf16/TF32 for fp32 matmuls; the fp32 path then goes to fp64."""
    gen = torch.Generator().manual_seed(1)
    x_q, w_q = _codes((16, 700), gen), _codes((40, 700), gen)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert torch.equal(cpu_gemm.run_path("fp32", x_q, w_q), torch._int_mm(x_q, w_q.t()))
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("path", cpu_gemm.PATHS)
def test_linears_are_bit_identical_on_every_path(path):
    """The engine's W8A8 linear and the learner's STE linear (value and gradients) do not see the path."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 11, 1100, generator=gen)
    w = torch.randn(70, 1100, generator=gen) * 0.05
    b = torch.randn(70, generator=gen)
    w_q, s_w = quant.quantize_weight(w, SPEC)

    def run():
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = ste.w8a8_linear_ste(xs, ws, b, SPEC, backend="torch")
        (y * torch.arange(70.0)).sum().backward()
        return quant.w8a8_linear(x, w_q, s_w, b, SPEC), y.detach(), xs.grad, ws.grad

    # independent reference: int8 codes, the float64 GEMM, the epilogue written out, STE gradients by hand
    x_q, s_x = quant.quantize_act(x.reshape(-1, 1100), SPEC)
    y_ref = ((quant.int8_matmul_ref(x_q, w_q).float() * s_x[:, None]) * s_w + b).reshape(3, 11, 70)
    g = torch.arange(70.0).expand(33, 70)
    ref = (y_ref, y_ref, (g @ (w_q.float() * s_w[:, None])).reshape(3, 11, 1100), g.t() @ (x_q.float() * s_x[:, None]))
    with cpu_gemm.use_path(path):
        got = run()
    for a, r in zip(got, ref):
        assert torch.equal(a, r)


def test_weight_codes_are_held_in_fp32_only_for_fp32_compute_on_the_fp32_path():
    """Codes in fp32 (exact integers) where the fp32 emulation would cast int8 codes at every call;
    int8 elsewhere (int_mm, fp64, half-precision compute that may run Triton, CUDA); the learner's
    weight cache follows it and keeps int8 for the Triton path; the linear's bits do not move."""
    expect = {"fp32": torch.float32, "int_mm": torch.int8, "fp64": torch.int8}
    w = torch.randn(24, 40, generator=torch.Generator().manual_seed(4))
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(5))
    outs = []
    for path, dtype in expect.items():
        with cpu_gemm.use_path(path):
            assert cpu_gemm.weight_code_dtype("cpu") == cpu_gemm.weight_code_dtype("cpu", torch.float32) == dtype
            assert cpu_gemm.weight_code_dtype("cpu", torch.bfloat16) == torch.int8
            assert cpu_gemm.weight_code_dtype("cuda") == torch.int8
            cache = ste.WeightCache()
            w_q, s_w = cache.get(w, SPEC, backend="torch")
            assert w_q.dtype == dtype and torch.equal(w_q, quant.quantize_weight(w, SPEC)[0].to(dtype))
            outs.append(ste.w8a8_linear_ste(x, w, None, SPEC, cache=cache, backend="torch"))
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


def test_the_cpu_engine_holds_fp32_codes_on_the_fp32_path_with_the_same_bits(tiny_model_dir):
    """An fp32 W8A8 engine built on the fp32 path holds its weight codes in fp32, one built on the
    int_mm path in int8; both play the same tokens with the same log-probs."""
    from agentq.rollout import SamplingParams, TurnRequest
    from agentq.rollout.torch_engine.engine import TorchEngine

    ctxs = [[5 + (7 * j + 3 * i) % 200 for j in range(20 + 9 * i)] for i in range(3)]
    played = {}
    for path, dtype in (("fp32", torch.float32), ("int_mm", torch.int8)):
        with cpu_gemm.use_path(path):
            eng = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=4, max_len=128)
            assert eng.model.decoder_layers[0].gate_up_proj.w_q.dtype == dtype
            res = eng.generate([TurnRequest(i, c, SamplingParams(max_new_tokens=8), seed=i) for i, c in enumerate(ctxs)])
            played[path] = [(r.token_ids, r.logprobs) for r in res]
    assert played["fp32"] == played["int_mm"]


def test_choice_env_var_config_and_errors(monkeypatch):
    saved = dict(cpu_gemm._chosen)
    try:
        monkeypatch.setenv(cpu_gemm.ENV_VAR, "fp64")
        assert cpu_gemm.set_path("auto") == "fp64"
        assert cpu_gemm.describe()["source"] == f"{cpu_gemm.ENV_VAR}=fp64"
        assert cpu_gemm.set_path("fp32") == "fp32"                 # an explicit config value wins
        assert cpu_gemm.current_path() == "fp32"
        monkeypatch.setenv(cpu_gemm.ENV_VAR, "int8")
        with pytest.raises(ValueError, match=r"'int8' \(from AGENTQ_CPU_INT_GEMM=int8\); valid: \['auto', 'int_mm'"):
            cpu_gemm.set_path(None)
        with pytest.raises(ValueError, match=r"'bf16' \(from cpu_int_gemm\)"):
            cpu_gemm.set_path("bf16")
        # auto with no env var: the fastest on the probe (timings faked: this tests the choice, not the CPU)
        monkeypatch.delenv(cpu_gemm.ENV_VAR)
        monkeypatch.setattr(cpu_gemm, "probe", lambda shape=cpu_gemm.PROBE_SHAPE: {"int_mm": 9e-3, "fp32": 4e-4,
                                                                                      "fp64": 8e-4})
        assert cpu_gemm.configure("auto") == "fp32"
        assert cpu_gemm.describe()["probe_ms"] == pytest.approx({"int_mm": 9.0, "fp32": 0.4, "fp64": 0.8})
        monkeypatch.setattr(cpu_gemm, "probe", lambda shape=cpu_gemm.PROBE_SHAPE: {"int_mm": 1e-4, "fp32": 4e-4,
                                                                                      "fp64": 8e-4})
        assert cpu_gemm.configure("auto") == "fp32"                # same request: chosen once, not re-probed
        assert cpu_gemm.configure("int_mm") == "int_mm"
    finally:
        cpu_gemm._chosen.clear()
        cpu_gemm._chosen.update(saved)


def test_real_probe_times_every_path():
    times = cpu_gemm.probe((4, 64, 32))
    assert set(times) == set(cpu_gemm.PATHS) and all(0 < t < 5 for t in times.values())


def test_cpu_benchmark_tables(capsys):
    """eval/bench_cpu.py's GEMM timing and its side-by-side table (the RL arms are the benchmark's job)."""
    from agentq.eval import bench_cpu

    rows = bench_cpu.gemm_ms([(4, 64, 8)], reps=1)
    assert rows[0]["shape"] == [4, 64, 8] and all(rows[0][p] > 0 for p in cpu_gemm.PATHS)
    arm = {"step_time_s": 60.0, "rollout_time_s": 20.0, "train_time_s": 40.0, "eval_time_s": 30.0, "eval_episodes": 20,
           "check": {"reward_mean": 0.5}}
    bench_cpu.print_table({"cpu_capability": "AVX2", "onednn_int8": False, "emulated_no_vnni": True,
                           "chosen_path": "fp32", "probe_ms": {"int_mm": 9.0, "fp32": 0.4, "fp64": 0.8},
                           "gemm_ms_1_thread": rows, "same_bits": True,
                           "arms": {"off (int_mm)": arm, "on (fp32)": {**arm, "step_time_s": 10.0},
                                    bench_cpu.UNQUANTIZED: {**arm, "step_time_s": 8.0}},
                           "speedup_off_over_on": {"step_time_s": 6.0}, "quantized_over_unquantized": {"step_time_s": 1.25}})
    out = capsys.readouterr().out
    assert "6.00×" in out and "chosen path fp32" in out and "same episodes and update on both arms: True" in out
    assert "1.25×" in out and "unquantized" in out and "8.0" in out
