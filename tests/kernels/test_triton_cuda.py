"""agentq's compiled Triton kernels on a CUDA GPU against the torch references (skipped without one).

Run on a GPU machine: `pytest tests/kernels/test_triton_cuda.py` (or `python -m agentq.eval.bench_kernels --check`).
Quantization and the W8A8 GEMM must be bit-identical to the torch reference (CPU and CUDA torch);
decode attention within bf16 rounding of the fp32 reference (and 1e-5 with fp32 queries).
"""
import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from agentq.kernels import _interp, quant, triton_attention  # noqa: E402
from agentq.kernels.quant_spec import QuantSpec  # noqa: E402

SPEC = QuantSpec()
DEV = torch.device("cuda")
#: Llama-3-8B decoder-layer linears (K, N)
LLAMA8B = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


@pytest.fixture(scope="module")
def K():
    tq, tg, ta = _interp.load_compiled()
    assert not tg.INTERPRETED
    return type("K", (), {"quant": tq, "gemm": tg, "attn": ta})


def _gen(seed, device="cpu"):
    return torch.Generator(device=device).manual_seed(seed)


@pytest.mark.parametrize("mode", ["half_even", "half_away"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quant_bit_identical_cuda(K, mode, dtype):
    g = _gen(0)
    for m, k in ((1, 4096), (17, 14336), (256, 4096), (3, 20000), (5, 96)):
        x = (torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m)[:, None]).to(dtype)
        x[0, :12] = torch.tensor([127.0, 62.5, -62.5, 0.5, -0.5, 1.5, -2.5, 63.5, -126.5, 2.5, 3.5, -3.5]) \
            * (x[0].float().abs().max() / 127)
        if m > 2:
            x[1] = 0
        xd = x.to(DEV)
        q_tri, s_tri = K.quant.quantize_rows(xd, 1e-8, mode)
        q_cpu, s_cpu = quant.quantize_rows(x, 1e-8, mode)
        assert torch.equal(s_tri.cpu(), s_cpu)
        assert torch.equal(q_tri.cpu(), q_cpu), (q_tri.cpu() != q_cpu).sum()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_learner_quant_kernels_bit_identical_cuda(K, dtype):
    """The learner-shaped launches: many short rows tiled BLOCK_M per program (1B-model K/V rows
    and a 1024-wide hidden), the K/V round trip from HF's transposed layout, and dequantize_rows
    (an 8B down-proj input, K = 12288 in column tiles) — all equal to the torch reference."""
    g = _gen(7)
    for m, k in ((9000, 128), (4096, 1024), (300, 40)):
        x = (torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m)[:, None]).to(dtype).to(DEV)
        q_tri, s_tri = K.quant.quantize_rows(x, 1e-8, "half_even")
        q_ref, s_ref = quant.quantize_rows(x, 1e-8, "half_even")
        assert torch.equal(s_tri, s_ref) and torch.equal(q_tri, q_ref)
    kv = (torch.randn(4, 1024, 8, 128, generator=g) * 3).to(dtype).to(DEV).transpose(1, 2)   # [B, H, T, D] view
    rt = K.quant.kv_roundtrip(kv, SPEC.kv_scale_floor, SPEC.kv_rounding)
    assert torch.equal(rt, quant.kv_roundtrip(kv, SPEC)) and rt.stride() == kv.stride()     # HF's layout kept
    codes, scale = quant.quantize_rows(torch.randn(2048, 12288, generator=g).to(DEV), 1e-8, "half_even")
    assert torch.equal(K.quant.dequantize_rows(codes, scale, dtype), quant.dequantize_rows(codes, scale, dtype))


