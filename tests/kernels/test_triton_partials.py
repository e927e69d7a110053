"""A W8A8 GEMM that hands int32 partial sums over K slices to the next norm
(`triton_gemm.int8_gemm_partials`, `quant.PartialSums`, `triton_norm.add_rms_norm`), under
TRITON_INTERPRET=1: the slices add up to the exact integer product, and the norm that runs the
GEMM's epilogue on them stores the very bits of the GEMM-with-epilogue + add_rms_norm path."""
import pytest
import torch

from agentq.kernels import _interp, quant
from agentq.kernels.quant_spec import QuantSpec

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
SPEC = QuantSpec()


@pytest.fixture(scope="module")
def K(gemm_norm_kernels):
    return gemm_norm_kernels


def _case(m, n, k, seed, dtype, bias):
    g = torch.Generator().manual_seed(seed)
    x_q, s_x = quant.quantize_act((torch.randn(m, k, generator=g) * 3).to(dtype), SPEC)
    w_q, s_w = quant.quantize_weight(torch.randn(n, k, generator=g) * 0.05, SPEC)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    resid = (torch.randn(m, n, generator=g) * 2).to(dtype)
    return x_q, s_x, w_q, s_w, b, resid


# (block_m, block_n, block_k, split_k, group_m, warps, stages): K = 208 is 13 steps of 16, so 3 or 4
# splits leave a ragged last slice and a ragged K tile; 7 splits of 64 over 208 leave 4 (no empty slice)
# (the last: 40 columns spread over 3 "SMs", 14 + 14 + 12 in masked 32-wide tiles)
SPLITS = [(16, 16, 16, 3, 1, 4, 2), (32, 32, 32, 4, 2, 4, 2), (16, 32, 64, 7, 1, 4, 2), (16, 16, 64, 1, 1, 4, 2),
          (16, 32, 16, 3, 1, 4, 2, 0, 1)]


