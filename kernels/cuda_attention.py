"""Decode attention over the int8 KV cache as hand-laid warp MMAs fed by bulk copies (CUDA C++, NVRTC).

Why a second kernel beside `triton_attention`'s: decode attention reads the cache once and should
run at the copy bandwidth. Triton's `tl.dot` wants 16 query rows, so a GQA group of 2–4 heads fills
2–4 of 16 MMA rows. Here the K tile (16 positions × 16 dims) is the ``mma.sync.m16n8k16`` A operand
and the query group its 8-column B operand, so up to 8 heads share one MMA with no padding, and one
thread of a block moves each tile (K and V codes of 16 · warps positions, and their scales: four
``cp.async.bulk`` copies) into one of STAGES shared-memory stages counted in by an mbarrier, so a block
keeps STAGES - 1 tiles (~17 KB each at 4 warps) in flight without holding registers. Measured on an H200 (round 44,
docs/kernels-history.md): 1.00–1.04× the Triton kernel at B 64–128 (3.4–3.9 TB/s), 1.11–1.19× at B 16.
Reading the tiles into registers instead (one or two tiles a warp) or with per-lane ``cp.async``
ran at 2–3 TB/s.

Layout and numerics are those of `triton_attention.decode_attention` with one split per warp:
int8 codes become exact fp16 values (the 1 LOP3 + 2 PRMT + 2 HSUB2 magic-number sequence per word),
q is read as fp16 (from bf16: round to nearest), scores accumulate in fp32, scaled by the token's K
scale and then by sm_scale · log2(e), probabilities are exp2 of the log2-domain scores, and P · V
takes ``fp16(p · v_scale)`` with fp32 accumulation. Sums run in another order than the Triton
kernel's, so results agree to rounding, not bit for bit.

Fragment mapping (lane = 4 · r + c, PTX ISA's m16n8k16 layouts; a dot product may permute its
summed index as long as both operands do), for a warp's 16 positions from n0:
* scores: A[row, k] = K[n0 + row, dim(k)], B[k, g] = q[g, dim(k)], with k slots 2c, 2c+1, 2c+8,
  2c+9 of MMA m on dims 32c + 4m + 0..3 (one int32 word of the lane's 32 contiguous bytes);
  C[row, g]: lane (r, c) gets positions n0 + r and n0 + r + 8 for heads 2c and 2c + 1;
* P · V as Oᵀ = Vᵀ · Pᵀ: A[row, k] = V[n0 + k, dim(row, m)], B[k, g] = p'[g, n0 + k], rows r and
  r + 8 of MMA m on dims 16r + 2m and 16r + 2m + 1; lane (r, c) reads positions n0 + 2c, +1, +8, +9
  (16 bytes each) and accumulates O[heads 2c, 2c+1][dims 16r .. 16r + 15]. p' goes from the score
  fragments to the B fragments through 256 bytes of shared memory per warp.
Each warp keeps its own online softmax; the block's warps merge their (max, sum, O) as split-K does.
A tile that would run past the cache's last position (only the last, and only where a row reaches
within a tile of Lmax) is read by the warps from global memory instead.

`decode_attention_cuda` requires: CUDA capability ≥ 9.0 (bulk copies), head_dim 128, ≤ 8 q heads
per KV head, int8 caches in the slot layout with per-token fp32 scales, 16-byte aligned (slot, head)
rows of codes and scales, bf16/fp16 q, an output of q's dtype contiguous in head_dim. `applies`
checks all of it; `triton_attention.decode_attention` runs it where `AttnConfig.cuda` asks (the int8
default on sm_90, `triton_attention.CUDA_KERNEL_ARCHS`; AGENTQ_DECODE_ATTN=cuda / triton overrides
the config) and it applies, and its own kernel otherwise,
also where this kernel cannot be built or loaded here (an NVRTC that does not know the GPU, a driver
older than the NVRTC, more shared memory than the GPU gives a block: said once, in a warning).
"""
from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import torch