@pytest.mark.parametrize("chunks", [None, (1, 2048, 4), (8, 512, 4), (16, 256, 4)])
def test_col_scaled_chunked_rows_cuda(K, chunks):
    """The learner's dY · s_w codes (int8 dX) at a 1B gate_up shape, 4,096 rows of 12,288: the
    chunked launches (default and tuning candidates) equal the torch reference bit for bit."""
    g = _gen(8)
    x = (torch.randn(4096, 12288, generator=g) * torch.logspace(-9, -5, 4096)[:, None]).bfloat16().to(DEV)
    s = (torch.rand(12288, generator=g) * 1e-3 + 1e-5).to(DEV)
    q_ref, s_ref = quant.quantize_scaled_rows(x, s, quant.GRAD_SCALE_FLOOR, "half_even")
    q, sc = K.quant.quantize_rows(x, quant.GRAD_SCALE_FLOOR, "half_even", col_scale=s, chunks=chunks)
    assert torch.equal(sc, s_ref) and torch.equal(q, q_ref), int((q != q_ref).sum())


@pytest.mark.parametrize("chunk", [1024, 2048])
def test_silu_mul_quant_chunked_rows_cuda(chunk, monkeypatch):
    """SiLU·mul + codes in row chunks (`triton_norm.SILU_QUANT_CHUNK`) at the 1B MLP width, with
    and without the product kept: the codes of `quantize_rows(silu_mul(g, u))` bit for bit."""
    from agentq.kernels import triton_norm
    monkeypatch.setattr(triton_norm, "SILU_QUANT_CHUNK", chunk)
    g = _gen(9)
    gate = (torch.randn(1000, 6144, generator=g) * 3).bfloat16().to(DEV)
    up = torch.randn(1000, 6144, generator=g).bfloat16().to(DEV)
    prod = triton_norm.silu_mul(gate, up)
    q_ref, s_ref = quant.quantize_rows(prod, 1e-8, "half_away")
    q, sc = triton_norm.silu_mul_quant(gate, up, 1e-8, "half_away")
    assert torch.equal(q, q_ref) and torch.equal(sc, s_ref)
    y, (q2, s2) = triton_norm.silu_mul_and_codes(gate, up, 1e-8, "half_away")
    assert torch.equal(y, prod) and torch.equal(q2, q_ref) and torch.equal(s2, s_ref)


@pytest.mark.parametrize("mode", ["half_even", "half_away"])
def test_torch_reference_cuda_equals_cpu(mode):
    """The torch reference itself gives the same codes on CUDA as on the CPU (the spec: IEEE division)."""
    x = torch.randn(64, 4096, generator=_gen(1)) * 3
    q_cpu, s_cpu = quant.quantize_rows(x, 1e-8, mode)
    q_gpu, s_gpu = quant.quantize_rows(x.to(DEV), 1e-8, mode)
    assert torch.equal(s_gpu.cpu(), s_cpu) and torch.equal(q_gpu.cpu(), q_cpu)


def test_quant_ties_cuda(K):
    row = torch.tensor([[127.0, 62.5, -62.5, 0.5, -0.5, 1.5, -2.5, 63.5]], device=DEV)
    assert K.quant.quantize_rows(row, 1e-8, "half_even")[0].tolist() == [[127, 62, -62, 0, 0, 2, -2, 64]]
    assert K.quant.quantize_rows(row, 1e-8, "half_away")[0].tolist() == [[127, 63, -63, 1, -1, 2, -3, 64]]


def test_quant_kv_to_cache_cuda(K):
    S, H, L, D = 6, 8, 64, 128
    x = torch.randn(20, H, D, device=DEV, dtype=torch.bfloat16)
    slots = torch.randint(0, S, (20,), device=DEV, dtype=torch.int32)
    pos = torch.randperm(L, device=DEV)[:20].to(torch.int32)
    a = (torch.zeros(S, H, L, D, dtype=torch.int8, device=DEV), torch.zeros(S, H, L, device=DEV))
    b = (a[0].cpu(), a[1].cpu())
    K.quant.quantize_kv_to_cache(x, *a, slots, pos, SPEC)
    K.quant.quantize_kv_to_cache_ref(x.cpu(), *b, slots.cpu(), pos.cpu(), SPEC)      # CPU = the spec
    assert torch.equal(a[0].cpu(), b[0]) and torch.equal(a[1].cpu(), b[1])


