"""agentq's Triton kernels under TRITON_INTERPRET=1 (CPU) against the torch reference numerics.

Quantization and the W8A8 GEMM must match `agentq.kernels.quant` bit for bit; decode attention
must match `decode_attention_ref` within 1e-5. The kernel modules are (re)imported with interpreted
kernels by a module fixture and put back as compiled ones afterwards, so this file passes alone and
next to tests that imported the compiled kernels first.
"""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from agentq.kernels import _interp, quant  # noqa: E402
from agentq.kernels.quant_spec import QuantSpec  # noqa: E402

SPEC = QuantSpec()


@pytest.fixture(scope="module")
def K():
    tq, tg, ta = _interp.load_interpreted()
    assert tq.INTERPRETED and tg.INTERPRETED and ta.INTERPRETED
    assert _interp.runs_interpreted(tg._w8a8_gemm_kernel)
    yield SimpleNamespace(quant=tq, gemm=tg, attn=ta)
    _interp.restore_compiled()


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------- quantization
#: a row whose absmax is 127 has scale exactly 1.0, so x / scale == x and the ties are exact
TIE_ROW = [127.0, 62.5, -62.5, 0.5, -0.5, 1.5, -2.5, 63.5, -126.5, 0.49999997, -0.49999997, 2.5]
TIE_CODES = {
    "half_even": [127, 62, -62, 0, 0, 2, -2, 64, -126, 0, 0, 2],
    "half_away": [127, 63, -63, 1, -1, 2, -3, 64, -127, 0, 0, 3],
}


@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_quant_ties_pin_rounding(K, mode):
    x = torch.tensor([TIE_ROW, [-v for v in TIE_ROW]], dtype=torch.float32)
    want = torch.tensor([TIE_CODES[mode], [-c for c in TIE_CODES[mode]]], dtype=torch.int8)
    q_ref, s_ref = quant.quantize_rows(x, 1e-8, mode)
    q_tri, s_tri = K.quant.quantize_rows(x, 1e-8, mode)
    assert torch.equal(s_ref, torch.ones(2)) and torch.equal(s_tri, s_ref)
    assert torch.equal(q_ref, want), q_ref
    assert torch.equal(q_tri, want), q_tri


def _quant_inputs(dtype):
    g = _gen(1)
    x = torch.randn(7, 300, generator=g) * torch.logspace(-4, 3, 7)[:, None]
    x[2] = 0.0                         # all-zero row: scale hits the floor, codes 0
    x[3] = 1e-9 * torch.randn(300, generator=g)   # tiny row: below the floor
    x[4, :8] = torch.tensor(TIE_ROW[:8]) * 0.01   # ties at another scale
    x[5, ::7] *= 40.0                  # outliers
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_quant_rows_bit_identical(K, mode, dtype):
    x = _quant_inputs(dtype)
    for floor in (1e-8, 1e-6):
        q_ref, s_ref = quant.quantize_rows(x, floor, mode)
        q_tri, s_tri = K.quant.quantize_rows(x, floor, mode)
        assert torch.equal(s_tri, s_ref)
        assert torch.equal(q_tri, q_ref), (q_tri != q_ref).sum()
    assert torch.equal(q_tri[2], torch.zeros(300, dtype=torch.int8)) and s_tri[2].item() == pytest.approx(1e-6)


