"""Decode attention over the engine's slot-based KV cache: Triton split-K flash-decoding + torch reference.

Cache layout (one layer): ``k_cache, v_cache [S, Hkv, Lmax, D]`` (D contiguous), one slot per
episode; the batch row ``b`` reads slot ``slot_ids[b]`` positions ``0 .. lens[b]-1``. Caches are

* int8 codes with per-token-per-head fp32 scales ``k_scale, v_scale [S, Hkv, Lmax]`` (KV8; read
  back as ``code * scale``),
* fp8 E4M3 codes with a per-tensor fp32 scale (a 0-dim / 1-element tensor or a float), or
* bf16 / fp16 / fp32 values with scales ``None`` (the unquantized baseline).

GQA: q head ``h`` reads KV head ``h // (Hq // Hkv)`` (HF `repeat_kv` order).

`decode_attention` (Triton): one program per (batch row, KV head, split) runs the whole q-head group
(padded to 16 rows for `tl.dot`) over a contiguous chunk of its row's positions with an online
softmax in the log2 domain. Int8 codes are loaded as int32 words (4 codes) and unpacked in registers
to exact fp16 values (on CUDA with a 5-instruction PTX magic-number sequence per word; the queries
are then read as fp16), so the V tile is not gathered byte by byte from shared memory; the per-token
K scale multiplies the score column and the V scale is folded into the probabilities (fp16 there).
With one split the program writes the output directly; otherwise each split writes its normalized
partial output and log-sum-exp and a Triton kernel combines them. The split count depends only on
B, Hkv and Lmax (not on `lens`, which stay on the device), so calls are CUDA-graph safe.

`decode_attention_ref` (torch): dequantize the gathered slots in fp32, masked softmax, fp32
throughout; the CPU engine's path and the tests' reference. Rows with ``lens[b] == 0`` give zeros.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch

from ._interp import (HAVE_TRITON, dot_dtype, interpreting, num_sms, require_triton, runs_interpreted,
                      tma_available)
from . import cuda_attention
from ._launch import launch_kernel
from .triton_quant import use_pdl

INTERPRETED = interpreting()
LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------- torch reference
def _scale_mode(scale) -> int:
    """0: no scale (float cache); 1: per token per head [S, Hkv, Lmax]; 2: per tensor (scalar)."""
    if scale is None:
        return 0
    if isinstance(scale, (int, float)) or scale.numel() == 1:
        return 2
    return 1


def _dequant_gather(cache: torch.Tensor, scale, slots: torch.Tensor, length: int) -> torch.Tensor:
    x = cache[slots, :, :length].float()
    mode = _scale_mode(scale)
    if mode == 1:
        x = x * scale[slots, :, :length].float().unsqueeze(-1)
    elif mode == 2:
        x = x * (scale if isinstance(scale, (int, float)) else scale.reshape(()).float())
    return x


def decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, k_scale, v_cache: torch.Tensor, v_scale,
                         slot_ids: torch.Tensor, lens: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """Reference decode attention (fp32 math): q [B, Hq, D] -> [B, Hq, D] in q's dtype."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    g = hq // hkv
    if b == 0:
        return q.new_empty((0, hq, d))
    length = int(lens.max())
    slots = slot_ids.long()
    k = _dequant_gather(k_cache, k_scale, slots, length)          # [B, Hkv, L, D]
    v = _dequant_gather(v_cache, v_scale, slots, length)
    qf = q.float().reshape(b, hkv, g, d)
    s = torch.einsum("bhgd,bhld->bhgl", qf, k) * sm_scale
    valid = torch.arange(length, device=q.device)[None, :] < lens.to(q.device).long()[:, None]   # [B, L]
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(valid.any(-1)[:, None, None, None], p, torch.zeros_like(p))   # lens == 0 -> zeros
    o = torch.einsum("bhgl,bhld->bhgd", p, v)
    return o.reshape(b, hq, d).to(q.dtype)


# ---------------------------------------------------------------------- Triton kernels
@dataclass(frozen=True)
class AttnConfig:
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int | None = None      # None: `pick_num_splits`
    k_as_a: bool = False               # K tile as the MMA A operand (scores computed transposed)
    words: bool = True                 # int8 caches: load int32 words of 4 codes, unpack in registers
    asm: bool = True                   # ...with the fp16 magic-number PTX (CUDA, bf16/fp16 queries)
    planes: bool = False               # int8 words: 4 byte planes as 4 dots, no interleaving reshape
    tma: bool = False                  # planes: K/V word tiles loaded by TMA (host descriptors; sm_90+)
    pairs: bool = False                # planes + asm: unpack two words per asm call into ready fp16 pairs
    cuda: bool = False                 # int8: `cuda_attention`'s kernel where it applies (sm_90+)
    cuda_warps: int | None = None      # ...its warps a block (None: `cuda_launch_for`)
    cuda_stages: int | None = None     # ...its bulk-copy stages (None: `cuda_launch_for`)

    def short(self) -> str:
        return (f"n{self.block_n}/w{self.num_warps}/st{self.num_stages}/sp{self.num_splits}"
                f"{'/kA' if self.k_as_a else ''}{'/words' if self.words else ''}{'/asm' if self.asm else ''}"
                f"{'/planes' if self.planes else ''}{'/tma' if self.tma else ''}{'/pairs' if self.pairs else ''}"
                f"{f'/cuda{self.cuda_warps or 0}s{self.cuda_stages or 0}' if self.cuda else ''}")


