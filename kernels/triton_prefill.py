"""Prefill attention over the slot KV cache, read in place (Triton).

A prefill chunk of T new tokens per row attends to the row's cached prefix and to itself. The
torch path (`attention.masked_attention`) reads the whole prefix back (a gather over slots, a
dequantization of int8 codes), repeats K/V heads for GQA and builds a [B, T, L] mask for SDPA: on
the H200 those copies took as long as SDPA itself (8B, 64 × 2048 tokens in 512-token chunks: ~0.5 s
of a 2.8 s prefill, `docs/bench/h200-r5/e8b-prefill-profile.log`). Here one program takes BLOCK_T
query tokens of one row and the GROUP query heads that share a KV head (rows of the MMA tile are
(token, head) pairs, so GQA costs nothing), walks the row's cache positions [0, last query position]
in BLOCK_N tiles with an online softmax, and applies the causal mask from positions:

    o[b, h, t] = softmax_j≤pos(b,t) (q·k_j · sm_scale) · v_j,   pos(b, t) = start_b + t

Float caches are read as they are. int8 caches (per token-head scales, the KV spec's layout) are,
by default on long chunks, first dequantized per row into a scratch copy (`quant.dequantize_rows`'
values, what the learner's KV round trip gives) that the same kernel then reads as a float cache
(`CODE_READS`, "copy": the in-register paths below spill and round-trip every tile through shared
memory, 1.6-1.7x bf16's time on the H200). Short chunks read the codes in place: the scores are
(q · codesᵀ) · k_scale and the values enter as (p · v_scale) · codes (the decode kernel's
arithmetic), with dots in fp16 (codes are exact there). Dots accumulate in fp32.

The chunk layout is the engine's (`TorchEngine._forward`): row b's valid tokens are its first
n_b positions of T, at cache positions start_b … start_b + n_b − 1, already written to the cache;
start_b = new_len_b − n_b. Outputs of padding tokens (t ≥ n_b) are zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._interp import HAVE_TRITON, dot_dtype, interpreting, require_triton, runs_interpreted
from ._launch import launch_kernel
from .triton_attention import LOG2E

INTERPRETED = interpreting()


#: how an int8 cache reaches the dots: "bytes" (a cast per code, in registers) or "words" (four
#: codes per int32 load, unpacked in registers), each with the scales applied to the scores and
#: to p; or "copy": one launch first writes the rows' K/V dequantized in the model dtype (the
#: values `quant.dequantize_rows` and the learner's KV round trip give), then the float-cache
#: kernel reads them as a bf16 cache. On the H200 the in-register paths spill (255 registers)
#: and round-trip each tile through shared memory with 8-way bank conflicts (ncu,
#: docs/bench/h200-r8/): 1.6-1.7x the bf16 kernel's time, where the copy costs one pass
CODE_READS = ("bytes", "words", "copy")
#: the copy costs a pass over each row's whole cache, so shorter chunks read the codes in place
COPY_MIN_TOKENS = 64
#: the largest fp16 copy (K and V) one call allocates; larger calls read the codes in place
COPY_MAX_BYTES = 2 << 30


@dataclass(frozen=True)
class PrefillConfig:
    block_t: int = 32          # query tokens per program (× the GQA group = MMA rows)
    block_n: int = 32          # cache positions per tile
    num_warps: int = 4
    num_stages: int = 3
    codes: str = "words"       # int8 caches: one of CODE_READS

    def __post_init__(self):
        if self.codes not in CODE_READS:
            raise ValueError(f"PrefillConfig.codes={self.codes!r}; valid: {CODE_READS}")


#: H200 launches per cache kind, the best of `bench_kernels --prefill`'s sweep at Qwen3-8B and
#: Qwen3-1.7B heads (GQA groups 4 and 2 picked the same one; the last 512-token chunk of a 2048-token
#: prompt, B 64; docs/bench/h200-r8/prefill-tune-*.log). int8 caches take the dequantized copy and
#: then the float launch (round 8: in place, codes as bytes / words, 8B heads 4,717 / 4,378 us at
#: their best launch, bf16 2,579)
H200_PREFILL = {"int8": PrefillConfig(64, 64, 8, 3, codes="copy"), "float": PrefillConfig(64, 64, 8, 3)}


def prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor | None,
                          v_cache: torch.Tensor, v_scale: torch.Tensor | None, slots: torch.Tensor,
                          n_new: torch.Tensor, new_lens: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """The fp32 reference: q [B, Hq, T, D] → [B, Hq, T, D] (q's dtype), zeros on padding tokens."""
    b, hq, t, d = q.shape
    hkv = k_cache.shape[1]
    length = int(new_lens.max())
    sl = slots.long()
    k, v = k_cache[sl, :, :length].float(), v_cache[sl, :, :length].float()
    if k_scale is not None and v_scale is not None:
        k = k * k_scale[sl, :, :length, None]
        v = v * v_scale[sl, :, :length, None]
    k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    start = (new_lens - n_new).long()
    pos = start[:, None] + torch.arange(t, device=q.device)[None, :]                         # [B, T]
    keys = torch.arange(length, device=q.device)
    allowed = keys[None, None, :] <= pos[:, :, None]                                          # [B, T, L]
    s = torch.einsum("bhtd,bhld->bhtl", q.float(), k) * sm_scale
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    o = torch.einsum("bhtl,bhld->bhtd", torch.softmax(s, dim=-1), v)
    real = torch.arange(t, device=q.device)[None, :] < n_new.long()[:, None]                 # [B, T]
    return torch.where(real[:, None, :, None], o, torch.zeros_like(o)).to(q.dtype)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .triton_attention import _load_tile
    from .triton_quant import cast_for_store, dequant_tile, store_view

    @triton.jit(do_not_specialize=["T"])     # each delta-prefill length would otherwise compile anew
    def _prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, nnew_ptr, lens_ptr, o_ptr, qk_scale,
                        T, stride_qb, stride_qh, stride_qt, stride_ks, stride_kh, stride_kl,
                        stride_vs, stride_vh, stride_vl, stride_kss, stride_ksh, stride_vss, stride_vsh,
                        stride_ob, stride_oh, stride_ot,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                        HEAD_D: tl.constexpr, SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr,
                        INPUT_PREC: tl.constexpr, BF16_BITS: tl.constexpr, WORDS: tl.constexpr = False,
                        ASM_I8: tl.constexpr = False, KV_BY_ROW: tl.constexpr = False):
        """Program (b, kv head, query block): rows r of the tile are token t0 + r // BLOCK_G,
        query head kvh·GROUP + r % BLOCK_G. KV_BY_ROW: k/v are indexed by batch row, not slot (the
        dequantized copy `_dequant_copy_kernel` wrote, read as a float cache)."""
        b, kvh, tb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        kv_row = b.to(tl.int64) if KV_BY_ROW else slot
        n_new = tl.load(nnew_ptr + b).to(tl.int32)
        start = tl.load(lens_ptr + b).to(tl.int32) - n_new
        t0 = tb * BLOCK_T
        rows = tl.arange(0, BLOCK_T * BLOCK_G)
        tok = t0 + rows // BLOCK_G
        head = kvh * GROUP + rows % BLOCK_G
        real = (rows % BLOCK_G < GROUP) & (tok < n_new)
        offs_d = tl.arange(0, HEAD_D)
        q_rows = q_ptr + b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + tok.to(tl.int64) * stride_qt
        q = tl.load(q_rows[:, None] + offs_d[None, :], mask=real[:, None], other=0.0).to(DOT_DTYPE)
        qpos = start + tok
        # keys up to the block's last real query (none when the block has no real token)
        end = tl.where(t0 < n_new, start + tl.minimum(t0 + BLOCK_T, n_new), 0)
        k_base = k_ptr + kv_row * stride_ks + kvh.to(tl.int64) * stride_kh
        v_base = v_ptr + kv_row * stride_vs + kvh.to(tl.int64) * stride_vh
        ks_base = ks_ptr + slot * stride_kss + kvh.to(tl.int64) * stride_ksh
        vs_base = vs_ptr + slot * stride_vss + kvh.to(tl.int64) * stride_vsh
        offs_n = tl.arange(0, BLOCK_N)
        m_i = tl.full([BLOCK_T * BLOCK_G], float("-inf"), dtype=tl.float32)
        l_i = tl.full([BLOCK_T * BLOCK_G], 0, dtype=tl.float32)
        acc = tl.full([BLOCK_T * BLOCK_G, HEAD_D], 0, dtype=tl.float32)
        for n0 in range(0, end, BLOCK_N):
            n = n0 + offs_n
            mask_n = n < end
            k = _load_cache_tile(k_base, n, mask_n, stride_kl, offs_d, DOT_DTYPE, WORDS, ASM_I8, BLOCK_N, HEAD_D)
            s = tl.dot(q, tl.trans(k), input_precision=INPUT_PREC)
            if SCALED:
                s = s * tl.load(ks_base + n, mask=mask_n, other=0.0)[None, :]
            ok = (n[None, :] <= qpos[:, None]) & mask_n[None, :] & real[:, None]
            s = tl.where(ok, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row with no key yet
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            if SCALED:
                p = p * tl.load(vs_base + n, mask=mask_n, other=0.0)[None, :]
            v = _load_cache_tile(v_base, n, mask_n, stride_vl, offs_d, DOT_DTYPE, WORDS, ASM_I8, BLOCK_N, HEAD_D)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=INPUT_PREC)
            m_i = m_new
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        dst = o_ptr + b.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh + tok.to(tl.int64) * stride_ot
        store = (rows % BLOCK_G < GROUP) & (tok < T)
        tl.store(dst[:, None] + offs_d[None, :], cast_for_store(out, o_ptr.dtype.element_ty, BF16_BITS),
                 mask=store[:, None])

    @triton.jit
    def _load_cache_tile(base, n, mask_n, stride_l, offs_d, DOT_DTYPE: tl.constexpr, WORDS: tl.constexpr,
                         ASM_I8: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr):
        """A [BLOCK_N, HEAD_D] cache tile as DOT_DTYPE values. WORDS (int8 codes, `base` and
        `stride_l` in int32 words): the decode kernel's word unpacking, which with ASM_I8 turns four
        codes into exact fp16 values with a few integer / half2 ops where a plain cast costs two
        slow conversions per code (I2F + F2F on sm_90, more issue slots than the tile's MMAs)."""
        if WORDS:
            x = _load_tile(base, n.to(tl.int64), mask_n, stride_l, offs_d, mask_n, DOT_DTYPE, True, ASM_I8, True,
                           BLOCK_N, HEAD_D)
        else:
            x = tl.load(base + n[:, None].to(tl.int64) * stride_l + offs_d[None, :], mask=mask_n[:, None],
                        other=0).to(DOT_DTYPE)
        return x

    @triton.jit
    def _dequant_copy_kernel(k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, lens_ptr, ok_ptr, ov_ptr,
                             stride_s, stride_h, stride_l, stride_ss, stride_sh, stride_ob, stride_oh, stride_ol,
                             BLOCK_L: tl.constexpr, HEAD_D: tl.constexpr, BF16_BITS: tl.constexpr):
        """Program (b, kv head, position block): the row's K and V below its length dequantized as
        `quant.dequantize_rows` does (fp32 code · scale, one rounding to the output dtype) into
        [B, Hkv, L, D] copies indexed by batch row."""
        b, h, lb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        length = tl.load(lens_ptr + b).to(tl.int32)
        if lb * BLOCK_L < length:
            slot = tl.load(slot_ptr + b).to(tl.int64)
            pos = lb * BLOCK_L + tl.arange(0, BLOCK_L)
            in_row = pos < length
            offs_d = tl.arange(0, HEAD_D)
            src = slot * stride_s + h.to(tl.int64) * stride_h + pos[:, None].to(tl.int64) * stride_l + offs_d[None, :]
            scl = slot * stride_ss + h.to(tl.int64) * stride_sh + pos
            dst = (b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + pos[:, None].to(tl.int64) * stride_ol
                   + offs_d[None, :])
            mask = in_row[:, None]
            dequant_tile(k_ptr + src, ks_ptr + scl, ok_ptr + dst, mask, in_row, BF16_BITS)
            dequant_tile(v_ptr + src, vs_ptr + scl, ov_ptr + dst, mask, in_row, BF16_BITS)