from . import _unpack_ptx

if TYPE_CHECKING:
    from ._cuda_rtc import CudaKernel

HEAD_D = 128
MAX_GROUP = 8

_SOURCE = r"""
// GROUP, Q_BF16, NWARPS, MIN_BLOCKS, PDL, TILE_POS, STAGES, STAGE_BYTES are #defined in front
typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

__device__ __forceinline__ void unpack_word(u32 w, u32 &lo, u32 &hi) {
    // 4 int8 codes -> fp16x2 (code0, code1), (code2, code3): _unpack_ptx.word_to_halves
    asm(@UNPACK_WORD@
        : "=r"(lo), "=r"(hi) : "r"(w));
}

__device__ __forceinline__ void unpack_pair(u32 w0, u32 w1, u32 &d0, u32 &d1, u32 &d2, u32 &d3) {
    // words of two positions -> for byte j: fp16x2 (w0's code j, w1's code j): _unpack_ptx.words_to_planes
    asm(@UNPACK_PAIR@
        : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3) : "r"(w0), "r"(w1));
}

__device__ __forceinline__ void mma16816(float *c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 f32x2_to_f16x2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

__device__ __forceinline__ u16 f32_to_out(float x) {
    u16 h;
#if Q_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
#endif
    return h;
}

__device__ __forceinline__ u32 q_pair(u32 w) {
    // two q values (low: lower dim) -> fp16x2
#if Q_BF16
    return f32x2_to_f16x2(__int_as_float(w << 16), __int_as_float(w & 0xffff0000u));
#else
    return w;
#endif
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float lg2(float x) {
    float y;
    asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint4 load16(const signed char *p, bool ok) {
    // a predicated 16-byte load (the tail tile's rows past lmax read as zeros)
    uint4 v;
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t"
                 "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
                 "@p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "r"((int)ok));
    return v;
}

struct Softmax {           // a lane's running state: heads 2c and 2c + 1
    float m0, m1, l0, l1;
    float acc[8][4];       // O^T fragments: [MMA m][(dim 16r + 2m, 2c), (.., 2c+1), (dim + 1, 2c), (dim + 1, 2c+1)]
};

struct TileData {          // what a lane reads of one tile
    uint4 ka0, ka1, kb0, kb1, va, vb, vc8, vd;
    float ksa, ksb, vsa, vsb;
};

// A lane's reads, from global memory, of a 16-position tile [n0, n0 + 16) that runs past the cache's
// last position lmax (the loads there skipped). kp: its K bytes at position n0 + r (dims 32c ..), vp: its
// V bytes at position n0 + 2c (dims 16r ..), ksp / vsp: the scales at position n0 + r.
__device__ __forceinline__ void load_tail_tile(TileData &t, const signed char *kp, const signed char *vp,
                                               const float *ksp, const float *vsp, int n0, int end, int lmax,
                                               int r, int c) {
    const int pa = n0 + r, pv = n0 + 2 * c;
    t.ka0 = load16(kp, pa < lmax); t.ka1 = load16(kp + 16, pa < lmax);
    t.kb0 = load16(kp + 8 * 128, pa + 8 < lmax); t.kb1 = load16(kp + 8 * 128 + 16, pa + 8 < lmax);
    t.va = load16(vp, pv < lmax); t.vb = load16(vp + 128, pv + 1 < lmax);
    t.vc8 = load16(vp + 8 * 128, pv + 8 < lmax); t.vd = load16(vp + 9 * 128, pv + 9 < lmax);
    t.ksa = pa < end ? ksp[0] : 0.f; t.ksb = pa + 8 < end ? ksp[8] : 0.f;
    t.vsa = pa < end ? vsp[0] : 0.f; t.vsb = pa + 8 < end ? vsp[8] : 0.f;
}

// Bulk copies (sm_90): one thread moves a whole tile's K, V and scales into a stage, and the stage's
// mbarrier counts the bytes in, so a block keeps STAGES - 1 tiles in flight without registers.
__device__ __forceinline__ unsigned smem_u32(const void *p) {
    unsigned a;
    asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void mbar_init(unsigned bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_tile(unsigned dst, unsigned bar, const signed char *k, const signed char *v,
                                          const float *ks, const float *vs) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(STAGE_BYTES) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(k), "r"(TILE_POS * 128), "r"(bar) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst + TILE_POS * 128), "l"(v), "r"(TILE_POS * 128), "r"(bar) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst + 2 * TILE_POS * 128), "l"(ks), "r"(TILE_POS * 4), "r"(bar) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst + 2 * TILE_POS * 128 + TILE_POS * 4), "l"(vs), "r"(TILE_POS * 4), "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred P1;\n\tLAB_WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
                 "@P1 bra DONE;\n\tbra LAB_WAIT;\n\tDONE:\n\t}" :: "r"(bar), "r"(parity) : "memory");
}

// A lane's part of its warp's 16 positions (rows 16 * warp ..) of a stage, as `load_tail_tile` reads them
__device__ __forceinline__ void stage_tile(TileData &t, const unsigned char *stage, int warp, int r, int c) {
    const unsigned char *k = stage + (16 * warp + r) * 128 + 32 * c;
    const unsigned char *v = stage + TILE_POS * 128 + (16 * warp + 2 * c) * 128 + 16 * r;
    t.ka0 = *reinterpret_cast<const uint4 *>(k); t.ka1 = *reinterpret_cast<const uint4 *>(k + 16);
    t.kb0 = *reinterpret_cast<const uint4 *>(k + 8 * 128); t.kb1 = *reinterpret_cast<const uint4 *>(k + 8 * 128 + 16);
    t.va = *reinterpret_cast<const uint4 *>(v); t.vb = *reinterpret_cast<const uint4 *>(v + 128);
    t.vc8 = *reinterpret_cast<const uint4 *>(v + 8 * 128); t.vd = *reinterpret_cast<const uint4 *>(v + 9 * 128);
    const float *s = reinterpret_cast<const float *>(stage + 2 * TILE_POS * 128) + 16 * warp + r;
    t.ksa = s[0]; t.ksb = s[8]; t.vsa = s[TILE_POS]; t.vsb = s[TILE_POS + 8];
}

// One tile's arithmetic: scores, the online softmax update, P.V.
__device__ __forceinline__ void tile(Softmax &st, const u32 (&qf)[8][2], u32 *pw, const TileData &t,
                                     int n0, int end, int r, int c, float qk_scale) {
    const float NEG_INF = __int_as_float(0xff800000);
    const bool oka = n0 + r < end, okb = n0 + r + 8 < end;   // masked positions: score -inf, p' 0
    const uint4 ka0 = t.ka0, ka1 = t.ka1, kb0 = t.kb0, kb1 = t.kb1, va = t.va, vb = t.vb, vc8 = t.vc8, vd = t.vd;
    const float ksa = t.ksa, ksb = t.ksb, vsa = t.vsa, vsb = t.vsb;

    // ---- scores: 8 MMAs over the 128 dims
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    const u32 kaw[8] = {ka0.x, ka0.y, ka0.z, ka0.w, ka1.x, ka1.y, ka1.z, ka1.w};
    const u32 kbw[8] = {kb0.x, kb0.y, kb0.z, kb0.w, kb1.x, kb1.y, kb1.z, kb1.w};
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        u32 a0, a2, a1, a3;
        unpack_word(kaw[m], a0, a2);
        unpack_word(kbw[m], a1, a3);
        mma16816(s, a0, a1, a2, a3, qf[m][0], qf[m][1]);
    }
    // s: (pa, head 2c), (pa, 2c+1), (pa + 8, 2c), (pa + 8, 2c+1); scaled as the Triton kernel does
    s[0] = oka ? s[0] * ksa * qk_scale : NEG_INF;
    s[1] = oka ? s[1] * ksa * qk_scale : NEG_INF;
    s[2] = okb ? s[2] * ksb * qk_scale : NEG_INF;
    s[3] = okb ? s[3] * ksb * qk_scale : NEG_INF;

    // ---- online softmax over the 16 positions (the 8 lanes of a column c share its heads)
    float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
    const float mn0 = fmaxf(st.m0, mx0), mn1 = fmaxf(st.m1, mx1);   // finite: position n0 < end
    const float p0 = ex2(s[0] - mn0), p1 = ex2(s[1] - mn1), p2 = ex2(s[2] - mn0), p3 = ex2(s[3] - mn1);
    if (__any_sync(0xffffffffu, mn0 > st.m0 || mn1 > st.m1)) {      // rescale only when a max grew
        const float al0 = ex2(st.m0 - mn0), al1 = ex2(st.m1 - mn1);
        st.l0 *= al0; st.l1 *= al1;
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            st.acc[m][0] *= al0; st.acc[m][1] *= al1; st.acc[m][2] *= al0; st.acc[m][3] *= al1;
        }
        st.m0 = mn0; st.m1 = mn1;
    }
    st.l0 += p0 + p2;
    st.l1 += p1 + p3;

    // ---- p' = fp16(p * v_scale) through shared memory as [head][position], read back as B fragments
    u16 *ph = reinterpret_cast<u16 *>(pw);
    const u32 t01 = f32x2_to_f16x2(oka ? p0 * vsa : 0.f, oka ? p1 * vsa : 0.f);
    const u32 t23 = f32x2_to_f16x2(okb ? p2 * vsb : 0.f, okb ? p3 * vsb : 0.f);
    __syncwarp();
    ph[(2 * c) * 16 + r] = (u16)(t01 & 0xffffu);
    ph[(2 * c + 1) * 16 + r] = (u16)(t01 >> 16);
    ph[(2 * c) * 16 + r + 8] = (u16)(t23 & 0xffffu);
    ph[(2 * c + 1) * 16 + r + 8] = (u16)(t23 >> 16);
    __syncwarp();
    const u32 pb0 = pw[r * 8 + c], pb1 = pw[r * 8 + c + 4];

    // ---- O^T += V^T P^T: word j of each position pair gives dims 16r + 4j .. +3
    const u32 vaw[4] = {va.x, va.y, va.z, va.w}, vbw[4] = {vb.x, vb.y, vb.z, vb.w};
    const u32 vcw[4] = {vc8.x, vc8.y, vc8.z, vc8.w}, vdw[4] = {vd.x, vd.y, vd.z, vd.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u32 e0, e1, e2, e3, f0, f1, f2, f3;
        unpack_pair(vaw[j], vbw[j], e0, e1, e2, e3);
        unpack_pair(vcw[j], vdw[j], f0, f1, f2, f3);
        mma16816(st.acc[2 * j], e0, e1, f0, f1, pb0, pb1);
        mma16816(st.acc[2 * j + 1], e2, e3, f2, f3, pb0, pb1);
    }
}

extern "C" __global__ void __launch_bounds__(NWARPS * 32, MIN_BLOCKS)
agentq_decode_attn_i8(const u16 *__restrict__ q, const signed char *__restrict__ kc,
                      const signed char *__restrict__ vc, const float *__restrict__ ks,
                      const float *__restrict__ vs, const int *__restrict__ slots, const int *__restrict__ lens,
                      u16 *__restrict__ out, float *__restrict__ po, float *__restrict__ plse,
                      float qk_scale, int num_splits, int lmax,
                      i64 sqb, i64 sqh, i64 skS, i64 skH, i64 svS, i64 svH,
                      i64 sksS, i64 sksH, i64 svsS, i64 svsH, i64 sob, i64 soh)
{
#if PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    __shared__ u32 pbuf[NWARPS][8][8];              // per warp: p' as fp16 [8 heads][16 positions]
    __shared__ float wm[NWARPS][8], wl[NWARPS][8];  // per warp: running max and sum per head
    extern __shared__ __align__(128) unsigned char dyn[];     // STAGES stages of STAGE_BYTES; then the O's
    __shared__ __align__(8) unsigned long long full[STAGES];
#define WO(w) reinterpret_cast<float (*)[128]>(dyn + (w) * 4096)

    const int b = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 2, c = lane & 3;
    const i64 slot = slots[b];
    const int length = lens[b];
    const int chunk = ((length + num_splits - 1) / num_splits + TILE_POS - 1) / TILE_POS * TILE_POS;
    const int start = sp * chunk;
    const int end = min(start + chunk, length);

    // q as the score MMAs' B fragments: head r, dims 32c + 4m + {0,1} and {2,3}
    u32 qf[8][2];
    if (r < GROUP) {
        const uint4 *qrow = reinterpret_cast<const uint4 *>(q + b * sqb + (i64)(kvh * GROUP + r) * sqh + 32 * c);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 w = qrow[i];
            qf[2 * i][0] = q_pair(w.x); qf[2 * i][1] = q_pair(w.y);
            qf[2 * i + 1][0] = q_pair(w.z); qf[2 * i + 1][1] = q_pair(w.w);
        }
    } else {
#pragma unroll
        for (int m = 0; m < 8; ++m) { qf[m][0] = 0u; qf[m][1] = 0u; }
    }

    Softmax st;
    st.m0 = st.m1 = __int_as_float(0xff800000);
    st.l0 = st.l1 = 0.f;
#pragma unroll
    for (int m = 0; m < 8; ++m) { st.acc[m][0] = st.acc[m][1] = st.acc[m][2] = st.acc[m][3] = 0.f; }

    // the block's tiles of TILE_POS positions (warp w: rows 16w ..) by bulk copies, STAGES deep; a
    // tile that runs past lmax (the last one, at most) is read from global memory by each warp
    const signed char *k0 = kc + slot * skS + (i64)kvh * skH, *v0p = vc + slot * svS + (i64)kvh * svH;
    const float *ks0 = ks + slot * sksS + (i64)kvh * sksH, *vs0 = vs + slot * svsS + (i64)kvh * svsH;
    const int ntiles = end > start ? (end - start + TILE_POS - 1) / TILE_POS : 0;
    const unsigned stages0 = smem_u32(dyn), bars0 = smem_u32(&full[0]);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(bars0 + 8 * s);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int t = 0; t < STAGES && t < ntiles; ++t) {
            const int n = start + t * TILE_POS;
            if (n + TILE_POS <= lmax)
                bulk_tile(stages0 + t * STAGE_BYTES, bars0 + 8 * t, k0 + (i64)n * 128, v0p + (i64)n * 128, ks0 + n, vs0 + n);
        }
    for (int t = 0; t < ntiles; ++t) {
        const int n = start + t * TILE_POS, n0 = n + 16 * warp, s = t % STAGES;
        TileData td;
        if (n + TILE_POS <= lmax) {
            mbar_wait(bars0 + 8 * s, (t / STAGES) & 1);
            stage_tile(td, dyn + s * STAGE_BYTES, warp, r, c);
        } else {
            load_tail_tile(td, k0 + (i64)(n0 + r) * 128 + 32 * c, v0p + (i64)(n0 + 2 * c) * 128 + 16 * r,
                            ks0 + n0 + r, vs0 + n0 + r, n0, end, lmax, r, c);
        }
        if (n0 < end) tile(st, qf, &pbuf[warp][0][0], td, n0, end, r, c, qk_scale);
        __syncthreads();                       // every warp is done with stage s
        const int nt = t + STAGES, nn = start + nt * TILE_POS;
        if (threadIdx.x == 0 && nt < ntiles && nn + TILE_POS <= lmax) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bulk_tile(stages0 + s * STAGE_BYTES, bars0 + 8 * s, k0 + (i64)nn * 128, v0p + (i64)nn * 128, ks0 + nn, vs0 + nn);
        }
    }
    float (*wo_w)[128] = reinterpret_cast<float (*)[128]>(dyn + warp * 4096);   // the stages, now free

    // ---- merge the warps: sums over the 8 lanes of a column, then (max, sum, O) through shared memory
    float l0 = st.l0, l1 = st.l1;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    }
    if (r == 0) {
        wm[warp][2 * c] = st.m0; wm[warp][2 * c + 1] = st.m1;
        wl[warp][2 * c] = l0; wl[warp][2 * c + 1] = l1;
    }
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        const int d = 16 * r + 2 * m;
        wo_w[2 * c][d] = st.acc[m][0];
        wo_w[2 * c + 1][d] = st.acc[m][1];
        wo_w[2 * c][d + 1] = st.acc[m][2];
        wo_w[2 * c + 1][d + 1] = st.acc[m][3];
    }
    __syncthreads();
    const float NEG_INF = __int_as_float(0xff800000);
    const int hq = gridDim.y * GROUP;
    for (int idx = threadIdx.x; idx < GROUP * 128; idx += NWARPS * 32) {
        const int g = idx >> 7, d = idx & 127;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, wm[w][g]);
        float l = 0.f, o = 0.f;
        if (mx != NEG_INF) {
#pragma unroll
            for (int w = 0; w < NWARPS; ++w) {
                const float f = ex2(wm[w][g] - mx);
                l += f * wl[w][g];
                o += f * WO(w)[g][d];
            }
        }
        const float safe_l = l > 0.f ? l : 1.f;
        const int h = kvh * GROUP + g;
        if (num_splits > 1) {
            const i64 row = ((i64)b * hq + h) * num_splits + sp;
            po[row * 128 + d] = o / safe_l;
            if (d == 0) plse[row] = l > 0.f ? mx + lg2(safe_l) : NEG_INF;
        } else {
            out[b * sob + (i64)h * soh + d] = f32_to_out(o / safe_l);
        }
    }
}
"""