#: H200 defaults by cache kind ("int8", "fp8", "float"), from `python -m agentq.eval.bench_kernels --tune`
H200_ATTN: dict[str, AttnConfig] = {
    # byte-plane kernel: 101.2 / 186.9 µs at B 64 / 128 x L 2560 against 123.5 µs at B 64 for the
    # sweep-3 word kernel (n128/w4/st3); round-5 sweep, docs/bench/h200-r5/tune-attn.log
    # round 10: its word tiles through TMA, 4 stages: 93.1 / 167.8 µs at B 64 / 128 x L 2304 against
    # 91.8-92.4 / 170.4 µs with pointer loads at 3 stages (the sweep's best: 90.7 µs n64/w2/st3/tma at
    # B 64, 163.9 µs n64/w1/st4/tma at B 128; docs/bench/h200-r10/tune-attn-tma.log)
    # round 44: `cuda_attention`'s bulk-copy MMA kernel took 91.2 / 160.2 µs at B 64 / 128 and 35.9 µs
    # at B 16 against 91.8 / 165.9 / 42.7 for the planes kernel on the H200 (docs/bench/h200-r44/bulk);
    # round 45 made it the default on sm_90 (`CUDA_KERNEL_ARCHS`), the planes kernel elsewhere
    "int8": AttnConfig(block_n=64, num_warps=2, num_stages=4, planes=True, tma=True, cuda=True),
    "float": AttnConfig(block_n=64, num_warps=4, num_stages=2),   # 249 µs, = SDPA
}
#: TMA word tiles where a config asks for them (off: pointer loads; `bench_engine --decode-sweep attn_tma=0,1`)
TMA_TILES = True
#: the most stages the planes kernel's pointer loads take: they measured best at 3, where its TMA
#: tiles take 4 (shared-memory tiles loaded by the threads cost registers that TMA's do not)
POINTER_STAGES = 3
#: the default config (`pick_config`) takes `cuda_attention`'s kernel where `H200_ATTN` asks for it
#: and the GPU is one it was measured and tested on; off: the Triton kernel by default everywhere
#: (`bench_engine --decode-sweep attn_cuda=0,1`). An explicit `AttnConfig(cuda=True)` and
#: AGENTQ_DECODE_ATTN=cuda / triton are honoured on any GPU the kernel applies to.
CUDA_KERNEL = True
#: compute capabilities where the default takes it: Hopper (H100, H200). Blackwell compiles
#: (CPU-tested) but was never run, so its default stays the Triton kernel.
CUDA_KERNEL_ARCHS = frozenset({(9, 0)})