def prefill_applies(q: torch.Tensor, k_cache: torch.Tensor, k_scale) -> bool:
    """Whether `prefill_attention` takes this call: CUDA (or the interpreter), a power-of-two head
    dim ≥ 16, an int8 cache with per-token-head scales or a cache of q's dtype."""
    d = q.shape[-1]
    int8 = k_cache.dtype == torch.int8 and k_scale is not None and torch.is_tensor(k_scale) and k_scale.dim() == 3
    return (HAVE_TRITON and (q.is_cuda or INTERPRETED) and d >= 16 and d & (d - 1) == 0
            and (int8 or (k_scale is None and k_cache.dtype == q.dtype)))


def cache_read(k_cache: torch.Tensor, b: int, t: int, key_len: int, config: PrefillConfig | None = None) -> str:
    """How `prefill_attention` reads the cache for B rows of T query tokens over key_len positions:
    "float", or the int8 `CODE_READS` entry that applies. The reads round differently, so a caller
    that pads a chunk (`prefill_graphs`) checks that the padding keeps this."""
    cfg = config or H200_PREFILL["int8" if k_cache.dtype == torch.int8 else "float"]
    return _code_read(cfg, k_cache, b, t, key_len)


def _code_read(cfg: PrefillConfig, k_cache: torch.Tensor, b: int, t: int, key_len: int) -> str:
    """How this call reads the cache: "float", or the int8 `CODE_READS` entry that applies."""
    if k_cache.dtype != torch.int8:
        return "float"
    copy_bytes = 2 * b * k_cache.shape[1] * key_len * k_cache.shape[-1] * 2
    if cfg.codes == "copy" and (t < COPY_MIN_TOKENS or copy_bytes > COPY_MAX_BYTES):
        return "words"
    return cfg.codes


