"""The gate_up GEMM with SiLU·mul in its epilogue (`triton_gemm.int8_gemm_glu`, gate and up rows
paired) and the one-read quantization from its partial row absmaxes
(`triton_quant.quantize_rows_from_amax`), under TRITON_INTERPRET=1: bit-identical to the two-launch
path they replace (the stacked gate_up GEMM, then `triton_norm.silu_mul`, then `quantize_rows`)."""
import pytest
import torch

from agentq.kernels import _interp, quant
from agentq.kernels.quant_spec import QuantSpec

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
SPEC = QuantSpec()


@pytest.fixture(scope="module")
def K(gemm_norm_kernels):
    return gemm_norm_kernels


def _glu_case(m, n, k, seed, bias=True):
    """Per-token codes of random rows and a [2n, k] gate_up weight, scales and bias (gate rows, then
    up rows: `_paired` gives what `int8_gemm_glu` reads)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    w_q, s_w = quant.quantize_weight(torch.randn(2 * n, k, generator=g) * 0.05, SPEC)
    x_q, s_x = quant.quantize_act(x, SPEC)
    b = torch.randn(2 * n, generator=g) if bias else None
    return x_q, s_x, w_q, s_w, b


def _two_launch(K, x_q, s_x, w_q, s_w, b, out_dtype):
    """What the engine ran before: the gate_up GEMM, then the SiLU·mul kernel on its halves."""
    _, tg, tn = K
    n = w_q.shape[0] // 2
    gu = tg.int8_gemm(x_q, s_x, w_q, s_w, b, out_dtype, tg.GemmConfig(16, 32, 64, 1, 2, 4, 2))
    assert torch.equal(gu, quant.w8a8_epilogue(quant.int8_matmul_ref(x_q, w_q), s_x, s_w, b, out_dtype))
    return tn.silu_mul(gu[:, :n], gu[:, n:])


def _paired(tg, w_q, s_w, b):
    pair = tg.glu_pair_rows
    return pair(w_q), pair(s_w), None if b is None else pair(b)


CONFIGS = [   # plain (ragged M / N / K tiles, GROUP_M 1 and 2), the persistent TMA kernel, spread columns
    (16, 16, 64, 1, 2, 4, 2, 0),
    (32, 32, 32, 1, 1, 4, 2, 0),
    (32, 16, 64, 1, 2, 4, 2, 1),
    (16, 32, 64, 1, 2, 4, 2, 2),
    (16, 64, 64, 1, 1, 4, 2, 0),
    (16, 32, 64, 1, 2, 4, 2, 0, 1),     # on 3 "SMs": 28 + 28 + 24 of the 80 paired rows, 32-row tiles
]


def test_pair_rows_interleaves_gate_and_up(K):
    _, tg, _ = K
    t = torch.arange(12).reshape(6, 2)                 # gate rows 0-2, up rows 3-5
    p = tg.glu_pair_rows(t)
    assert p[:, 0].tolist() == [0, 6, 2, 8, 4, 10] and torch.equal(tg.glu_unpair_rows(p), t)
    assert tg.glu_pair_rows(torch.arange(4)).tolist() == [0, 2, 1, 3]
    with pytest.raises(ValueError, match="odd"):
        tg.glu_pair_rows(torch.zeros(5, 2))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"p{c[7]}-{c[0]}x{c[1]}x{c[2]}" + ("-spread" if c[8:] else ""))
def test_glu_gemm_equals_gemm_then_silu_mul(K, cfg, monkeypatch):
    _, tg, _ = K
    config = tg.GemmConfig(*cfg)
    monkeypatch.setattr(tg, "num_sms", lambda device=None: 3)
    programs = 3 if config.spread else -(-80 // config.block_n)     # column programs over the 80 paired rows
    launched = []
    for name in ("_int8_gemm_tma", "_launch_plain"):     # the path the config asks for is the one that ran
        fn = getattr(tg, name)
        monkeypatch.setattr(tg, name, lambda *a, _fn=fn, _name=name, **kw: (launched.append(_name), _fn(*a, **kw))[1])
    # m = 37 rows and n = 40 columns: ragged against every tile; k = 208: a ragged K tile, 16-byte rows (TMA)
    for out_dtype, bias in ((torch.bfloat16, True), (torch.float16, True), (torch.float32, False)):
        x_q, s_x, w_q, s_w, b = _glu_case(37, 40, 208, seed=3, bias=bias)
        launched.clear()
        h, amax = tg.int8_gemm_glu(x_q, s_x, *_paired(tg, w_q, s_w, b), out_dtype, config)
        assert launched == ["_int8_gemm_tma" if config.persistent else "_launch_plain"]
        ref = _two_launch(K, x_q, s_x, w_q, s_w, b, out_dtype)
        assert h.dtype == out_dtype and torch.equal(h, ref), (h.float() - ref.float()).abs().max()
        assert amax.shape == (37, programs)                          # a partial per column program
        assert torch.equal(amax.max(1).values, ref.float().abs().amax(1))     # partials of the row absmax


def test_codes_from_amax_equal_quantize_rows(K):
    tq, tg, _ = K
    x_q, s_x, w_q, s_w, b = _glu_case(9, 24, 64, seed=5)
    h, amax = tg.int8_gemm_glu(x_q, s_x, *_paired(tg, w_q, s_w, b), torch.bfloat16,
                               tg.GemmConfig(16, 16, 32, 1, 2, 4, 2))
    for rounding in ("half_even", "half_away"):
        codes, scales = tq.quantize_rows_from_amax(h, amax, 1e-8, rounding)
        ref_codes, ref_scales = quant.quantize_rows(h, 1e-8, rounding)
        assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)
    # rows of 3,000: spread over two column blocks, with the scale written once
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 3000, generator=g) * 2).to(torch.bfloat16)
    x[1] = 0                                                    # an all-zero row takes the floor
    parts = x.float().abs().reshape(3, 3, 1000).amax(-1)
    codes, scales = tq.quantize_rows_from_amax(x, parts, 1e-6, "half_even")
    ref_codes, ref_scales = quant.quantize_rows(x, 1e-6, "half_even")
    assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales) and scales[1] == 1e-6
    # several rows a program (the prefill launch), 7 rows over blocks of 4: a ragged last block
    x = (torch.randn(7, 3000, generator=g) * 3).to(torch.bfloat16)
    parts = x.float().abs().reshape(7, 3, 1000).amax(-1)
    ref_codes, ref_scales = quant.quantize_rows(x, 1e-6, "half_away")
    for launch in ((4, 1024, 4), (2, 2048, 8), (1, 4096, 8)):
        codes, scales = tq.quantize_rows_from_amax(x, parts, 1e-6, "half_away", launch=launch)
        assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales), launch


def test_glu_gemm_refuses_bad_input(K):
    _, tg, _ = K
    x_q, s_x, w_q, s_w, _ = _glu_case(4, 8, 32, seed=1)
    with pytest.raises(ValueError, match="odd"):
        tg.int8_gemm_glu(x_q, s_x, w_q[:15], s_w[:15], None, torch.bfloat16)
    with pytest.raises(ValueError, match="split-K"):
        tg.int8_gemm_glu(x_q, s_x, w_q, s_w, None, torch.bfloat16, tg.GemmConfig(16, 16, 32, 2, 2, 4, 2))


def test_glu_config_is_the_plain_gemm_config_unless_measured(K, monkeypatch):
    """Without a measured "glu" row: the plain GEMM's config for the paired weight, unsplit (the
    same tiles and weight bytes per program); a measured row wins."""
    _, tg, _ = K
    monkeypatch.setattr(tg, "H200_GLU_TABLE", {})
    for m, n2, k in ((64, 24576, 4096), (32768, 24576, 4096), (64, 12288, 2048), (16, 8192, 4096)):
        full, glu = tg.pick_config(m, n2, k), tg.glu_config(m, n2, k)
        assert glu == tg.dataclasses.replace(full, split_k=1)
    tuned = tg.GemmConfig(64, 32, 256, 1, 8, 4, 5)
    monkeypatch.setattr(tg, "H200_GLU_TABLE", {(24576, 4096): [(64, tuned)]})
    assert tg.glu_config(64, 24576, 4096) == tuned and tg.glu_config(65, 24576, 4096) != tuned



def test_shipped_glu_rows_change_only_prefill_launches(K):
    """The "glu" rows measured at prefill rows (round 31: 1.7B gate_up at 128x256 tiles in 4 stages)
    keep decode's launches: a table row serves every M up to its max_M, so each glu key repeats
    the plain rows up to M 256, and the prefill rows stay persistent (TMA) launches."""
    _, tg, _ = K
    assert tg.H200_GLU_TABLE, "the shipped table has measured glu rows"
    for (n2, k), rows in tg.H200_GLU_TABLE.items():
        for m in (1, 16, 64, 65, 128, 200, 256):
            assert tg.glu_config(m, n2, k) == tg.dataclasses.replace(tg.pick_config(m, n2, k), split_k=1), (n2, k, m)
        for m in (257, 8192, 32768, 65536):
            assert tg.glu_config(m, n2, k).persistent, (n2, k, m)
    assert tg.glu_config(32768, 12288, 2048) == tg.GemmConfig(128, 256, 128, 1, 8, 8, 4, 2)

def test_w8a8_glu_codes_is_the_engine_path(K):
    """`int8_linear.w8a8_glu_codes` (what `EngineLinear.silu_mul` runs on CUDA) on [B, T, K] codes:
    the product's rows, or their codes = `quantize_rows` of the two-launch product."""
    from agentq.kernels import int8_linear
    _, tg, _ = K
    x_q, s_x, w_q, s_w, b = _glu_case(6, 24, 64, seed=8)
    ref = _two_launch(K, x_q, s_x, w_q, s_w, b, torch.bfloat16)
    paired = _paired(tg, w_q, s_w, b)
    h = int8_linear.w8a8_glu_codes(x_q.reshape(2, 3, 64), s_x.reshape(2, 3), *paired, torch.bfloat16, None)
    assert h.shape == (2, 3, 24) and torch.equal(h.reshape(6, 24), ref)
    codes, scales = int8_linear.w8a8_glu_codes(x_q.reshape(2, 3, 64), s_x.reshape(2, 3), *paired,
                                               torch.bfloat16, (1e-8, "half_away"))
    ref_codes, ref_scales = quant.quantize_rows(ref, 1e-8, "half_away")
    assert torch.equal(codes.reshape(6, 24), ref_codes) and torch.equal(scales.reshape(6), ref_scales)
    # CPU engines keep the stacked rows and the two-launch path; CUDA ones pair them while GLU_GEMM is on
    assert not int8_linear.glu_layout(True, "cpu") and not int8_linear.glu_layout(False, "cuda")