def pick_num_splits(batch: int, num_kv_heads: int, max_len: int, block_n: int, num_sms: int = 132) -> int:
    """Splits so that about two programs run per SM, each over at least 4 blocks of positions."""
    programs = max(1, batch * num_kv_heads)
    want = -(-2 * num_sms // programs)
    cap = max(1, max_len // (4 * block_n))
    splits = 1
    while splits < want and splits * 2 <= min(cap, 64):
        splits *= 2
    return splits


if HAVE_TRITON:
    import triton
    import triton.language as tl

    from . import _unpack_ptx
    from .triton_quant import cast_for_store, pdl_start, store_view

    # the unpacking PTX (one text with cuda_attention's), over inline_asm_elementwise's operands
    _WORD_ASM = tl.constexpr(_unpack_ptx.asm_block(_unpack_ptx.word_to_halves("$4", "lo", "hi")
                                                   + ["mov.b32 {$0, $1}, lo;", "mov.b32 {$2, $3}, hi;"]))
    _PAIR_ASM = tl.constexpr(_unpack_ptx.asm_block(_unpack_ptx.words_to_planes("$4", "$5",
                                                                                ("$0", "$1", "$2", "$3"))))

    @triton.jit
    def _word_to_f16x4(w):
        """CUDA: the four int8 codes packed in an int32 word -> four exact fp16 values (byte order):
        1 LOP3 + 2 PRMT + 2 HSUB2 per word (`_unpack_ptx.word_to_halves`)."""
        return tl.inline_asm_elementwise(asm=_WORD_ASM, constraints="=h,=h,=h,=h,r", args=[w],
                                         dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=1)

    @triton.jit
    def _word_pairs_to_f16x4(w):
        """CUDA, two words per call (pack=2): the four byte planes of words w0, w1, each plane as one
        register holding the fp16 pair (byte j of w0, byte j of w1), which is how the MMA operands
        hold them; `_word_to_f16x4`'s arithmetic (the same values), without the two PRMTs per word
        that pair its single halves afterwards: 2 LOP3 + 6 PRMT + 4 HSUB2 per pair of words
        (`_unpack_ptx.words_to_planes`)."""
        return tl.inline_asm_elementwise(asm=_PAIR_ASM, constraints="=r,=r,=r,=r,r,r", args=[w],
                                         dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=2)

    @triton.jit
    def _load_tile(base, n, mask_n, stride_l, offs_d, mask_d, DTYPE: tl.constexpr, WORDS: tl.constexpr,
                   ASM_I8: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """A [BLOCK_N, BLOCK_D] cache tile as DTYPE values (codes for a quantized cache).

        WORDS (int8 caches): `base` points at int32 words of 4 codes; each thread loads whole words
        and unpacks them in registers, so codes are converted before, not after, the shuffle into
        MMA operand layout (an 8-bit V tile would otherwise be read from shared memory byte by byte)."""
        if WORDS:
            e0, e1, e2, e3 = _load_planes(base, n, mask_n, stride_l, DTYPE, ASM_I8, BLOCK_D)
            x = tl.reshape(tl.join(tl.join(e0, e2), tl.join(e1, e3)), [BLOCK_N, BLOCK_D])
        else:
            if EVEN_D:
                msk = mask_n[:, None]
            else:
                msk = mask_n[:, None] & mask_d[None, :]
            x = tl.load(base + n[:, None] * stride_l + offs_d[None, :], mask=msk, other=0.0).to(DTYPE)
        return x

    @triton.jit
    def _load_planes(base, n, mask_n, stride_l, DTYPE: tl.constexpr, ASM_I8: tl.constexpr, BLOCK_D: tl.constexpr):
        """The int8 codes of rows n as int32 words, unpacked into four [BLOCK_N, BLOCK_D/4] byte
        planes: plane j holds the codes of columns 4·w + j."""
        offs_w = tl.arange(0, BLOCK_D // 4)
        w = tl.load(base + n[:, None] * stride_l + offs_w[None, :], mask=mask_n[:, None], other=0)
        return _unpack_planes(w, DTYPE, ASM_I8)

    @triton.jit
    def _plane_tile(desc, base, row, n, mask_n, stride_l, DTYPE: tl.constexpr, ASM_I8: tl.constexpr,
                    HEAD_D: tl.constexpr, TMA: tl.constexpr):
        """The byte planes of one K or V tile: its words through the TMA descriptor from descriptor
        row `row`, or loaded by pointer from `base` (positions n)."""
        if TMA:
            planes = _unpack_planes(desc.load([row.to(tl.int32), 0]), DTYPE, ASM_I8)
        else:
            planes = _load_planes(base, n, mask_n, stride_l, DTYPE, ASM_I8, HEAD_D)
        return planes

    @triton.jit
    def _unpack_planes(w, DTYPE: tl.constexpr, ASM_I8: tl.constexpr):
        """int32 words of 4 codes -> the four byte planes as DTYPE values (`_load_planes`). ASM_I8:
        0 shifts and converts, 1 `_word_to_f16x4`, 2 `_word_pairs_to_f16x4` (CUDA; same values)."""
        if ASM_I8 == 2:
            e0, e1, e2, e3 = _word_pairs_to_f16x4(w)
        elif ASM_I8:
            e0, e1, e2, e3 = _word_to_f16x4(w)
        else:
            e0 = ((w << 24) >> 24).to(DTYPE)
            e1 = ((w << 16) >> 24).to(DTYPE)
            e2 = ((w << 8) >> 24).to(DTYPE)
            e3 = (w >> 24).to(DTYPE)
        return e0, e1, e2, e3

    @triton.jit
    def _split_range(slot_ptr, lens_ptr, b, sp, num_splits, BLOCK_N: tl.constexpr):
        """(slot, first, end) of the positions split `sp` of batch row b reads: equal chunks of
        whole BLOCK_N tiles (an empty range for the splits past the row's length)."""
        slot = tl.load(slot_ptr + b).to(tl.int64)
        length = tl.load(lens_ptr + b).to(tl.int32)
        chunk = ((length + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        start = sp * chunk
        return slot, start, tl.minimum(start + chunk, length)

    @triton.jit(do_not_specialize=["num_splits"])
    def _decode_planes_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, lens_ptr, o_ptr, po_ptr, plse_ptr,
                              k_desc, v_desc, qk_scale, num_splits,
                              stride_qb, stride_qh,
                              stride_ks, stride_kh, stride_kl,
                              stride_vs, stride_vh, stride_vl,
                              stride_kss, stride_ksh, stride_vss, stride_vsh,
                              stride_ob, stride_oh,
                              GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_D: tl.constexpr,
                              BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, DOT_DTYPE: tl.constexpr,
                              INPUT_PREC: tl.constexpr, ASM_I8: tl.constexpr, BF16_BITS: tl.constexpr,
                              PDL: tl.constexpr, TMA: tl.constexpr = False):
        """`_decode_kernel` for int8 caches with per-token scales, computed on byte planes: with
        K = Σ_j K_j over the planes of columns 4w + j, q·Kᵀ = Σ_j q_j·K_jᵀ and P·V's column block j
        is P·V_j, so each unpacked plane feeds the MMA as it is, never interleaved back into a
        [BLOCK_N, HEAD_D] tile (the reshape whose shared-memory round trip bank-conflicts).

        TMA: the word tiles come through k_desc / v_desc, descriptors over the caches viewed as
        [S·Hkv·Lmax, HEAD_D/4] int32 rows (slot, head, position), so the copy engine streams them
        into shared memory. Rows past the row's length read other positions' codes (finite; their
        scores are masked to -inf, so their probabilities are 0) or, past the tensor, zeros."""
        pdl_start(PDL)
        b, kvh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        hq = tl.num_programs(1) * GROUP
        slot, start, end = _split_range(slot_ptr, lens_ptr, b, sp, num_splits, BLOCK_N)
        offs_g = tl.arange(0, BLOCK_G)
        offs_w = tl.arange(0, HEAD_D // 4)
        offs_n = tl.arange(0, BLOCK_N)
        mask_g = offs_g < GROUP
        heads = kvh * GROUP + offs_g
        q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + 4 * offs_w[None, :]
        q0 = tl.load(q_rows, mask=mask_g[:, None], other=0.0).to(DOT_DTYPE)
        q1 = tl.load(q_rows + 1, mask=mask_g[:, None], other=0.0).to(DOT_DTYPE)
        q2 = tl.load(q_rows + 2, mask=mask_g[:, None], other=0.0).to(DOT_DTYPE)
        q3 = tl.load(q_rows + 3, mask=mask_g[:, None], other=0.0).to(DOT_DTYPE)
        k_base = k_ptr + slot * stride_ks + kvh * stride_kh
        v_base = v_ptr + slot * stride_vs + kvh * stride_vh
        ks_base = ks_ptr + slot * stride_kss + kvh * stride_ksh
        vs_base = vs_ptr + slot * stride_vss + kvh * stride_vsh
        m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l_i = tl.full([BLOCK_G], 0, dtype=tl.float32)
        a0 = tl.full([BLOCK_G, HEAD_D // 4], 0, dtype=tl.float32)
        a1 = tl.full([BLOCK_G, HEAD_D // 4], 0, dtype=tl.float32)
        a2 = tl.full([BLOCK_G, HEAD_D // 4], 0, dtype=tl.float32)
        a3 = tl.full([BLOCK_G, HEAD_D // 4], 0, dtype=tl.float32)
        desc_row = (slot * stride_ks + kvh * stride_kh) // stride_kl      # descriptor row of (slot, head, 0)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + offs_n
            mask_n = n < end
            k0, k1, k2, k3 = _plane_tile(k_desc, k_base, desc_row + n0, n, mask_n, stride_kl, DOT_DTYPE, ASM_I8,
                                         HEAD_D, TMA)
            s = tl.dot(q0, tl.trans(k0), input_precision=INPUT_PREC)
            s = tl.dot(q1, tl.trans(k1), s, input_precision=INPUT_PREC)
            s = tl.dot(q2, tl.trans(k2), s, input_precision=INPUT_PREC)
            s = tl.dot(q3, tl.trans(k3), s, input_precision=INPUT_PREC)
            s = s * tl.load(ks_base + n, mask=mask_n, other=0.0)[None, :]
            s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
            pv = (p * tl.load(vs_base + n, mask=mask_n, other=0.0)[None, :]).to(DOT_DTYPE)
            v0, v1, v2, v3 = _plane_tile(v_desc, v_base, desc_row + n0, n, mask_n, stride_vl, DOT_DTYPE, ASM_I8,
                                         HEAD_D, TMA)
            a0 = a0 * alpha[:, None] + tl.dot(pv, v0, input_precision=INPUT_PREC)
            a1 = a1 * alpha[:, None] + tl.dot(pv, v1, input_precision=INPUT_PREC)
            a2 = a2 * alpha[:, None] + tl.dot(pv, v2, input_precision=INPUT_PREC)
            a3 = a3 * alpha[:, None] + tl.dot(pv, v3, input_precision=INPUT_PREC)
            m_i = m_new
        safe_l = tl.where(l_i > 0.0, l_i, 1.0)
        mask_o = mask_g[:, None]
        if SPLIT:
            row = (b * hq + heads).to(tl.int64) * num_splits + sp
            dst = po_ptr + row[:, None] * HEAD_D + 4 * offs_w[None, :]
            tl.store(dst, a0 / safe_l[:, None], mask=mask_o)
            tl.store(dst + 1, a1 / safe_l[:, None], mask=mask_o)
            tl.store(dst + 2, a2 / safe_l[:, None], mask=mask_o)
            tl.store(dst + 3, a3 / safe_l[:, None], mask=mask_o)
            lse = tl.where(l_i > 0.0, m_i + tl.math.log2(safe_l), float("-inf"))
            tl.store(plse_ptr + row, lse, mask=mask_g)
        else:
            dst = o_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + 4 * offs_w[None, :]
            ty = o_ptr.dtype.element_ty
            tl.store(dst, cast_for_store(a0 / safe_l[:, None], ty, BF16_BITS), mask=mask_o)
            tl.store(dst + 1, cast_for_store(a1 / safe_l[:, None], ty, BF16_BITS), mask=mask_o)
            tl.store(dst + 2, cast_for_store(a2 / safe_l[:, None], ty, BF16_BITS), mask=mask_o)
            tl.store(dst + 3, cast_for_store(a3 / safe_l[:, None], ty, BF16_BITS), mask=mask_o)

    @triton.jit(do_not_specialize=["num_splits"])
    def _decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, lens_ptr, o_ptr, po_ptr, plse_ptr,
                       qk_scale, num_splits,
                       stride_qb, stride_qh,
                       stride_ks, stride_kh, stride_kl,
                       stride_vs, stride_vh, stride_vl,
                       stride_kss, stride_ksh, stride_vss, stride_vsh,
                       stride_ob, stride_oh,
                       GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_N: tl.constexpr, SCALE_MODE: tl.constexpr, SPLIT: tl.constexpr,
                       DOT_DTYPE: tl.constexpr, PV_DTYPE: tl.constexpr, INPUT_PREC: tl.constexpr,
                       EVEN_D: tl.constexpr, K_AS_A: tl.constexpr, WORDS: tl.constexpr, ASM_I8: tl.constexpr,
                       BF16_BITS: tl.constexpr, PDL: tl.constexpr):
        pdl_start(PDL)
        b, kvh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        hq = tl.num_programs(1) * GROUP
        slot, start, end = _split_range(slot_ptr, lens_ptr, b, sp, num_splits, BLOCK_N)

        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        mask_g = offs_g < GROUP
        mask_d = offs_d < HEAD_D
        heads = kvh * GROUP + offs_g
        q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_g[:, None] & mask_d[None, :], other=0.0).to(DOT_DTYPE)

        k_base = k_ptr + slot * stride_ks + kvh * stride_kh
        v_base = v_ptr + slot * stride_vs + kvh * stride_vh
        ks_base = ks_ptr + slot * stride_kss + kvh * stride_ksh
        vs_base = vs_ptr + slot * stride_vss + kvh * stride_vsh
        score_scale = qk_scale
        if SCALE_MODE == 2:
            score_scale = qk_scale * tl.load(ks_ptr)

        m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l_i = tl.full([BLOCK_G], 0, dtype=tl.float32)
        acc = tl.full([BLOCK_G, BLOCK_D], 0, dtype=tl.float32)
        q_t = tl.trans(q)                                       # [BLOCK_D, BLOCK_G]
        for n0 in range(start, end, BLOCK_N):
            n = n0 + offs_n
            mask_n = n < end
            kt = _load_tile(k_base, n, mask_n, stride_kl, offs_d, mask_d, DOT_DTYPE, WORDS, ASM_I8, EVEN_D,
                            BLOCK_N, BLOCK_D)
            if K_AS_A:
                # scores transposed, s_t[n, g]: K tile is the MMA's A operand (its natural layout)
                s_t = tl.dot(kt, q_t, input_precision=INPUT_PREC)
                if SCALE_MODE == 1:
                    s_t = s_t * tl.load(ks_base + n, mask=mask_n, other=0.0)[:, None]
                s_t = tl.where(mask_n[:, None], s_t * score_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.reduce(s_t, 0, tl.standard._elementwise_max))
                alpha = tl.math.exp2(m_i - m_new)
                p_t = tl.math.exp2(s_t - m_new[None, :])
                l_i = l_i * alpha + tl.reduce(p_t, 0, tl.standard._sum_combine)
                if SCALE_MODE == 1:
                    p_t = p_t * tl.load(vs_base + n, mask=mask_n, other=0.0)[:, None]
                p = tl.trans(p_t)
            else:
                s = tl.dot(q, tl.trans(kt), input_precision=INPUT_PREC)
                if SCALE_MODE == 1:
                    s = s * tl.load(ks_base + n, mask=mask_n, other=0.0)[None, :]
                s = tl.where(mask_n[None, :], s * score_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
                alpha = tl.math.exp2(m_i - m_new)
                p = tl.math.exp2(s - m_new[:, None])
                l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
                if SCALE_MODE == 1:
                    p = p * tl.load(vs_base + n, mask=mask_n, other=0.0)[None, :]
            vt = _load_tile(v_base, n, mask_n, stride_vl, offs_d, mask_d, PV_DTYPE, WORDS, ASM_I8, EVEN_D,
                            BLOCK_N, BLOCK_D)
            acc = acc * alpha[:, None] + tl.dot(p.to(PV_DTYPE), vt, input_precision=INPUT_PREC)
            m_i = m_new

        safe_l = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / safe_l[:, None]
        if SCALE_MODE == 2:
            out = out * tl.load(vs_ptr)
        if SPLIT:
            row = (b * hq + heads).to(tl.int64) * num_splits + sp
            tl.store(po_ptr + row[:, None] * HEAD_D + offs_d[None, :], out, mask=mask_g[:, None] & mask_d[None, :])
            lse = tl.where(l_i > 0.0, m_i + tl.math.log2(safe_l), float("-inf"))
            tl.store(plse_ptr + row, lse, mask=mask_g)
        else:
            tl.store(o_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                     cast_for_store(out, o_ptr.dtype.element_ty, BF16_BITS), mask=mask_g[:, None] & mask_d[None, :])

    @triton.jit(do_not_specialize=["num_splits"])
    def _combine_kernel(po_ptr, plse_ptr, o_ptr, num_splits, num_heads, stride_ob, stride_oh,
                        HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                        BF16_BITS: tl.constexpr, PDL: tl.constexpr):
        """out[b, h] = sum_s w_s * o_s / sum_s w_s with w_s = 2^(lse_s - max lse) (empty splits: 0)."""
        pdl_start(PDL)
        pid = tl.program_id(0)
        b = pid // num_heads
        h = pid % num_heads
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        mask_s = offs_s < num_splits
        mask_d = offs_d < HEAD_D
        row = pid.to(tl.int64) * num_splits + offs_s
        lse = tl.load(plse_ptr + row, mask=mask_s, other=float("-inf"))
        m = tl.reduce(lse, 0, tl.standard._elementwise_max)
        m = tl.where(m == float("-inf"), 0.0, m)
        w = tl.math.exp2(lse - m)
        den = tl.reduce(w, 0, tl.standard._sum_combine)
        po = tl.load(po_ptr + row[:, None] * HEAD_D + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :],
                     other=0.0)
        out = tl.reduce(w[:, None] * po, 0, tl.standard._sum_combine) / tl.where(den > 0.0, den, 1.0)
        tl.store(o_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d,
                 cast_for_store(out, o_ptr.dtype.element_ty, BF16_BITS), mask=mask_d)


def pick_config(batch: int, num_kv_heads: int, max_len: int, kv_dtype: torch.dtype,
                device: torch.device | None = None) -> AttnConfig:
    """The default config for this cache kind (`H200_ATTN`) and batch on `device`: its `cuda` kept
    only where `cuda_default_on(device)`, its splits picked for the device's SMs unless the table
    fixes them."""
    kind = "int8" if kv_dtype == torch.int8 else ("fp8" if kv_dtype.itemsize == 1 else "float")
    base = H200_ATTN.get(kind, AttnConfig())
    if base.cuda and not cuda_default_on(device):
        base = dataclasses.replace(base, cuda=False)
    if base.num_splits is not None:
        return base
    sms = num_sms(device)
    return dataclasses.replace(base, num_splits=pick_num_splits(batch, num_kv_heads, max_len, base.block_n, sms))


def _scale_arg(scale, device) -> torch.Tensor:
    if isinstance(scale, (int, float)):
        return torch.tensor([float(scale)], dtype=torch.float32, device=device)
    return scale.reshape(-1).float() if scale.numel() == 1 else scale


def _check_decode_args(q: torch.Tensor, k_cache: torch.Tensor, k_scale, v_cache: torch.Tensor, v_scale) -> int:
    """Refuse mismatched shapes, dtypes and scale kinds; returns the scale mode (`_scale_mode`)."""
    b, hq, d = q.shape
    s_, hkv, lmax, d2 = k_cache.shape
    if d2 != d or v_cache.shape != k_cache.shape or hq % hkv:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    mode = _scale_mode(k_scale)
    if mode != _scale_mode(v_scale):
        raise ValueError("k_scale and v_scale must be of the same kind")
    if (mode != 0) != (k_cache.dtype.itemsize == 1) or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"cache dtype {k_cache.dtype} does not fit scales of kind {mode}")
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "KV caches must be contiguous in head_dim"
    return mode


def _scale_pointers(mode: int, k_scale, v_scale, q: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int], tuple[int, int]]:
    """The K/V scale tensors the kernel reads and their (slot, head) strides (q and 0 when unused)."""
    if mode == 0:
        return q, q, (0, 0), (0, 0)            # unused pointers
    ks, vs = _scale_arg(k_scale, q.device), _scale_arg(v_scale, q.device)
    if mode == 2:
        return ks, vs, (0, 0), (0, 0)
    assert ks.stride(-1) == 1 and vs.stride(-1) == 1, "scales must be contiguous in Lmax"
    return ks, vs, (ks.stride(0), ks.stride(1)), (vs.stride(0), vs.stride(1))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, k_scale, v_cache: torch.Tensor, v_scale,
                     slot_ids: torch.Tensor, lens: torch.Tensor, sm_scale: float,
                     config: AttnConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Split-K flash-decoding (Triton) over the slot cache; same signature and result as
    `decode_attention_ref` (within fp32 rounding; bf16/fp16 q dots in that dtype on CUDA)."""
    require_triton("triton_attention.decode_attention")
    mode = _check_decode_args(q, k_cache, k_scale, v_cache, v_scale)
    b, hq, d = q.shape
    hkv, lmax = k_cache.shape[1], k_cache.shape[2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    cfg = config or pick_config(b, hkv, lmax, k_cache.dtype, q.device)
    splits = cfg.num_splits or pick_num_splits(b, hkv, lmax, cfg.block_n, num_sms(q.device))
    cfg = effective_config(cfg, q, k_cache, k_scale, v_cache, v_scale, out)
    if cfg.cuda and _launch_cuda(q, k_cache, k_scale, v_cache, v_scale, slot_ids, lens, sm_scale, out, cfg, splits):
        return out
    ks, vs, ks_strides, vs_strides = _scale_pointers(mode, k_scale, v_scale, q)
    group = hq // hkv
    ddt = dot_dtype(_decode_kernel, q.dtype)
    prec = "ieee" if ddt == tl.float32 else "tf32"
    words = cfg.words and k_cache.dtype == torch.int8 and d % 4 == 0 and triton.next_power_of_2(d) == d and d >= 16
    use_asm = words and cfg.asm and ddt != tl.float32
    if use_asm:        # codes become exact fp16 values; q is read as fp16 and p * v_scale keeps 3 more bits
        ddt = tl.float16
    kc, vc = k_cache, v_cache
    if words:
        kc, vc = k_cache.view(torch.int32), v_cache.view(torch.int32)
    out_arg, bf16_bits = store_view(out, runs_interpreted(_decode_kernel))
    pdl = use_pdl(_decode_kernel, q.device, b)
    if splits > 1:
        po = torch.empty((b, hq, splits, d), dtype=torch.float32, device=q.device)
        plse = torch.empty((b, hq, splits), dtype=torch.float32, device=q.device)
    else:
        po = plse = out
    common = (q, kc, vc, ks, vs, slot_ids, lens, out_arg, po, plse, float(sm_scale) * LOG2E, splits,
              q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
              vc.stride(0), vc.stride(1), vc.stride(2), *ks_strides, *vs_strides, out.stride(0), out.stride(1))
    if cfg.planes and words and mode == 1 and d >= 64:
        _launch_planes(common, cfg, splits, group, d, ddt, prec, use_asm, bf16_bits, pdl)
    else:
        _launch_decode(common, cfg, splits, group, d, ddt, prec, mode, words, use_asm, bf16_bits, pdl)
    if splits > 1:
        _combine_splits(po, plse, out, out_arg, bf16_bits, pdl)
    return out


def cuda_default_on(device: torch.device | str | None) -> bool:
    """Whether the default config takes `cuda_attention`'s kernel on `device` (`CUDA_KERNEL`,
    `CUDA_KERNEL_ARCHS`); an explicit config's `cuda` is honoured on any GPU the kernel applies to."""
    return bool(CUDA_KERNEL and device is not None and torch.device(device).type == "cuda"
                and cuda_attention.capability(torch.device(device)) in CUDA_KERNEL_ARCHS)


def effective_config(cfg: AttnConfig, q: torch.Tensor, k_cache: torch.Tensor, k_scale, v_cache: torch.Tensor,
                     v_scale, out: torch.Tensor | None = None) -> AttnConfig:
    """`cfg` as `decode_attention` runs it on these arguments: AGENTQ_DECODE_ATTN applied (`cuda_choice`),
    and `cuda` dropped where `cuda_attention`'s kernel does not apply (a kernel that then fails to
    build or load also falls back, with a warning). Benchmarks label their rows with it."""
    cfg = cuda_choice(cfg)
    if cfg.cuda and not cuda_attention.applies(q, k_cache, v_cache, k_scale, v_scale, out):
        cfg = dataclasses.replace(cfg, cuda=False)
    return cfg


def cuda_choice(cfg: AttnConfig) -> AttnConfig:
    """`cfg` as AGENTQ_DECODE_ATTN overrides it (read at each call, for A/B runs): ``triton``,
    ``cuda``, ``cuda:WARPS`` or ``cuda:WARPS:STAGES``; unset or empty: `cfg` as it is."""
    choice = os.environ.get("AGENTQ_DECODE_ATTN", "")
    if not choice:
        return cfg
    if choice == "triton":
        return dataclasses.replace(cfg, cuda=False)
    parts = choice.split(":")
    stages_ok = len(parts) < 3 or (parts[2].isdigit() and 1 <= int(parts[2]) <= cuda_attention.MAX_STAGES)
    if parts[0] != "cuda" or len(parts) > 3 or (len(parts) >= 2 and parts[1] not in ("1", "2", "4", "8")) \
            or not stages_ok:
        raise ValueError(f"AGENTQ_DECODE_ATTN={choice!r}: expected triton, cuda, cuda:WARPS (1, 2, 4 or 8) or "
                         f"cuda:WARPS:STAGES (stages 1..{cuda_attention.MAX_STAGES})")
    if len(parts) == 3:     # a launch that cannot load would run Triton's kernel under this choice's name
        problem = cuda_attention.launch_problem(int(parts[1]), int(parts[2]))
        if problem:
            raise ValueError(f"AGENTQ_DECODE_ATTN={choice!r}: {problem}")
    return dataclasses.replace(cfg, cuda=True, cuda_warps=int(parts[1]) if len(parts) >= 2 else cfg.cuda_warps,
                               cuda_stages=int(parts[2]) if len(parts) == 3 else cfg.cuda_stages)


#: `cuda_attention`'s launch by GPU and grid: (a fragment of the GPU's name, rows (most blocks a split,
#: warps, stages)); the first entry whose fragment the device's name holds, then its first row with
#: B · Hkv ≤ most blocks (None: any). The "" entry is every other GPU's.
#: * H200 (round 44 sweep, 3 stages then fixed): 4 warps at 512 blocks (B 64 at 8 KV heads: 91.2
#:   against 94.1 µs with 2), 2 at 128 and 1,024 (B 16: 35.9 against 38.4; B 128: 160.2 against 162.7).
#: * H100 (round 51, two sweeps of warps × stages on two machines, docs/bench/h100-r51/attn-stages.log
#:   and attn-cuda.log; µs at L 2,304, 1.7B heads, against the H200 rule's launch): 2 stages
#:   everywhere (2-4 % faster than 3), the warps within ±1 % except at B 32 (4 warps 56.2 against
#:   64.9 in one sweep, 60.7 against 58.4 in the other); B 16 2 warps 33.8 (36.2), B 32 4 warps
#:   56.2 / 60.7 (56.8 / 62.7), B 64 2 warps 107.3 / 107.8 (110.6 / 110.9), B 128 4 warps 208.8 /
#:   206.4 (214.0 / 216.1).
CUDA_LAUNCH: tuple[tuple[str, tuple[tuple[int | None, int, int], ...]], ...] = (
    ("H100", ((128, 2, 2), (256, 4, 2), (512, 2, 2), (None, 4, 2))),
    ("", ((128, 2, 3), (1023, 4, 3), (None, 2, 3))),
)
#: sweep switches (`bench_engine --decode-sweep attn_cuda_warps=..., attn_cuda_stages=...`): a nonzero
#: value overrides `CUDA_LAUNCH`'s warps / stages for every launch whose config leaves them unset
CUDA_WARPS = 0
CUDA_STAGES = 0


def cuda_launch_for(batch: int, num_kv_heads: int, device: torch.device | str | None = None) -> tuple[int, int]:
    """(warps, stages) of `cuda_attention`'s launch for B · Hkv blocks a split on `device`
    (`CUDA_LAUNCH`; a GPU of no entry, or no device: the "" entry), `CUDA_WARPS` / `CUDA_STAGES`
    applied."""
    name = _gpu_name(torch.device(device)) if device is not None and torch.device(device).type == "cuda" else ""
    rows = next(r for frag, r in CUDA_LAUNCH if frag in name)
    blocks = batch * num_kv_heads
    warps, stages = next((w, s) for most, w, s in rows if most is None or blocks <= most)
    return CUDA_WARPS or warps, CUDA_STAGES or stages


def _gpu_name(device: torch.device) -> str:
    return _gpu_name_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _gpu_name_of(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _launch_cuda(q, k_cache, k_scale, v_cache, v_scale, slot_ids, lens, sm_scale, out, cfg: AttnConfig,
                 splits: int) -> bool:
    """`cuda_attention.decode_attention_cuda` over (B, Hkv, splits), merged by `_combine_splits`;
    False (nothing launched) where that kernel cannot be built or loaded here."""
    b, hq, d = q.shape
    slots32 = slot_ids if slot_ids.dtype == torch.int32 else slot_ids.to(torch.int32)
    lens32 = lens if lens.dtype == torch.int32 else lens.to(torch.int32)
    pdl = use_pdl(_decode_planes_kernel, q.device, b)
    warps, stages = cuda_launch_for(b, k_cache.shape[1], q.device)
    warps, stages = cfg.cuda_warps or warps, cfg.cuda_stages or stages
    po = plse = None
    if splits > 1:
        po = torch.empty((b, hq, splits, d), dtype=torch.float32, device=q.device)
        plse = torch.empty((b, hq, splits), dtype=torch.float32, device=q.device)
    if not cuda_attention.decode_attention_cuda(q, k_cache, k_scale, v_cache, v_scale, slots32, lens32,
                                                float(sm_scale) * LOG2E, out, po, plse, splits, warps, pdl=pdl,
                                                stages=stages):
        return False
    if po is not None and plse is not None:
        _combine_splits(po, plse, out, out, False, pdl)
    return True


def _launch_planes(common, cfg: AttnConfig, splits: int, group: int, d: int, ddt, prec: str, use_asm: bool,
                   bf16_bits: bool, pdl: bool) -> None:
    """`_decode_planes_kernel` over grid (B, Hkv, splits), its word tiles through TMA where `cfg.tma`
    and the caches allow; `common` = `_decode_kernel`'s positional arguments."""
    b, kc, vc = common[0].shape[0], common[1], common[2]
    tma = cfg.tma and TMA_TILES and _tma_descs_apply(kc, vc)
    k_desc, v_desc = _word_descs(kc, vc, cfg.block_n) if tma else (kc, vc)
    # a TMA config run with pointer loads (TMA_TILES off, before sm_90, strided caches)
    stages = cfg.num_stages if tma or not cfg.tma else min(cfg.num_stages, POINTER_STAGES)
    launch_kernel(_decode_planes_kernel, (b, kc.shape[1], splits),
        *common[:10], k_desc, v_desc, *common[10:], TMA=tma,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_D=d, BLOCK_N=cfg.block_n,
        SPLIT=splits > 1, DOT_DTYPE=ddt, INPUT_PREC=prec, ASM_I8=2 if use_asm and cfg.pairs else int(use_asm),
        BF16_BITS=bf16_bits, PDL=pdl, launch_pdl=pdl, num_warps=cfg.num_warps, num_stages=stages)


def _tma_descs_apply(kc: torch.Tensor, vc: torch.Tensor) -> bool:
    """TMA word tiles: sm_90+ (or the interpreter), caches laid out [S, Hkv, Lmax, D/4] int32
    contiguously (one descriptor row per position), 16-byte aligned."""
    return tma_available(kc.device, INTERPRETED) and all(c.is_contiguous() and c.data_ptr() % 16 == 0 for c in (kc, vc))


def _word_descs(kc: torch.Tensor, vc: torch.Tensor, block_n: int):
    """Host TMA descriptors over the int32 word caches as [S·Hkv·Lmax, D/4] rows, tiles of block_n rows."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    words = kc.shape[-1]
    return tuple(TensorDescriptor(c, [c.numel() // words, words], [words, 1], [block_n, words]) for c in (kc, vc))


def _launch_decode(common, cfg: AttnConfig, splits: int, group: int, d: int, ddt, prec: str, mode: int,
                   words: bool, use_asm: bool, bf16_bits: bool, pdl: bool) -> None:
    """`_decode_kernel` over grid (B, Hkv, splits); `common` = its positional arguments."""
    b, hkv = common[0].shape[0], common[1].shape[1]
    launch_kernel(_decode_kernel, (b, hkv, splits),
        *common,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_D=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=cfg.block_n, SCALE_MODE=mode, SPLIT=splits > 1,
        DOT_DTYPE=ddt, PV_DTYPE=ddt, INPUT_PREC=prec, EVEN_D=triton.next_power_of_2(d) == d and d >= 16,
        K_AS_A=cfg.k_as_a, WORDS=words, ASM_I8=use_asm, BF16_BITS=bf16_bits, PDL=pdl, launch_pdl=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _combine_splits(po: torch.Tensor, plse: torch.Tensor, out: torch.Tensor, out_arg: torch.Tensor,
                    bf16_bits: bool, pdl: bool = False) -> None:
    """Merge the split-K partial outputs po [B, H, S, D] (log-sum-exp plse [B, H, S]) into out."""
    b, hq, splits, d = po.shape
    launch_kernel(_combine_kernel, (b * hq,),
        po, plse, out_arg, splits, hq, out.stride(0), out.stride(1),
        HEAD_D=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_S=max(2, triton.next_power_of_2(splits)),
        BF16_BITS=bf16_bits, PDL=pdl, launch_pdl=pdl, num_warps=4)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: torch.dtype,
                       scale_bytes: int = 4) -> int:
    """Bytes one cached token takes over all layers (K and V): codes + per-token-head scales."""
    per_head = head_dim * kv_dtype.itemsize + (scale_bytes if kv_dtype == torch.int8 else 0)
    return 2 * num_layers * num_kv_heads * per_head


__all__ = ["AttnConfig", "decode_attention", "decode_attention_ref", "kv_bytes_per_token", "pick_config",
           "pick_num_splits"]