def _c_asm(block: str) -> str:
    """A PTX block as the C string literal an asm statement takes (one line a piece)."""
    return "\n        ".join(f'"{line}\\n\\t"' for line in block.splitlines())


SOURCE = (_SOURCE
          .replace("@UNPACK_WORD@", _c_asm(_unpack_ptx.asm_block(_unpack_ptx.word_to_halves("%2", "%0", "%1"))))
          .replace("@UNPACK_PAIR@", _c_asm(_unpack_ptx.asm_block(
              _unpack_ptx.words_to_planes("%4", "%5", ("%0", "%1", "%2", "%3"))))))

#: warps a block: each walks 16 of the block's positions in every tile (TILE_POS = 16 · warps)
DEFAULT_WARPS = 4
#: stages a block by default: tiles in flight while one is computed = stages - 1. Stages change
#: where tiles wait, not the arithmetic: every stage count gives the same bits for the same warps
STAGES = 3
#: the most stages a launch may ask for
MAX_STAGES = 8


def _disabled() -> bool:
    return os.environ.get("AGENTQ_CUDA_KERNELS", "1") == "0"


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of a CUDA device (cached per device)."""
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def nvrtc_found() -> bool:
    from ._cuda_rtc import NvrtcUnavailable, nvrtc
    try:
        nvrtc()
        return True
    except NvrtcUnavailable:
        return False


def stage_bytes(warps: int) -> int:
    """One stage: the K and V codes of a tile's 16 · warps positions and their fp32 scales."""
    return 16 * warps * (2 * HEAD_D + 2 * 4)