def _linear_case(m, k, n, seed):
    g = _gen(seed, "cuda")
    x = (torch.randn(m, k, generator=g, device=DEV) * 2).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g, device=DEV) * 0.02
    w_q, s_w = quant.quantize_weight(w, SPEC)
    bias = torch.randn(n, generator=g, device=DEV)
    return x, w_q, s_w, bias


def _ref(x, w_q, s_w, bias):
    """Reference: codes/scales from the CPU torch quantizer (the spec), exact
    int32 products from cuBLAS `_int_mm`, the spec's fp32 epilogue (tensor ops, IEEE on CUDA)."""
    x_q, s_x = quant.quantize_act(x.cpu(), SPEC)
    return quant.w8a8_epilogue(quant.int8_matmul(x_q.to(DEV), w_q), s_x.to(DEV), s_w, bias, x.dtype)


@pytest.mark.parametrize("name", list(LLAMA8B))
def test_w8a8_linear_bit_exact_llama_shapes(K, name):
    k, n = LLAMA8B[name]
    for m in (1, 16, 17, 64, 256):
        x, w_q, s_w, bias = _linear_case(m, k, n, seed=m)
        ref = _ref(x, w_q, s_w, bias)
        y = K.gemm.w8a8_linear(x, w_q, s_w, bias, SPEC)              # table / heuristic config
        assert torch.equal(y, ref), (name, m, K.gemm.pick_config(m, n, k, DEV))
        for split in (1, 3, 8):                                         # forced split-K
            cfg = K.gemm.GemmConfig(16 if m <= 16 else 64, 64, 128, split, 8, 4, 3)
            assert torch.equal(K.gemm.w8a8_linear(x, w_q, s_w, bias, SPEC, cfg), ref), (name, m, split)


@pytest.mark.parametrize("persistent", [1, 2])
def test_persistent_tma_gemm_bit_exact_prefill_rows(K, persistent):
    """The persistent TMA kernel at prefill rows (ragged M, a K tail) = the spec's result."""
    for m, k, n in ((4133, 4096, 6144), (1000, 2048 + 64, 1000)):
        x, w_q, s_w, bias = _linear_case(m, k, n, seed=m)
        ref = _ref(x, w_q, s_w, bias)
        for bm, bn in ((128, 128), (256, 128), (128, 256)):
            cfg = K.gemm.GemmConfig(bm, bn, 128, 1, 8, 8, 3, persistent)
            assert torch.equal(K.gemm.w8a8_linear(x, w_q, s_w, bias, SPEC, cfg), ref), (m, k, n, cfg)


@pytest.mark.parametrize("k,n", [(4096, 12288), (2048, 6144)], ids=["qwen3-8b", "qwen3-1.7b"])
def test_glu_gemm_equals_gate_up_then_silu_mul(K, k, n):
    """The gate_up GEMM with SiLU·mul in its epilogue (paired rows), at decode and prefill rows (the table's
    configs, plain and persistent TMA, and AGENTQ_PERSISTENT_GEMM's plain fallback) = the GEMM,
    then `silu_mul`; the codes from its partial absmaxes = `quantize_rows` of that product."""
    from agentq.kernels import triton_norm
    for m in (1, 64, 128, 4133, 8192):
        x, w_q, s_w, bias = _linear_case(m, k, 2 * n, seed=m)
        x_q, s_x = K.quant.quantize_per_token(x, SPEC)
        gu = K.gemm.int8_gemm(x_q, s_x, w_q, s_w, None, torch.bfloat16)
        ref = triton_norm.silu_mul(gu[:, :n], gu[:, n:])
        cfg = K.gemm.glu_config(m, 2 * n, k, DEV)
        w_p, s_p = K.gemm.glu_pair_rows(w_q), K.gemm.glu_pair_rows(s_w)
        for c in {cfg, K.gemm.dataclasses.replace(cfg, persistent=0)}:
            h, amax = K.gemm.int8_gemm_glu(x_q, s_x, w_p, s_p, None, torch.bfloat16, c)
            assert torch.equal(h, ref), (m, c)
            codes = K.quant.quantize_rows_from_amax(h, amax, SPEC.act_scale_floor, SPEC.act_rounding)
            ref_codes = K.quant.quantize_rows(ref, SPEC.act_scale_floor, SPEC.act_rounding)
            assert all(torch.equal(a, b) for a, b in zip(codes, ref_codes)), (m, c)


