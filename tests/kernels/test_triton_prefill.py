"""Prefill attention over the slot cache read in place (Triton; under TRITON_INTERPRET=1 on CPU)
against the fp32 reference and against the engine's torch path (cache read back + masked SDPA)."""
import pytest
import torch

from agentq.kernels import _interp, quant
from agentq.kernels.quant_spec import QuantSpec

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_attention", "agentq.kernels.triton_prefill")
SPEC = QuantSpec.preset("w8a8_kv8")


@pytest.fixture
def P():
    """triton_prefill (re)imported under the interpreter, compiled kernels put back afterwards."""
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test (the GPU machine runs the compiled test below)")
    *_, mod = _interp.load_interpreted(MODULES)
    assert mod.INTERPRETED
    yield mod
    _interp.restore_compiled(MODULES)


def _case(hq, hkv, d=16, seed=0):
    """5 slots of 40 positions; 3 rows: a prefix + 7 new tokens, a fresh row of 3, a row with none."""
    g = torch.Generator().manual_seed(seed)
    kf, vf = torch.randn(5, hkv, 40, d, generator=g), torch.randn(5, hkv, 40, d, generator=g)
    q = torch.randn(3, 7, hq, d, generator=g).transpose(1, 2)                  # [B, Hq, T, D], strided like the engine's
    rows = (torch.tensor([3, 0, 4], dtype=torch.int32), torch.tensor([7, 3, 0], dtype=torch.int32),
            torch.tensor([20, 3, 9], dtype=torch.int32))                      # slots, n_new, new_lens
    return q, kf, vf, rows