def dynamic_shared_bytes(warps: int, stages: int = STAGES) -> int:
    """The stages, which also hold the warps' partial O's after the loop (4 KB a warp)."""
    return max(stages * stage_bytes(warps), 4096 * warps)


#: the most shared memory a block may hold on sm_90 (of the SM's 228 KB, 1 KB stays the system's)
MAX_BLOCK_SHARED = 227 * 1024
#: the static shared memory beside the stages (barriers, the block's reductions), with room to spare
STATIC_SHARED = 3072


def launch_problem(warps: int, stages: int) -> str | None:
    """Why a (warps, stages) launch cannot run, or None: warps 1, 2, 4 or 8, stages 1..MAX_STAGES, and
    the stages' shared memory within a block's (8 warps take at most 6 stages)."""
    if warps not in (1, 2, 4, 8):
        return f"warps {warps} not one of 1, 2, 4, 8"
    if not 1 <= stages <= MAX_STAGES:
        return f"stages {stages} outside 1..{MAX_STAGES}"
    need = dynamic_shared_bytes(warps, stages) + STATIC_SHARED
    if need > MAX_BLOCK_SHARED:
        return (f"{stages} stages of {warps} warps need {need // 1024} KB of shared memory a block, more than "
                f"the {MAX_BLOCK_SHARED // 1024} KB a block may hold")
    return None