def test_quant_two_pass_path(K, monkeypatch):
    monkeypatch.setattr(K.quant, "MAX_SINGLE_PASS", 64)
    x = _quant_inputs(torch.float32)[:, :200]
    for mode in ("half_even", "half_away"):
        q_ref, s_ref = quant.quantize_rows(x, 1e-8, mode)
        q_tri, s_tri = K.quant.quantize_rows(x, 1e-8, mode)
        assert torch.equal(q_tri, q_ref) and torch.equal(s_tri, s_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_row_tiles_bit_identical(K, dtype, monkeypatch):
    """Many short rows go BLOCK_M to a program (`_quant_row_tiles_kernel`): the same bits, with a
    partial last tile (7 rows of 300, 4 per program) and both rounding modes."""
    monkeypatch.setattr(K.quant, "TILE_MIN_ROWS", 2)
    monkeypatch.setattr(K.quant, "TILE_ELEMS", 5 * 512)
    assert K.quant._rows_per_program(300) == 4
    x = _quant_inputs(dtype)
    for mode in ("half_even", "half_away"):
        q_ref, s_ref = quant.quantize_rows(x, 1e-6, mode)
        q_tri, s_tri = K.quant.quantize_rows(x, 1e-6, mode)
        assert torch.equal(q_tri, q_ref) and torch.equal(s_tri, s_ref)


def test_tiled_launches_can_be_switched_off(K, monkeypatch):
    """AGENTQ_QUANT_TILES=0 brings back the one-row-per-program kernel (same bits): the way around
    a tiled launch that fails on some GPU."""
    monkeypatch.setattr(K.quant, "TILE_MIN_ROWS", 2)
    monkeypatch.setenv("AGENTQ_QUANT_TILES", "0")

    def refuse(*a, **k):
        raise AssertionError("tiled launch used")

    monkeypatch.setattr(K.quant, "_launch_row_tiles", refuse)
    x = _quant_inputs(torch.float32)
    q_tri, s_tri = K.quant.quantize_rows(x, 1e-6, "half_even")
    q_ref, s_ref = quant.quantize_rows(x, 1e-6, "half_even")
    assert torch.equal(q_tri, q_ref) and torch.equal(s_tri, s_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_roundtrip_reads_strided_input_bit_identical(K, dtype):
    """The learner's K/V round trip in one launch: HF's K is a transposed view [B, H, T, D] of a
    [B, T, H, D] buffer, read in place; the result equals dequantize(quantize(x)) bit for bit and
    keeps x's layout (flash attention then reads it as [T, H, D] without a transposing copy)."""
    g = _gen(4)
    B, T, H, D = 2, 5, 3, 40
    buf = torch.randn(B, T, H, D, generator=g) * torch.logspace(-3, 2, H)[:, None]
    buf[1, 2, 0] = 0.0                                   # all-zero row: floor scale, zeros back
    x = buf.to(dtype).transpose(1, 2)                    # [B, H, T, D], not contiguous
    assert not x.is_contiguous()
    got = K.quant.kv_roundtrip(x, SPEC.kv_scale_floor, SPEC.kv_rounding)
    want = quant.kv_roundtrip(x, SPEC)
    assert got.shape == x.shape and got.dtype == dtype and got.stride() == x.stride()
    assert got[0].transpose(0, 1).is_contiguous()
    assert torch.equal(got, want), (got != want).sum()
    # a contiguous input gives a contiguous result; a sliced one a dense one in x's dimension order
    assert K.quant.kv_roundtrip(x.contiguous(), SPEC.kv_scale_floor, SPEC.kv_rounding).is_contiguous()
    sliced = K.quant.kv_roundtrip(x[:, :, 1:4], SPEC.kv_scale_floor, SPEC.kv_rounding)
    assert torch.equal(sliced, want[:, :, 1:4]) and sliced.transpose(1, 2).is_contiguous()
    assert torch.equal(got[1, 0, 2], torch.zeros(D, dtype=dtype))
    # 2D and 3D inputs too (fewer leading dims), and an empty one
    assert torch.equal(K.quant.kv_roundtrip(x[0, 1], 1e-8, "half_away"), quant.dequantize_rows(
        *quant.quantize_rows(x[0, 1], 1e-8, "half_away"), dtype))
    assert torch.equal(K.quant.kv_roundtrip(x[0], 1e-8, "half_even"), quant.dequantize_rows(
        *quant.quantize_rows(x[0], 1e-8, "half_even"), dtype))
    assert K.quant.kv_roundtrip(x[:, :, :0], 1e-8, "half_even").shape == (B, H, 0, D)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_rows_bit_identical(K, dtype, monkeypatch):
    """The STE backward's X_fq: float(code) · scale rounded once to dtype, tiled over rows and K
    (here 3 column tiles of 16 and 3 row tiles of 4, both last ones partial): the same bits as the
    torch reference."""
    monkeypatch.setattr(K.quant, "TILE_ELEMS", 64)
    monkeypatch.setattr(K.quant, "DEQUANT_MAX_BLOCK_K", 16)
    g = _gen(5)
    x = torch.randn(2, 5, 40, generator=g) * torch.logspace(-4, 3, 5)[:, None]
    codes, scale = quant.quantize_rows(x, 1e-8, "half_even")
    got = K.quant.dequantize_rows(codes, scale, dtype)
    want = quant.dequantize_rows(codes, scale, dtype)
    assert got.shape == codes.shape and got.dtype == dtype
    assert torch.equal(got, want), (got != want).sum()


def test_quant_act_and_kv_match_spec(K):
    g = _gen(2)
    x = torch.randn(2, 3, 96, generator=g, dtype=torch.float32).to(torch.bfloat16)
    for ref, tri in ((quant.quantize_act, K.quant.quantize_per_token), (quant.quantize_kv, K.quant.quantize_kv)):
        (q_ref, s_ref), (q_tri, s_tri) = ref(x, SPEC), tri(x, SPEC)
        assert q_tri.shape == x.shape and s_tri.shape == x.shape[:-1]
        assert torch.equal(q_tri, q_ref) and torch.equal(s_tri, s_ref)


def test_quant_kv_to_cache(K):
    g = _gen(3)
    S, H, L, D = 3, 2, 10, 32
    x = torch.randn(4, H, D, generator=g)
    x[1, 0] = 0.0
    slots = torch.tensor([2, 0, 2, 1], dtype=torch.int32)
    pos = torch.tensor([0, 5, 1, 9], dtype=torch.int32)
    caches = [(torch.full((S, H, L, D), 7, dtype=torch.int8), torch.full((S, H, L), -1.0)) for _ in range(2)]
    K.quant.quantize_kv_to_cache(x, *caches[0], slots, pos, SPEC)
    K.quant.quantize_kv_to_cache_ref(x, *caches[1], slots, pos, SPEC)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    codes, scales = quant.quantize_kv(x, SPEC)
    assert torch.equal(caches[0][0][2, :, 1], codes[2]) and torch.equal(caches[0][1][1, :, 9], scales[3])
    assert (caches[0][0][0, :, 0] == 7).all()      # untouched positions stay


# ---------------------------------------------------------------------- W8A8 GEMM
def _gemm_case(m, n, k, seed=0, x_dtype=torch.bfloat16):
    g = _gen(seed)
    x = (torch.randn(m, k, generator=g) * 3).to(x_dtype)
    w = torch.randn(n, k, generator=g) * 0.05
    w_q, s_w = quant.quantize_weight(w, SPEC)
    bias = torch.randn(n, generator=g)
    return x, w_q, s_w, bias


def _reference(x, w_q, s_w, bias, out_dtype):
    x_q, s_x = quant.quantize_act(x, SPEC)
    return quant.w8a8_epilogue(quant.int8_matmul_ref(x_q, w_q), s_x, s_w, bias, out_dtype)


GEMM_CASES = [   # (M, N, K, config): K not a multiple of the block, M = 1 and 17, split-K 1..4
    (1, 64, 200, (16, 32, 64, 1)),
    (1, 48, 300, (16, 32, 64, 4)),
    (17, 40, 256, (16, 32, 64, 3)),
    (17, 64, 96, (32, 32, 32, 2)),
    (5, 80, 512, (16, 64, 128, 1)),
]


@pytest.mark.parametrize("m,n,k,cfg", GEMM_CASES)
def test_gemm_bit_exact(K, m, n, k, cfg):
    x, w_q, s_w, bias = _gemm_case(m, n, k, seed=m + n + k)
    config = K.gemm.GemmConfig(*cfg, group_m=4, num_warps=4, num_stages=2)
    for out_dtype, b in ((torch.bfloat16, bias), (torch.float32, None)):
        xin = x.to(out_dtype)
        y = K.gemm.w8a8_linear(xin, w_q, s_w, b, SPEC, config)
        ref = _reference(xin, w_q, s_w, b, out_dtype)
        assert y.dtype == out_dtype
        assert torch.equal(y, ref), (y.float() - ref.float()).abs().max()
        assert torch.equal(y, quant.w8a8_linear(xin, w_q, s_w, b, SPEC))   # the CPU engine path


def test_gemm_int32_accumulator_is_exact(K):
    # large K and extreme codes: |acc| > 2**24, where an fp32 accumulation would already round
    m, n, k = 3, 32, 2048
    x_q = torch.full((m, k), 127, dtype=torch.int8)
    x_q[1] = -128
    x_q[2, ::2] = -127
    w_q = torch.full((n, k), -128, dtype=torch.int8)
    w_q[::3] = 127
    s_x = torch.ones(m)
    s_w = torch.ones(n)
    for split in (1, 4):
        cfg = K.gemm.GemmConfig(16, 32, 256, split, 8, 4, 2)
        y = K.gemm.int8_gemm(x_q, s_x, w_q, s_w, None, torch.float32, cfg)
        ref = quant.int8_matmul_ref(x_q, w_q).float()
        assert torch.equal(y, ref)
    assert abs(ref).max() > 2 ** 24


def test_gemm_config_and_batch_invariance(K):
    """Every tiling/split gives the same bits, and a row's output does not depend on the batch."""
    x, w_q, s_w, bias = _gemm_case(17, 64, 384, seed=5)
    configs = [K.gemm.GemmConfig(16, 32, 128, 1, 8, 4, 2), K.gemm.GemmConfig(32, 64, 64, 3, 1, 4, 2),
               K.gemm.GemmConfig(16, 16, 32, 4, 2, 4, 2)]
    outs = [K.gemm.w8a8_linear(x, w_q, s_w, bias, SPEC, c) for c in configs]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    single = K.gemm.w8a8_linear(x[9:10], w_q, s_w, bias, SPEC, configs[1])
    assert torch.equal(single, outs[0][9:10])
    ws = K.gemm._WORKSPACE.bufs
    assert ws and all(int(b.abs().sum()) == 0 for b in ws.values())   # split-K leaves workspace/tickets zeroed


def test_column_split_spreads_columns_over_the_sms(K):
    cs, cfg = K.gemm.column_split, K.gemm.GemmConfig
    assert cs(24576, cfg(64, 256, 128, spread=1), 132) == (188, 131)    # Qwen3-8B gate_up: 192 tiles of 128
    assert cs(6144, cfg(64, 64, 256, spread=1), 132) == (48, 128)       # Qwen3-8B qkv: 96 tiles of 64
    assert cs(6144, cfg(64, 64, 256, spread=2), 132) == (24, 256)
    assert cs(80, cfg(16, 32, 64, spread=1), 3) == (28, 3)              # 28 + 28 + 24, rounded up to even
    assert cs(6144, cfg(64, 32, 256, spread=1), 132) == (32, 192)       # 48 columns do not fit: block_n apiece
    assert cs(6144, cfg(64, 64, 256), 132) == (64, 96)
    with pytest.raises(ValueError, match="persistent"):
        cfg(64, 64, 256, persistent=1, spread=1)
    with pytest.raises(ValueError, match="per SM"):
        cfg(64, 64, 256, spread=-1)
    spread = cfg(64, 256, 128, 2, 8, 8, 3, 0, 1)
    assert cfg(*spread.table_row()) == spread and spread.short().endswith("/st3/sp1")


@pytest.mark.parametrize("split", [1, 3])
def test_spread_columns_give_the_same_bits(K, split, monkeypatch):
    """Columns spread over 3 "SMs" (28 + 28 + 24 of 80, in masked 32-wide tiles): the spare columns
    of a tile belong to the next program and must be neither summed nor stored; ragged K (200), an
    atomic split-K, bias and none."""
    monkeypatch.setattr(K.gemm, "num_sms", lambda device=None: 3)
    x, w_q, s_w, bias = _gemm_case(17, 80, 200, seed=13)
    cfg = K.gemm.GemmConfig(16, 32, 64, split, 2, 4, 2, 0, 1)
    for out_dtype, b in ((torch.bfloat16, bias), (torch.float32, None)):
        xin = x.to(out_dtype)
        y = K.gemm.w8a8_linear(xin, w_q, s_w, b, SPEC, cfg)
        assert torch.equal(y, _reference(xin, w_q, s_w, b, out_dtype))
    assert all(int(t.abs().sum()) == 0 for t in K.gemm._WORKSPACE.bufs.values())


@pytest.mark.parametrize("persistent", [1, 2, 3])
def test_persistent_tma_gemm_gives_the_same_bits(K, persistent, monkeypatch):
    """The persistent TMA kernel (prefill rows): ragged M, N and K (TMA reads zeros past the edges,
    which add nothing to the integer sums), more tiles than programs, bias and none. K = 208: rows
    of 16-byte multiples, which TMA needs (at K = 200 the plain kernel would run instead)."""
    x, w_q, s_w, bias = _gemm_case(70, 80, 208, seed=11)
    cfg = K.gemm.GemmConfig(32, 32, 64, 1, 2, 4, 2, persistent)
    ran = []
    tma = K.gemm._int8_gemm_tma
    monkeypatch.setattr(K.gemm, "_int8_gemm_tma", lambda *a, **kw: (ran.append(1), tma(*a, **kw))[1])
    for out_dtype, b in ((torch.bfloat16, bias), (torch.float32, None)):
        xin = x.to(out_dtype)
        y = K.gemm.w8a8_linear(xin, w_q, s_w, b, SPEC, cfg)
        assert torch.equal(y, _reference(xin, w_q, s_w, b, out_dtype))
    assert len(ran) == 2


def test_gemm_default_config_and_3d_input(K):
    x, w_q, s_w, bias = _gemm_case(6, 48, 160, seed=7)
    x3 = x.reshape(2, 3, 160)
    y = K.gemm.w8a8_linear(x3, w_q, s_w, None, SPEC)          # pick_config: table or heuristic config
    assert y.shape == (2, 3, 48)
    assert torch.equal(y.reshape(6, 48), _reference(x, w_q, s_w, None, torch.bfloat16))


def test_table_rows_round_trip(K, tmp_path):
    path = tmp_path / "table.json"
    path.write_text('{"gemm": {"64x32": [[16, [16, 32, 64, 2, 8, 4, 3]], [64, [64, 32, 64, 4, 8, 4, 3]]]}}')
    table = K.gemm.load_table(path)
    assert table[(64, 32)][1][1].short() == "64x32x64/s4/g8/w4/st3"
    assert [c.table_row() for _, c in table[(64, 32)]] == [[16, 32, 64, 2, 8, 4, 3], [64, 32, 64, 4, 8, 4, 3]]
    persistent = K.gemm.GemmConfig(128, 128, 128, 1, 8, 8, 3, 2)
    assert K.gemm.GemmConfig(*persistent.table_row()) == persistent and persistent.short().endswith("/p2")


def test_large_m_table_rows_serve_larger_m(K, monkeypatch):
    small, large = K.gemm.GemmConfig(64, 32, 256, 1, 8, 4, 6), K.gemm.GemmConfig(256, 128, 128, 1, 8, 8, 3, 2)
    monkeypatch.setitem(K.gemm.H200_TABLE, (96, 32), [(64, small), (K.gemm.LARGE_M, large)])
    monkeypatch.setitem(K.gemm.H200_TABLE, (80, 32), [(64, small)])
    assert K.gemm.pick_config(64, 96, 32) == small and K.gemm.pick_config(100, 96, 32) == large
    assert K.gemm.pick_config(10 * K.gemm.LARGE_M, 96, 32) == large       # beyond the last measured M
    assert K.gemm.pick_config(10 * K.gemm.LARGE_M, 80, 32) == K.gemm.heuristic_config(10 * K.gemm.LARGE_M, 80, 32)


def test_heuristic_configs_are_valid(K):
    for m in (1, 16, 64, 256, 1000):
        for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (40, 24)):
            c = K.gemm.pick_config(m, n, k)
            assert c.block_m >= 16 and c.block_n >= 16 and c.block_k >= 32 and c.split_k >= 1


# ---------------------------------------------------------------------- decode attention
def _attn_case(seed, S=5, Hkv=2, Lmax=160, D=32, Hq=8):
    g = _gen(seed)
    k = torch.randn(S, Hkv, Lmax, D, generator=g)
    v = torch.randn(S, Hkv, Lmax, D, generator=g)
    q = torch.randn(4, Hq, D, generator=g)
    slots = torch.tensor([3, 0, 4, 1], dtype=torch.int32)
    lens = torch.tensor([150, 7, 64, 1], dtype=torch.int32)   # ragged, incl. a single token
    return q, k, v, slots, lens


@pytest.mark.parametrize("kv,splits,variant", [
    ("int8", 1, {}), ("int8", 3, {}), ("fp32", 1, {}), ("fp32", 3, {}),
    ("int8", 1, {"words": False}), ("int8", 3, {"k_as_a": True}), ("fp32", 2, {"k_as_a": True})])
def test_decode_attention_matches_ref(K, kv, splits, variant):
    q, k, v, slots, lens = _attn_case(11)
    if kv == "int8":
        (kc, ks), (vc, vs) = quant.quantize_kv(k, SPEC), quant.quantize_kv(v, SPEC)
    else:
        kc, ks, vc, vs = k, None, v, None
    sm = q.shape[-1] ** -0.5
    cfg = K.attn.AttnConfig(block_n=32, num_warps=4, num_stages=2, num_splits=splits, **variant)
    out = K.attn.decode_attention(q, kc, ks, vc, vs, slots, lens, sm, config=cfg)
    ref = K.attn.decode_attention_ref(q, kc, ks, vc, vs, slots, lens, sm)
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert (out - ref).abs().max() <= 1e-5


def _record_word_descs(K, monkeypatch) -> list:
    """The block_n of every TMA descriptor pair `decode_attention` builds (the TMA path ran)."""
    descs: list = []
    word_descs = K.attn._word_descs
    monkeypatch.setattr(K.attn, "_word_descs", lambda *a: (descs.append(a[2]), word_descs(*a))[1])
    return descs


def _int8_attn_case(seed):
    """`_attn_case` at head_dim 64 with int8 K/V: (q, k codes, k scales, v codes, v scales, slots, lens, sm_scale)."""
    q, k, v, slots, lens = _attn_case(seed, D=64)
    (kc, ks), (vc, vs) = quant.quantize_kv(k, SPEC), quant.quantize_kv(v, SPEC)
    return q, kc, ks, vc, vs, slots, lens, q.shape[-1] ** -0.5


@pytest.mark.parametrize("splits,tma", [(1, False), (3, False), (1, True), (3, True)])
def test_decode_attention_byte_planes_matches_ref(K, splits, tma, monkeypatch):
    """The byte-plane kernel (4 dots over columns 4w + j instead of one over an interleaved tile)
    gives the reference's result, on ragged rows, with and without splits (head_dim 64); with its
    word tiles loaded through TMA descriptors, the same bits as with pointer loads."""
    launched = []
    kernel = K.attn._decode_planes_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return kernel[grid]

    monkeypatch.setattr(K.attn, "_decode_planes_kernel", Spy())
    descs = _record_word_descs(K, monkeypatch)
    q, kc, ks, vc, vs, slots, lens, sm = _int8_attn_case(12)
    cfg = K.attn.AttnConfig(block_n=32, num_warps=4, num_stages=2, num_splits=splits, planes=True, tma=tma)
    out = K.attn.decode_attention(q, kc, ks, vc, vs, slots, lens, sm, config=cfg)
    ref = K.attn.decode_attention_ref(q, kc, ks, vc, vs, slots, lens, sm)
    assert launched == [(4, 2, splits)]
    assert descs == ([32] if tma else [])        # the TMA path ran when asked for
    if tma:
        plain = K.attn.decode_attention(q, kc, ks, vc, vs, slots, lens, sm, config=dataclasses.replace(cfg, tma=False))
        assert torch.equal(out, plain)
    assert (out - ref).abs().max() <= 1e-5


def test_decode_attention_tma_config_on_strided_caches_loads_by_pointer(K, monkeypatch):
    """A TMA launch on caches a descriptor cannot cover (here a position slice of a longer cache)
    falls back to pointer loads, and gives the same result as on the contiguous caches."""
    descs = _record_word_descs(K, monkeypatch)
    q, kc, ks, vc, vs, slots, lens, sm = _int8_attn_case(13)
    cfg = K.attn.AttnConfig(block_n=32, num_warps=4, num_stages=4, num_splits=1, planes=True, tma=True)
    out = K.attn.decode_attention(q, kc, ks, vc, vs, slots, lens, sm, config=cfg)
    assert descs == [32]
    pad = lambda c: torch.cat([c, torch.zeros_like(c[:, :, :8])], dim=2)[:, :, :c.shape[2]]   # noqa: E731
    kc_s, vc_s = pad(kc), pad(vc)
    assert not kc_s.is_contiguous()
    strided = K.attn.decode_attention(q, kc_s, ks, vc_s, vs, slots, lens, sm, config=cfg)
    assert descs == [32] and torch.equal(strided, out)


def test_decode_attention_ref_is_dequantized_softmax(K):
    """The reference itself: int8 cache == float attention over kv_roundtrip'ed K/V (GQA 4:1)."""
    q, k, v, slots, lens = _attn_case(12)
    (kc, ks), (vc, vs) = quant.quantize_kv(k, SPEC), quant.quantize_kv(v, SPEC)
    ref = K.attn.decode_attention_ref(q, kc, ks, vc, vs, slots, lens, 0.2)
    kd, vd = quant.kv_roundtrip(k, SPEC), quant.kv_roundtrip(v, SPEC)
    for b in range(q.shape[0]):
        s, n = slots[b].item(), lens[b].item()
        kk = kd[s, :, :n].repeat_interleave(4, dim=0)      # [Hq, n, D]
        vv = vd[s, :, :n].repeat_interleave(4, dim=0)
        p = torch.softmax((q[b][:, None, :] * kk).sum(-1) * 0.2, dim=-1)
        torch.testing.assert_close(ref[b], (p[..., None] * vv).sum(1), atol=1e-6, rtol=1e-5)


def test_decode_attention_other_caches(K):
    q, k, v, slots, lens = _attn_case(13)
    sm = 0.3
    cfg = K.attn.AttnConfig(block_n=32, num_splits=2)
    # bf16 q and cache (output rounded to bf16 by the kernel, to nearest even)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    out = K.attn.decode_attention(qb, kb, None, vb, None, slots, lens, sm, config=cfg)
    ref = K.attn.decode_attention_ref(qb, kb, None, vb, None, slots, lens, sm)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref.float()).abs().max() <= 1e-2 and (out != ref).float().mean() < 0.02
    # fp8 E4M3 cache with per-tensor scales (tensor and float)
    k8 = (k / 0.01).clamp(-448, 448).to(torch.float8_e4m3fn)
    v8 = (v / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn)
    out = K.attn.decode_attention(q, k8, torch.tensor(0.01), v8, 0.02, slots, lens, sm, config=cfg)
    ref = K.attn.decode_attention_ref(q, k8, torch.tensor(0.01), v8, 0.02, slots, lens, sm)
    assert (out - ref).abs().max() <= 1e-5
    # empty rows give zeros; the default config (heuristic splits) runs
    lens0 = torch.tensor([0, 7, 160, 1], dtype=torch.int32)
    (kc, ks), (vc, vs) = quant.quantize_kv(k, SPEC), quant.quantize_kv(v, SPEC)
    out = K.attn.decode_attention(q, kc, ks, vc, vs, slots, lens0, sm)
    ref = K.attn.decode_attention_ref(q, kc, ks, vc, vs, slots, lens0, sm)
    assert (out - ref).abs().max() <= 1e-5 and out[0].abs().max() == 0


def test_decode_attention_ref_validates(K):
    q, k, v, slots, lens = _attn_case(14, Hq=6, Hkv=4)
    with pytest.raises(ValueError):
        K.attn.decode_attention_ref(q, k, None, v, None, slots, lens, 1.0)


def test_kv_bytes_per_token(K):
    # Llama-3-8B: 32 layers, 8 KV heads, head_dim 128
    int8 = K.attn.kv_bytes_per_token(32, 8, 128, torch.int8)
    bf16 = K.attn.kv_bytes_per_token(32, 8, 128, torch.bfloat16)
    assert (int8, bf16) == (2 * 32 * 8 * 132, 2 * 32 * 8 * 256)
    assert int8 / bf16 <= 0.52