@pytest.mark.parametrize("hq,hkv", [(2, 2), (6, 2), (8, 2)])          # groups 1, 3 (not a power of two), 4
@pytest.mark.parametrize("cache", ["int8", "float"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_matches_the_reference(P, hq, hkv, cache, dtype):
    q, kf, vf, rows = _case(hq, hkv, seed=hq + hkv)
    q = q.to(dtype)
    if cache == "int8":
        (k, ks), (v, vs) = quant.quantize_kv(kf, SPEC), quant.quantize_kv(vf, SPEC)
    else:
        (k, ks), (v, vs) = (kf.to(dtype), None), (vf.to(dtype), None)
    cfg = P.PrefillConfig(block_t=4, block_n=16)                 # several query blocks and key tiles, partial ones
    out = P.prefill_attention(q, k, ks, v, vs, *rows, 0.25, cfg)
    ref = P.prefill_attention_ref(q, k, ks, v, vs, *rows, 0.25)
    assert out.shape == q.shape and out.dtype == dtype
    assert out.transpose(1, 2).is_contiguous()                   # token-major, what the o-projection reads
    step = 2 ** -10 if dtype == torch.float16 else 2 ** -7         # one rounding step of the output dtype (|o| < 4)
    assert (out.float() - ref.float()).abs().max() <= 4 * step
    assert torch.equal(out[:, :, 3:][1], torch.zeros_like(out[:, :, 3:][1]))   # padding tokens: zeros
    assert torch.equal(out[2], torch.zeros_like(out[2]))                       # a row with no new token


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_int8_codes_read_as_words_give_the_bits_of_codes_read_as_bytes(P, dtype):
    """The word path (four codes per int32 load, unpacked in registers) feeds the dots the same
    exact fp16 values as a byte load + cast, so the outputs are the same bits."""
    q, kf, vf, rows = _case(8, 2, d=32, seed=5)
    q = q.to(dtype)
    (k, ks), (v, vs) = quant.quantize_kv(kf, SPEC), quant.quantize_kv(vf, SPEC)
    out = {c: P.prefill_attention(q, k, ks, v, vs, *rows, 0.25, P.PrefillConfig(block_t=4, block_n=16, codes=c))
           for c in ("words", "bytes")}
    assert torch.equal(out["words"], out["bytes"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_copy_read_is_the_float_kernel_over_the_dequantized_cache(P, dtype, monkeypatch):
    """"copy" dequantizes each row's K/V (`quant.dequantize_rows`, the values the learner's KV round
    trip gives) and runs the float-cache kernel on them: the same bits as that kernel over a float
    cache holding those values. Made once per call, and only for chunks of ≥ COPY_MIN_TOKENS
    tokens within COPY_MAX_BYTES; otherwise the codes are read in place (words)."""
    q, kf, vf, rows = _case(8, 2, d=32, seed=5)
    q = q.to(dtype)
    (k, ks), (v, vs) = quant.quantize_kv(kf, SPEC), quant.quantize_kv(vf, SPEC)
    kd, vd = quant.dequantize_rows(k, ks, dtype), quant.dequantize_rows(v, vs, dtype)
    launch = dict(block_t=4, block_n=16)
    as_float = P.prefill_attention(q, kd, None, vd, None, *rows, 0.25, P.PrefillConfig(**launch))
    in_place = P.prefill_attention(q, k, ks, v, vs, *rows, 0.25, P.PrefillConfig(**launch, codes="words"))
    copies = []
    real_copy = P._dequant_copy
    monkeypatch.setattr(P, "_dequant_copy", lambda *a: copies.append(a[-2]) or real_copy(*a))

    def run(**kw):
        return P.prefill_attention(q, k, ks, v, vs, *rows, 0.25, P.PrefillConfig(**launch, codes="copy"), **kw)
    assert torch.equal(run(), in_place) and copies == []            # 7 tokens < COPY_MIN_TOKENS: in place
    monkeypatch.setattr(P, "COPY_MIN_TOKENS", 4)
    assert torch.equal(run(), as_float) and copies == [20]          # key_len = the longest row (a sync)
    assert torch.equal(run(key_len=20), as_float) and copies == [20, 20]
    ref = P.prefill_attention_ref(q, k, ks, v, vs, *rows, 0.25)
    step = 2 ** -10 if dtype == torch.float16 else 2 ** -7
    assert (run().float() - ref.float()).abs().max() <= 4 * step
    monkeypatch.setattr(P, "COPY_MAX_BYTES", 2 * 3 * 2 * 20 * 32 * 2 - 1)  # one byte short of this call's copy
    assert torch.equal(run(), in_place) and copies == [20, 20, 20]


def test_prefill_config_refuses_an_unknown_code_read(P):
    with pytest.raises(ValueError, match="codes="):
        P.PrefillConfig(codes="nibbles")


def test_prefill_is_the_engines_read_back_attention(P):
    """What the engine computed before: K/V written through `KVCache.write`, read back
    dequantized, masked SDPA from positions (fp32, so fp64 attention): the same numbers to 1e-5."""
    from agentq.kernels.attention import masked_attention
    from agentq.rollout.torch_engine.kv_cache import KVCache

    g = torch.Generator().manual_seed(5)
    hq, hkv, d = 4, 2, 16
    cache = KVCache(1, 4, hkv, 48, d, SPEC, torch.float32)
    slots, lens0, n_new = torch.tensor([2, 0]), torch.tensor([11, 0]), torch.tensor([6, 4])
    for s, n in zip(slots.tolist(), lens0.tolist()):                           # cached prefixes
        if n:
            cache.write(0, torch.full((n,), s), torch.arange(n), torch.randn(n, hkv, d, generator=g),
                        torch.randn(n, hkv, d, generator=g))
    t = int(n_new.max())
    valid = torch.arange(t)[None, :] < n_new[:, None]
    pos = lens0[:, None] + torch.arange(t)[None, :]
    vb, vt = valid.nonzero(as_tuple=True)
    k_new, v_new = torch.randn(2, t, hkv, d, generator=g), torch.randn(2, t, hkv, d, generator=g)
    cache.write(0, slots[vb], pos[vb, vt], k_new[vb, vt], v_new[vb, vt])
    new_lens = lens0 + n_new
    q = torch.randn(2, hq, t, d, generator=g)
    kc, vc = cache.read(0, slots, int(new_lens.max()))
    keys = torch.arange(int(new_lens.max()))
    torch_path = masked_attention(q, kc, vc, keys.view(1, 1, -1) <= pos.unsqueeze(-1), d ** -0.5)
    out = P.prefill_attention(q, cache.k[0], cache.k_scale[0], cache.v[0], cache.v_scale[0], slots.int(),
                              n_new.int(), new_lens.int(), d ** -0.5, P.PrefillConfig(block_t=4, block_n=16))
    real = valid[:, None, :, None]
    assert (torch.where(real, out - torch_path, 0.0)).abs().max() < 1e-5


def test_prefill_refuses_what_it_does_not_take(P):
    q, kf, vf, rows = _case(4, 2)
    with pytest.raises(ValueError, match="does not take"):            # a float cache of another dtype
        P.prefill_attention(q.half(), kf, None, vf, None, *rows, 0.25)
    with pytest.raises(ValueError, match="shape mismatch"):           # Hq not a multiple of Hkv
        P.prefill_attention(q[:, :3].half(), kf.half(), None, vf.half(), None, *rows, 0.25)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cache", ["int8", "float"])
def test_compiled_prefill_on_cuda_matches_the_reference(cache):
    """Qwen3-8B heads, a 512-token chunk after prefixes of 0–1,500 tokens, rows of unequal length."""
    from agentq.kernels import triton_prefill

    _interp.restore_compiled(MODULES)
    g = torch.Generator(device="cuda").manual_seed(0)
    b, hq, hkv, d, lmax, t = 6, 32, 8, 128, 2048, 512
    kf = torch.randn(8, hkv, lmax, d, generator=g, device="cuda").bfloat16()
    vf = torch.randn(8, hkv, lmax, d, generator=g, device="cuda").bfloat16()
    q = torch.randn(b, t, hq, d, generator=g, device="cuda").bfloat16().transpose(1, 2)
    slots = torch.tensor([7, 0, 3, 5, 1, 2], dtype=torch.int32, device="cuda")
    n_new = torch.tensor([512, 300, 1, 512, 77, 0], dtype=torch.int32, device="cuda")
    new_lens = n_new + torch.tensor([0, 1500, 9, 512, 1024, 64], dtype=torch.int32, device="cuda")
    if cache == "int8":
        (k, ks), (v, vs) = quant.quantize_kv(kf, SPEC), quant.quantize_kv(vf, SPEC)
    else:
        (k, ks), (v, vs) = (kf, None), (vf, None)
    out = triton_prefill.prefill_attention(q, k, ks, v, vs, slots, n_new, new_lens, d ** -0.5)
    ref = triton_prefill.prefill_attention_ref(q, k, ks, v, vs, slots, n_new, new_lens, d ** -0.5)
    err = (out.float() - ref.float()).abs().max().item()
    print(f"\n[prefill {cache}] max|out - fp32 ref| = {err:.2e}")
    assert err < 2e-2                                  # bf16 output and operands (fp16 codes for int8)


def test_prefill_default_launch_per_cache_kind():
    """int8 caches default to the dequantized copy; every default launch names a valid code read."""
    from agentq.kernels import triton_prefill as tp
    assert tp.H200_PREFILL["int8"].codes == "copy"
    assert all(cfg.codes in tp.CODE_READS for cfg in tp.H200_PREFILL.values())