def source_for(group: int, q_bf16: bool, warps: int, pdl: bool, stages: int = STAGES) -> str:
    """The kernel's source with its compile-time constants in front."""
    if not 1 <= group <= MAX_GROUP:
        raise ValueError(f"group {group} outside 1..{MAX_GROUP}")
    problem = launch_problem(warps, stages)
    if problem:
        raise ValueError(problem)
    # blocks an SM the registers are sized for: 16 warps, fewer where the stages' shared memory caps it
    min_blocks = max(1, min(16 // warps, MAX_BLOCK_SHARED // (dynamic_shared_bytes(warps, stages) + STATIC_SHARED)))
    return (f"#define GROUP {group}\n#define Q_BF16 {int(q_bf16)}\n#define NWARPS {warps}\n"
            f"#define MIN_BLOCKS {min_blocks}\n#define PDL {int(pdl)}\n#define TILE_POS {16 * warps}\n"
            f"#define STAGES {stages}\n#define STAGE_BYTES {stage_bytes(warps)}\n" + SOURCE)


SIGNATURE = "pppppppppp" + "fii" + "q" * 12


@functools.lru_cache(maxsize=None)
def loaded(group: int, q_bf16: bool, warps: int, pdl: bool, arch: str, device_index: int,
           stages: int = STAGES) -> "CudaKernel | None":
    """`kernel(...)` compiled and loaded on the device, or None (warned once) where NVRTC or the driver
    refuses it, so that the caller runs the Triton kernel instead."""
    import warnings

    from ._cuda_rtc import NvrtcError
    try:
        fn = kernel(group, q_bf16, warps, pdl, arch, stages)
        fn.function(device_index)
        return fn
    except (NvrtcError, RuntimeError, OSError) as e:
        warnings.warn(f"cuda_attention: the {warps}-warp, {stages}-stage kernel for {arch} could not be built or "
                      f"loaded here ({str(e).splitlines()[0]}); the Triton decode attention runs instead",
                      stacklevel=3)
        return None


@functools.lru_cache(maxsize=None)
def kernel(group: int, q_bf16: bool, warps: int, pdl: bool, arch: str, stages: int = STAGES) -> "CudaKernel":
    """The compiled kernel for one variant (NVRTC runs once per variant and process)."""
    from ._cuda_rtc import CudaKernel, compile_cubin
    cubin = compile_cubin(source_for(group, q_bf16, warps, pdl, stages), arch)
    # all of L1 as shared memory, so that 4 blocks of 3 stages fit an SM
    return CudaKernel(cubin, "agentq_decode_attn_i8", SIGNATURE, shared_carveout=100,
                      dynamic_shared=dynamic_shared_bytes(warps, stages))


def applies(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: object, v_scale: object,
            out: torch.Tensor | None = None) -> bool:
    """Whether `decode_attention_cuda` can run these arguments (see the module docstring)."""
    if _disabled() or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if out is not None and (out.dtype != q.dtype or out.stride(-1) != 1 or out.device != q.device):
        return False
    if k_cache.dtype != torch.int8 or v_cache.dtype != torch.int8 or q.device.type != "cuda":
        return False
    if not isinstance(k_scale, torch.Tensor) or not isinstance(v_scale, torch.Tensor) or k_scale.numel() == 1:
        return False
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    if d != HEAD_D or hq % hkv or hq // hkv > MAX_GROUP or _capability(q.device.index or 0) < (9, 0):
        return False
    if q.stride(-1) != 1 or (q.stride(1) * 2) % 16 or (q.stride(0) * 2) % 16 or q.data_ptr() % 16:
        return False
    if k_cache.shape != v_cache.shape or k_cache.shape[-1] != HEAD_D:
        return False
    for c in (k_cache, v_cache):    # positions 128 bytes apart, (slot, head) rows 16-byte aligned
        if c.stride(-1) != 1 or c.stride(2) != HEAD_D or c.data_ptr() % 16 or any(s % 16 for s in c.stride()[:2]):
            return False
    for s in (k_scale, v_scale):    # bulk copies of the scales: 16-byte aligned (slot, head) rows
        if (s.dtype != torch.float32 or s.stride(-1) != 1 or s.data_ptr() % 16
                or any((st * 4) % 16 for st in s.stride()[:2])):
            return False
    return nvrtc_found()


def decode_attention_cuda(q: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor, v_cache: torch.Tensor,
                          v_scale: torch.Tensor, slot_ids: torch.Tensor, lens: torch.Tensor, qk_scale: float,
                          out: torch.Tensor, po: torch.Tensor | None, plse: torch.Tensor | None, splits: int,
                          warps: int = DEFAULT_WARPS, pdl: bool = False, stages: int = STAGES) -> bool:
    """Launch the kernel over grid (B, Hkv, splits) with `warps` warps a block and `stages` bulk-copy
    stages (the same bits for any stages). qk_scale = sm_scale · log2(e). With one split
    it writes `out` [B, Hq, 128]; otherwise each split's normalized partial O into po [B, Hq, splits,
    128] and its log2-sum-exp into plse [B, Hq, splits] (`triton_attention._combine_splits` merges
    them). Call `applies` first; slot_ids / lens are int32. Returns False, having launched nothing,
    where the kernel cannot be built or loaded here (`loaded`)."""
    b, hq, _ = q.shape
    hkv = k_cache.shape[1]
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    major, minor = _capability(device_index)
    fn = loaded(hq // hkv, q.dtype == torch.bfloat16, warps, pdl, f"sm_{major}{minor}", device_index, stages)
    if fn is None:
        return False
    if splits > 1:
        assert po is not None and plse is not None
    else:
        po = plse = out
    launch = functools.partial(fn.launch, (b, hkv, splits), warps * 32,
              (q, k_cache, v_cache, k_scale, v_scale, slot_ids, lens, out, po, plse, float(qk_scale), int(splits),
               k_cache.shape[2], q.stride(0), q.stride(1), *k_cache.stride()[:2], *v_cache.stride()[:2],
               k_scale.stride(0), k_scale.stride(1), v_scale.stride(0), v_scale.stride(1),
               out.stride(0), out.stride(1)),
              torch.cuda.current_stream(q.device).cuda_stream, device_index, pdl=pdl)
    if device_index == torch.cuda.current_device():
        launch()
    else:                       # the function lives in q's device's context: make it current
        with torch.cuda.device(device_index):
            launch()
    return True