@pytest.mark.parametrize("cfg", SPLITS, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}s{c[3]}" + ("sp" if c[8:] else ""))
@pytest.mark.parametrize("dtype,bias", [(torch.bfloat16, True), (torch.float16, False)])
def test_partial_sums_add_up_and_the_norm_stores_the_gemm_bits(K, cfg, dtype, bias, monkeypatch):
    _, tg, tn = K
    monkeypatch.setattr(tg, "num_sms", lambda device=None: 3)
    m, n, k = 37, 40, 208            # ragged against every tile
    x_q, s_x, w_q, s_w, b, resid = _case(m, n, k, seed=5, dtype=dtype, bias=bias)
    ps = tg.int8_gemm_partials(x_q, s_x, w_q, s_w, b, dtype, tg.GemmConfig(*cfg))
    k_step = cfg[2]
    want_splits = min(cfg[3], -(-k // k_step))
    per = -(-(-(-k // want_splits)) // k_step) * k_step
    assert ps.sums.shape == (-(-k // per), m, n) and ps.sums.dtype == torch.int32
    # each slice is the integer product over its own K range; together they are the whole product
    for s in range(ps.sums.shape[0]):
        lo, hi = s * per, min(k, (s + 1) * per)
        assert torch.equal(ps.sums[s], quant.int8_matmul_ref(x_q[:, lo:hi], w_q[:, lo:hi]))
    y = tg.int8_gemm(x_q, s_x, w_q, s_w, b, dtype, tg.GemmConfig(16, 32, 64, 1, 2, 4, 2))
    assert torch.equal(ps.value(), y) and ps.shape == (m, n)
    weight = (1 + 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(1))).to(dtype)
    for q in ((SPEC.act_scale_floor, SPEC.act_rounding), None):
        want_s, want_h = tn.add_rms_norm(resid, y, weight, 1e-6, q)
        got_s, got_h = tn.add_rms_norm(resid, ps, weight, 1e-6, q)
        assert torch.equal(got_s, want_s)
        if q is None:
            assert torch.equal(got_h, want_h)
        else:
            assert torch.equal(got_h[0], want_h[0]) and torch.equal(got_h[1], want_h[1])


def test_partial_sums_follow_the_rows_of_a_batch(K):
    """Rows [B, 1, N] (a decode step): the norm takes the partial sums of the flattened rows."""
    _, tg, tn = K
    x_q, s_x, w_q, s_w, b, resid = _case(6, 48, 96, seed=2, dtype=torch.bfloat16, bias=False)
    ps = tg.int8_gemm_partials(x_q, s_x, w_q, s_w, b, torch.bfloat16, tg.GemmConfig(16, 16, 32, 2, 1, 4, 2))
    weight = torch.ones(48, dtype=torch.bfloat16)
    want = tn.add_rms_norm(resid[:, None], ps.value()[:, None], weight, 1e-6)
    got = tn.add_rms_norm(resid[:, None], ps, weight, 1e-6)
    assert got[0].shape == (6, 1, 48) and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_partial_sums_refuse_a_mismatch(K):
    _, tg, tn = K
    x_q, s_x, w_q, s_w, b, resid = _case(4, 32, 64, seed=0, dtype=torch.bfloat16, bias=False)
    cfg = tg.GemmConfig(16, 16, 32, 2, 1, 4, 2)
    weight = torch.ones(32, dtype=torch.bfloat16)
    ps = tg.int8_gemm_partials(x_q, s_x, w_q, s_w, b, torch.float16, cfg)      # fp16 output, bf16 stream
    with pytest.raises(ValueError, match="partial sums"):
        tn.add_rms_norm(resid, ps, weight, 1e-6)
    ps = tg.int8_gemm_partials(x_q[:3], s_x[:3], w_q, s_w, b, torch.bfloat16, cfg)   # 3 rows for 4
    with pytest.raises(ValueError, match="partial sums"):
        tn.add_rms_norm(resid, ps, weight, 1e-6)
    with pytest.raises(ValueError, match="persistent"):
        tg.int8_gemm_partials(x_q, s_x, w_q, s_w, b, torch.bfloat16, tg.GemmConfig(16, 16, 32, 1, 1, 4, 2, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled kernels)")
@pytest.mark.parametrize("n,k", [(4096, 4096), (4096, 12288), (2048, 6144)])
@pytest.mark.parametrize("m", [1, 64, 128])
def test_compiled_partial_sums_store_the_gemm_bits(n, k, m):
    """On the GPU, at the Qwen3-8B / 1.7B o and down shapes and the sweep's tile kinds: the norm
    that adds the slices stores what the one-split GEMM + norm store, codes and scales included."""
    from agentq.kernels import triton_gemm as tg
    from agentq.kernels import triton_norm as tn
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x_q, s_x = quant.quantize_act(torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16), SPEC)
    w_q, s_w = quant.quantize_weight(torch.randn(n, k, device="cuda", generator=g) * 0.05, SPEC)
    resid = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(torch.bfloat16)
    q = (SPEC.act_scale_floor, SPEC.act_rounding)
    y = tg.int8_gemm(x_q, s_x, w_q, s_w, None, torch.bfloat16)
    want_s, (want_c, want_sc) = tn.add_rms_norm(resid, y, weight, 1e-6, q)
    for cfg in (tg.GemmConfig(64, 128, 256, 4, 8, 4, 4), tg.GemmConfig(64, 64, 256, 3, 8, 4, 5),
                tg.GemmConfig(64, 256, 128, 8, 8, 8, 4), tg.GemmConfig(64, 32, 256, 2, 8, 4, 6)):
        ps = tg.int8_gemm_partials(x_q, s_x, w_q, s_w, None, torch.bfloat16, cfg)
        assert torch.equal(ps.value(), y), cfg
        got_s, (got_c, got_sc) = tn.add_rms_norm(resid, ps, weight, 1e-6, q)
        assert torch.equal(got_s, want_s) and torch.equal(got_c, want_c) and torch.equal(got_sc, want_sc), cfg