def _dequant_copy(k_cache, k_scale, v_cache, v_scale, slots, new_lens, key_len: int, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's K and V below its length dequantized (`quant.dequantize_rows`'s values, the ones
    the learner's KV round trip gives) as [B, Hkv, key_len, D] of `dtype`; positions past a row's
    length are left unwritten (the attention never reads them)."""
    b, hkv, d = slots.shape[0], k_cache.shape[1], k_cache.shape[-1]
    kx = torch.empty((b, hkv, key_len, d), dtype=dtype, device=k_cache.device)
    vx = torch.empty_like(kx)
    interp = runs_interpreted(_dequant_copy_kernel)
    (kx_arg, bits), vx_arg = store_view(kx, interp), store_view(vx, interp)[0]
    block_l = 64
    launch_kernel(_dequant_copy_kernel, (b, hkv, triton.cdiv(key_len, block_l)),
        k_cache, v_cache, k_scale, v_scale, slots, new_lens, kx_arg, vx_arg,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_scale.stride(0), k_scale.stride(1),
        kx.stride(0), kx.stride(1), kx.stride(2), BLOCK_L=block_l, HEAD_D=d, BF16_BITS=bits, num_warps=4)
    return kx, vx


def _cache_args(k_cache: torch.Tensor, k_scale, v_cache: torch.Tensor, v_scale, slots, new_lens, read: str,
                key_len: int, dtype: torch.dtype):
    """The kernel's cache operands: (k, v, k scales, v scales, their (slot, head) strides, words,
    k/v indexed by row). int8 codes go as int32 words for "words" (d is a power of two ≥ 16, so a
    multiple of 4), as a dequantized copy of `dtype` indexed by row for "copy" (then read as a float
    cache); float caches pass themselves as the unused scales."""
    if read == "float":
        return k_cache, v_cache, k_cache, v_cache, (0, 0), (0, 0), False, False
    assert k_scale is not None and v_scale is not None
    strides = (k_scale.stride(0), k_scale.stride(1)), (v_scale.stride(0), v_scale.stride(1))
    if read == "copy":
        kx, vx = _dequant_copy(k_cache, k_scale, v_cache, v_scale, slots, new_lens, key_len, dtype)
        return kx, vx, kx, vx, (0, 0), (0, 0), False, True
    if read == "words":
        return k_cache.view(torch.int32), v_cache.view(torch.int32), k_scale, v_scale, *strides, True, False
    return k_cache, v_cache, k_scale, v_scale, *strides, False, False


def _check_args(q: torch.Tensor, k_cache: torch.Tensor, k_scale, v_cache: torch.Tensor) -> None:
    require_triton("triton_prefill.prefill_attention")
    if not prefill_applies(q, k_cache, k_scale):
        raise ValueError(f"prefill_attention does not take q {q.dtype} {tuple(q.shape)} with a {k_cache.dtype} cache")
    hq, d, hkv = q.shape[1], q.shape[-1], k_cache.shape[1]
    if hq % hkv or k_cache.shape != v_cache.shape or k_cache.shape[-1] != d:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor | None,
                      v_cache: torch.Tensor, v_scale: torch.Tensor | None, slots: torch.Tensor,
                      n_new: torch.Tensor, new_lens: torch.Tensor, sm_scale: float,
                      config: PrefillConfig | None = None, key_len: int | None = None) -> torch.Tensor:
    """Attention of a prefill chunk over each row's cache (module docstring).

    Args:
        q: [B, Hq, T, D] (any strides, D contiguous), after RoPE.
        k_cache, v_cache: [S, Hkv, Lmax, D] int8 codes (with k_scale / v_scale [S, Hkv, Lmax] fp32)
            or values of q's dtype (scales None); the chunk's K/V already written.
        slots: [B] int slot of each row; n_new: [B] valid tokens of the chunk per row (its first n);
        new_lens: [B] slot length after the chunk.
        sm_scale: the softmax scale.
        config: the launch (None: `H200_PREFILL` for the cache kind).
        key_len: max(new_lens) when the caller knows it (the "copy" read needs it; else a sync).
    Returns:
        [B, Hq, T, D] in q's dtype (a transposed view of a contiguous [B, T, Hq, D]); zeros for
        padding tokens.
    """
    _check_args(q, k_cache, k_scale, v_cache)
    b, hq, t, d = q.shape
    hkv = k_cache.shape[1]
    # written token-major: the o-projection reads [B, T, Hq·D] rows without a copy
    out = torch.empty((b, t, hq, d), dtype=q.dtype, device=q.device).transpose(1, 2)
    if b == 0 or t == 0:
        return out
    group = hq // hkv
    cfg = config or H200_PREFILL["int8" if k_cache.dtype == torch.int8 else "float"]
    block_g = triton.next_power_of_2(group)
    block_t = max(cfg.block_t, 16 // block_g)           # ≥ 16 MMA rows
    if cfg.codes == "copy" and key_len is None:
        key_len = int(new_lens.max())
    read = _code_read(cfg, k_cache, b, t, key_len or 0)
    scaled = read not in ("float", "copy")                # codes in the dots, scales on the scores and p
    ddt = dot_dtype(_prefill_kernel, q.dtype)
    ddt = tl.float16 if scaled and ddt != tl.float32 else ddt   # codes are exact in fp16; p · v_scale keeps 3 bits
    kc, vc, ks, vs, kss, vss, words, by_row = _cache_args(k_cache, k_scale, v_cache, v_scale, slots, new_lens, read,
                                                          key_len or 0, q.dtype)
    interp = runs_interpreted(_prefill_kernel)
    out_arg, bits = store_view(out, interp)
    launch_kernel(_prefill_kernel, (b, hkv, triton.cdiv(t, block_t)),
        q, kc, vc, ks, vs, slots, n_new, new_lens, out_arg, float(sm_scale) * LOG2E,
        t, q.stride(0), q.stride(1), q.stride(2), kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2), *kss, *vss,
        out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, BLOCK_G=block_g, BLOCK_T=block_t, BLOCK_N=cfg.block_n, HEAD_D=d, SCALED=scaled,
        DOT_DTYPE=ddt, INPUT_PREC="ieee" if ddt == tl.float32 else "tf32", BF16_BITS=bits,
        WORDS=words, ASM_I8=words and not interp and ddt == tl.float16, KV_BY_ROW=by_row,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


__all__ = ["CODE_READS", "H200_PREFILL", "PrefillConfig", "cache_read", "prefill_applies", "prefill_attention", "prefill_attention_ref"]