@pytest.mark.parametrize("k,n", [(4096, 6144), (4096, 24576), (2048, 12288)],
                         ids=["qwen3-8b-qkv", "qwen3-8b-gate_up", "qwen3-1.7b-gate_up"])
def test_spread_columns_bit_exact_at_decode_rows(K, k, n):
    """Columns spread evenly over the SMs (`GemmConfig.spread`: e.g. 188 of a 256-wide tile on 131
    programs) = the spec's result, for the plain GEMM, the GLU GEMM (+ codes) and partial sums."""
    from agentq.kernels import triton_norm
    for m in (1, 64, 128):
        x, w_q, s_w, bias = _linear_case(m, k, n, seed=m + n)
        ref = _ref(x, w_q, s_w, bias)
        x_q, s_x = K.quant.quantize_per_token(x, SPEC)
        gu = K.gemm.int8_gemm(x_q, s_x, w_q, s_w, None, torch.bfloat16)
        glu_ref = triton_norm.silu_mul(gu[:, :n // 2], gu[:, n // 2:])
        w_p, s_p = K.gemm.glu_pair_rows(w_q), K.gemm.glu_pair_rows(s_w)
        for bn, bk, warps, stages, spread in ((64, 256, 4, 4, 1), (256, 128, 8, 3, 1), (128, 128, 4, 4, 2)):
            cfg = K.gemm.GemmConfig(64 if m <= 64 else 128, bn, bk, 1, 8, warps, stages, 0, spread)
            assert torch.equal(K.gemm.w8a8_linear(x, w_q, s_w, bias, SPEC, cfg), ref), (m, cfg)
            h, amax = K.gemm.int8_gemm_glu(x_q, s_x, w_p, s_p, None, torch.bfloat16, cfg)
            assert torch.equal(h, glu_ref), (m, cfg)
            assert amax.shape[1] == K.gemm.column_split(n, cfg, K.gemm.num_sms(DEV))[1]
            assert torch.equal(amax.max(1).values, glu_ref.float().abs().amax(1)), (m, cfg)
            ps = K.gemm.int8_gemm_partials(x_q, s_x, w_q, s_w, None, torch.bfloat16,
                                           K.gemm.dataclasses.replace(cfg, split_k=2))
            assert torch.equal(ps.value(), gu), (m, cfg)


def test_w8a8_odd_shapes_vs_int64_reference(K):
    for m, k, n in ((1, 4100, 4100), (17, 300, 96), (33, 1000, 250)):
        x, w_q, s_w, bias = _linear_case(m, k, n, seed=k)
        x_q, s_x = quant.quantize_act(x.cpu(), SPEC)
        acc = quant.int8_matmul_ref(x_q, w_q.cpu()).to(DEV)      # int64 matmul: CPU only
        ref = quant.w8a8_epilogue(acc, s_x.to(DEV), s_w, bias, x.dtype)
        assert torch.equal(K.gemm.w8a8_linear(x, w_q, s_w, bias, SPEC), ref)
        cpu = quant.w8a8_linear(x.cpu(), w_q.cpu(), s_w.cpu(), bias.cpu(), SPEC)
        assert torch.equal(ref.cpu(), cpu)                               # CUDA == CPU reference


def test_w8a8_cuda_graph_and_batch_invariance(K):
    x, w_q, s_w, bias = _linear_case(16, 14336, 4096, seed=3)
    y0 = K.gemm.w8a8_linear(x, w_q, s_w, bias, SPEC)
    static_x = x.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = K.gemm.w8a8_linear(static_x, w_q, s_w, bias, SPEC)
    for seed in range(3):
        static_x.copy_(torch.randn(x.shape, generator=_gen(seed, "cuda"), device=DEV).to(x.dtype))
        g.replay()
        assert torch.equal(static_y, _ref(static_x, w_q, s_w, bias))
    rows = torch.cat([K.gemm.w8a8_linear(x[i:i + 1], w_q, s_w, bias, SPEC) for i in range(16)])
    assert torch.equal(rows, y0)


def _kv_case(B, Hq, Hkv, D, Lmax, lens, dtype, seed, kv="int8"):
    g = _gen(seed, "cuda")
    S = B + 3
    k = torch.randn(S, Hkv, Lmax, D, generator=g, device=DEV)
    v = torch.randn(S, Hkv, Lmax, D, generator=g, device=DEV)
    q = torch.randn(B, Hq, D, generator=g, device=DEV).to(dtype)
    slots = torch.randperm(S, generator=g, device=DEV)[:B].to(torch.int32)
    lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    if kv == "int8":
        (kc, ks), (vc, vs) = quant.quantize_kv(k, SPEC), quant.quantize_kv(v, SPEC)
    else:
        kc, ks, vc, vs = k.to(dtype), None, v.to(dtype), None
    return q, kc, ks, vc, vs, slots, lens


ATTN_VARIANTS = {"default": {}, "split1": {"num_splits": 1}, "split4": {"num_splits": 4},
                 "bytes": {"words": False, "asm": False}, "words_noasm": {"asm": False}, "k_as_a": {"k_as_a": True},
                 "planes": {"planes": True, "block_n": 128, "num_stages": 3},
                 "planes_split4": {"planes": True, "num_splits": 4},
                 "planes_tma": {"planes": True, "tma": True, "num_warps": 2, "num_stages": 3},
                 "planes_tma_split4": {"planes": True, "tma": True, "num_splits": 4},
                 "planes_tma_pairs": {"planes": True, "tma": True, "pairs": True, "num_warps": 2, "num_stages": 4},
                 # the int8 default's Triton kernel (on sm_90 "default" runs `cuda_attention`'s)
                 "planes_tma_st4": {"planes": True, "tma": True, "num_warps": 2, "num_stages": 4}}


def test_tma_planes_equal_pointer_planes_cuda(K):
    """TMA word tiles and pointer loads, and the word-pair unpacking, feed the same arithmetic: the
    same bits on the H200."""
    case = _kv_case(8, 32, 8, 128, 4096, [4096, 1, 77, 2048, 3000, 513, 4000, 64], torch.bfloat16, seed=9)
    for bn, warps, splits in ((64, 2, 1), (128, 4, 1), (64, 2, 3)):
        cfg = K.attn.AttnConfig(block_n=bn, num_warps=warps, num_stages=3, num_splits=splits, planes=True)
        a = K.attn.decode_attention(*case, 128 ** -0.5, config=cfg)
        b = K.attn.decode_attention(*case, 128 ** -0.5, config=K.attn.dataclasses.replace(cfg, tma=True))
        c = K.attn.decode_attention(*case, 128 ** -0.5, config=K.attn.dataclasses.replace(cfg, tma=True, pairs=True))
        assert torch.equal(a, b) and torch.equal(a, c), (bn, warps, splits)


def _check_decode_variant(K, case, variant: str, label: str) -> None:
    """`decode_attention` with an ATTN_VARIANTS launch (64-position tiles unless it says otherwise)
    against the fp32 reference, within bf16 rounding."""
    cfg = None if variant == "default" else K.attn.AttnConfig(**{"block_n": 64, **ATTN_VARIANTS[variant]})
    out = K.attn.decode_attention(*case, 128 ** -0.5, config=cfg)
    ref = K.attn.decode_attention_ref(*case, 128 ** -0.5)
    err = (out.float() - ref.float()).abs().max().item()
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"decode {label} {variant}: max|err|={err:.2e} rel={rel:.2e}")
    # bf16 output: 1 ulp is 7.8e-3 at |x| in [1, 2)
    assert torch.isfinite(out).all() and err <= 2e-2 and rel <= 5e-3


@pytest.mark.parametrize("kv", ["int8", "bf16"])
@pytest.mark.parametrize("variant", list(ATTN_VARIANTS))
def test_decode_attention_cuda(K, kv, variant):
    lens = [4096, 1, 77, 2048, 3000, 513, 4000, 64]
    _check_decode_variant(K, _kv_case(8, 32, 8, 128, 4096, lens, torch.bfloat16, seed=7, kv=kv), variant, kv)


@pytest.mark.parametrize("variant", ["default", "planes_tma_st4", "planes_tma_pairs"])
def test_decode_attention_gqa2_cuda(K, variant):
    """Qwen3-1.7B heads (GQA 2:1: 2 of the 16 MMA rows are queries) through the default (on sm_90
    `cuda_attention`'s kernel) and the plane kernels, against the reference."""
    lens = [2304, 1, 77, 2048, 1500, 513, 2300, 64]
    _check_decode_variant(K, _kv_case(8, 16, 8, 128, 2304, lens, torch.bfloat16, seed=11), variant, "gqa2")


@pytest.mark.parametrize("pairs", [False, True])
def test_int8_word_to_fp16_is_exact(K, pairs):
    """The PTX magic-number unpacking gives every int8 code exactly, in byte order (one word per
    asm call, or two with the fp16 pairs formed in the asm)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _unpack(w_ptr, o_ptr, N: tl.constexpr, PAIRS: tl.constexpr):
        offs = tl.arange(0, N)
        if PAIRS:
            e0, e1, e2, e3 = triton_attention._word_pairs_to_f16x4(tl.load(w_ptr + offs))
        else:
            e0, e1, e2, e3 = triton_attention._word_to_f16x4(tl.load(w_ptr + offs))
        tl.store(o_ptr + 4 * offs, e0)
        tl.store(o_ptr + 4 * offs + 1, e1)
        tl.store(o_ptr + 4 * offs + 2, e2)
        tl.store(o_ptr + 4 * offs + 3, e3)

    codes = torch.arange(-128, 128, dtype=torch.int8, device=DEV)[torch.randperm(256, device=DEV)]
    out = torch.empty(256, dtype=torch.float16, device=DEV)
    _unpack[(1,)](codes.view(torch.int32), out, N=64, PAIRS=pairs)
    assert torch.equal(out, codes.half())


def test_decode_attention_fp32_queries_cuda(K):
    case = _kv_case(4, 8, 2, 64, 600, [600, 3, 128, 333], torch.float32, seed=8)
    out = K.attn.decode_attention(*case, 0.125, config=K.attn.AttnConfig(num_splits=3))
    ref = K.attn.decode_attention_ref(*case, 0.125)
    assert (out - ref).abs().max() <= 1e-5


def test_decode_attention_cuda_graph(K):
    case = list(_kv_case(16, 32, 8, 128, 1024, [1024] * 16, torch.bfloat16, seed=9))
    out = K.attn.decode_attention(*case, 0.09)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = K.attn.decode_attention(*case, 0.09)
    case[6].copy_(torch.arange(16, device=DEV, dtype=torch.int32) * 60 + 7)   # new ragged lens
    g.replay()
    ref = K.attn.decode_attention_ref(*case, 0.09)
    assert (static.float() - ref.float()).abs().max() <= 2e-2
    assert not torch.equal(static, out)
