"""W8A8 GEMM (Triton): int8 x int8 -> int32 `tl.dot`, fused per-token x per-channel rescale + bias.

    Y[m, n] = out_dtype( ((float(acc[m, n]) * s_x[m]) * s_w[n]) + bias[n] ),   acc = X_q[m] . W_q[n]

exactly `quant.w8a8_epilogue` (same op order, separate IEEE roundings: the kernels are compiled with
`enable_fp_fusion=False`, so no multiply-add is contracted into an fma). Weights are `w_q [N, K]`
int8 row-major (K contiguous, what int8 tensor-core MMAs want) and `s_w [N]` fp32.

Split-K (small M, large K: more programs than output tiles) reduces **int32** partials before any
scaling: every split adds its partial into an int32 workspace with integer atomics, and the last
split to arrive at a tile (an atomic ticket per tile) reads the total back with an atomic exchange
(which also re-zeroes the workspace), runs the epilogue and resets the ticket. Integer addition is
associative, so every tiling and split gives the same int32 accumulator and the result does not
depend on the batch size, the config or the arrival order. The workspace and tickets are persistent
per device (CUDA-graph safe); two launches must not run concurrently on different streams.

That exchange is acquire-release per element, so each thread's 16-32 of them run one L2 round
trip after another: on the H200 split-K added ~17-20 µs per launch at decode shapes
(`docs/bench/h200-r2/tune-qwen3-decode.json`: Qwen3-8B o-proj at M = 64, 10.4 µs unsplit, 27.2 µs
in 2 splits). A fix-up by plain L2 loads after the ticket's acquire and a barrier (round 6) halved
that but never beat one split at any decode shape, and returned wrong sums on the H200 (3 splits),
where the interpreter had been bit-exact; it was removed (`docs/kernels-history.md`, round 7).
`int8_gemm_partials` splits K without either: each split stores its int32 sums to its own slice
and the kernel that reads the output anyway (the next residual add + RMSNorm) adds them and runs
the epilogue (`quant.PartialSums`; round 12, the o / down projections at decode rows).

`w8a8_linear(x, w_q, s_w, bias, spec)`: fused per-token quantization (`triton_quant`) + this GEMM;
bit-identical to `quant.w8a8_linear`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import quant, triton_quant
from ._interp import HAVE_TRITON, interpreting, num_sms, require_triton, runs_interpreted, tma_available
from ._launch import launch_kernel
from .quant_spec import QuantSpec

INTERPRETED = interpreting()


@dataclass(frozen=True)
class GemmConfig:
    """One launch shape of `_w8a8_gemm_kernel` (it never changes the result's bits)."""

    block_m: int                 # output tile: rows (tokens) ...
    block_n: int                 # ... and columns (output features) per program
    block_k: int                 # reduction step per loop iteration
    split_k: int = 1             # programs sharing one output tile's K range (int32 partials)
    group_m: int = 8             # row tiles that walk the weight tiles together (L2 reuse)
    num_warps: int = 4
    num_stages: int = 4          # software-pipelining depth of the K loop
    persistent: int = 0          # 1: `_w8a8_gemm_tma_kernel` (one program per SM walks the tiles, TMA loads);
    #                              2: the same with its tile loop flattened (next tile's loads overlap the epilogue);
    #                              3: flattened and warp-specialized
    spread: int = 0              # > 0: the N columns spread evenly over spread × (the device's SMs) column
    #                              programs (`column_split`), each a masked block_n-wide tile; 0: block_n apiece

    def __post_init__(self):
        if self.spread < 0:
            raise ValueError(f"GemmConfig: spread is a count of column programs per SM (0: off), not {self.spread}")
        if self.spread and self.persistent:
            raise ValueError("GemmConfig: spread columns are a launch of the plain kernel, not of the persistent one")

    def short(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k}/s{self.split_k}/g{self.group_m}"
                f"/w{self.num_warps}/st{self.num_stages}" + (f"/p{self.persistent}" if self.persistent else "")
                + (f"/sp{self.spread}" if self.spread else ""))

    def table_row(self) -> list:
        """The config as `h200_gemm.json` lists it (`load_table` reads it back with GemmConfig(*row))."""
        row = [self.block_m, self.block_n, self.block_k, self.split_k, self.group_m, self.num_warps, self.num_stages]
        if self.spread:
            return row + [self.persistent, self.spread]
        return row + [self.persistent] if self.persistent else row


# ------------------------------------------------------------------ config table (H200, measured)
TABLE_FILE = Path(__file__).with_name("h200_gemm.json")


def load_table(path: Path = TABLE_FILE, section: str = "gemm") -> dict[tuple[int, int], list[tuple[int, GemmConfig]]]:
    """(N, K) -> [(max_M, config), ...] from the JSON the tuning sweeps fill (`python -m
    agentq.eval.bench_kernels --tune gemm`, see docs/kernels.md); the first entry with M <= max_M is
    used, a last entry measured at `LARGE_M` rows or more also serves larger M, and any other shape
    falls back to `heuristic_config`. Section "partials": `int8_gemm_partials`'s split launches,
    where handing the K slices' int32 sums to the next norm measured faster than the GEMM with its
    epilogue (`bench_kernels --partials tune`); no row, no split. Section "glu": `int8_gemm_glu`'s
    launches where they differ from the plain GEMM's, keyed by the paired weight's rows (2 × the
    output width) and K (`bench_kernels --glu tune`)."""
    raw = json.loads(path.read_text()).get(section, {})
    table = {}
    for key, rows in raw.items():
        n, k = (int(v) for v in key.split("x"))
        table[(n, k)] = [(int(max_m), GemmConfig(*cfg)) for max_m, cfg in rows]
    return table


H200_TABLE: dict[tuple[int, int], list[tuple[int, GemmConfig]]] = load_table()
H200_GLU_TABLE: dict[tuple[int, int], list[tuple[int, GemmConfig]]] = load_table(section="glu")
H200_PARTIALS_TABLE: dict[tuple[int, int], list[tuple[int, GemmConfig]]] = load_table(section="partials")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def column_split(n: int, cfg: GemmConfig, sms: int) -> tuple[int, int]:
    """(columns per program, column programs) of cfg's launch over n output columns on a device of
    `sms` SMs. With `spread`, ⌈n / (spread·sms)⌉ rounded up to even (a GLU's gate / up pairs stay
    whole) when that fits in block_n: at decode rows a weight of 192 block_n-tiles on 132 SMs
    leaves 60 SMs streaming two tiles while 72 idle after one, and evenly spread columns do not
    (a power-of-two tile, masked, covers them). Otherwise block_n columns a program."""
    if cfg.spread:
        cols = 2 * _cdiv(_cdiv(n, cfg.spread * sms), 2)
        if cols <= cfg.block_n:
            return cols, _cdiv(n, cols)
    return cfg.block_n, _cdiv(n, cfg.block_n)


def heuristic_config(m: int, n: int, k: int, num_sms: int = 132) -> GemmConfig:
    """A reasonable config for shapes not in the table: memory-bound decode tiles for small M,
    square-ish tiles for prefill, no split-K. (H200 sweep 4: every Qwen3-8B / 1.7B shape at
    M = 16-256 ran fastest without split-K, even with 64 output tiles on 132 SMs, and split-K
    configs were up to 5x slower; the table keeps split-K only where a sweep measured it faster.)"""
    del num_sms                              # kept in the signature: a future heuristic may use it
    if m <= 16:
        bm, bn, bk, warps, stages = 16, 32, 256, 4, 4
    elif m <= 64:
        bm, bn, bk, warps, stages = 64, 64, 256, 4, 4
    elif m <= 256:
        bm, bn, bk, warps, stages = 64, 128, 256, 4, 3
    else:
        bm, bn, bk, warps, stages = 128, 128, 128, 8, 3
    bk = min(bk, max(32, 1 << (k - 1).bit_length()))
    return GemmConfig(bm, bn, bk, 1, 8, warps, stages)


#: table rows measured at this many rows or more are compute-bound configs: they also serve any larger M
LARGE_M = 2048


def _table_config(table, m: int, n: int, k: int) -> GemmConfig | None:
    rows = table.get((n, k), ())
    for max_m, cfg in rows:
        if m <= max_m:
            return cfg
    if rows and rows[-1][0] >= LARGE_M:
        return rows[-1][1]
    return None


def pick_config(m: int, n: int, k: int, device: torch.device | None = None) -> GemmConfig:
    return _table_config(H200_TABLE, m, n, k) or heuristic_config(m, n, k, num_sms(device))


if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .triton_quant import cast_for_store, pdl_start, round_to, silu_mul_values, w8a8_values

    @triton.jit
    def _epilogue_store(acc, sx_ptr, sw_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_n, M, stride_om,
                        HAS_BIAS: tl.constexpr, BF16_BITS: tl.constexpr):
        """The plain epilogue of a tile whose valid columns are `mask_n`."""
        mask_m = offs_m < M
        sx = tl.load(sx_ptr + offs_m, mask=mask_m, other=0.0)
        sw = tl.load(sw_ptr + offs_n, mask=mask_n, other=0.0)
        y = w8a8_values(acc, sx[:, None], sw[None, :], bias_ptr, offs_n, mask_n, HAS_BIAS)
        ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, cast_for_store(y, out_ptr.dtype.element_ty, BF16_BITS), mask=mask_m[:, None] & mask_n[None, :])

    @triton.jit
    def _glu_epilogue_store(acc, sx_ptr, sw_ptr, bias_ptr, out_ptr, amax_ptr, offs_m, offs_n, mask_n, M, N,
                            stride_om, pid_n, num_n, cols, HAS_BIAS: tl.constexpr, BF16_BITS: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """GLU epilogue of a gate_up GEMM over paired rows (`glu_pair_rows`: row 2j is gate j, row
        2j+1 up j; N = 2·width): g and u as the plain epilogue would store them (rounded to the
        output dtype), then silu(g) · u rounded as `silu_mul` rounds it, stored at columns
        pid_n·cols/2 + [0, cols/2) (the program's `cols` paired rows, even, from column
        pid_n·cols: `mask_n`); and the tile's per-row absmax of that product at amax[row, pid_n]
        (rows of `num_n` partials), from which the codes' scales follow exactly. A thread of the
        MMA layout holds adjacent accumulator columns, so the pair split is local."""
        mask_m = offs_m < M
        sx = tl.load(sx_ptr + offs_m, mask=mask_m, other=0.0)
        sw = tl.load(sw_ptr + offs_n, mask=mask_n, other=0.0)
        gu = round_to(w8a8_values(acc, sx[:, None], sw[None, :], bias_ptr, offs_n, mask_n, HAS_BIAS),
                      out_ptr.dtype.element_ty, BF16_BITS)
        g, u = tl.split(tl.reshape(gu, [BLOCK_M, BLOCK_N // 2, 2]))
        y = silu_mul_values(g, u, out_ptr.dtype.element_ty, BF16_BITS)
        offs_h = pid_n * (cols // 2) + tl.arange(0, BLOCK_N // 2)
        mask = mask_m[:, None] & ((tl.arange(0, BLOCK_N // 2) < cols // 2) & (offs_h < N // 2))[None, :]
        ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_h[None, :]
        tl.store(ptrs, cast_for_store(y, out_ptr.dtype.element_ty, BF16_BITS), mask=mask)
        amax = tl.reduce(tl.where(mask, tl.abs(y), 0.0), 1, tl.standard._elementwise_max)
        tl.store(amax_ptr + offs_m.to(tl.int64) * num_n + pid_n, amax, mask=mask_m)

    @triton.jit
    def _tile_of(tile, num_m, num_n, GROUP_M: tl.constexpr):
        """(row tile, column tile) of a linear tile index in grouped order: GROUP_M row tiles share
        the weight tiles they stream (L2 reuse)."""
        width = GROUP_M * num_n
        first_m = (tile // width) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (tile % width) % size_m, (tile % width) // size_m

    @triton.jit(do_not_specialize=["M", "num_splits"])
    def _w8a8_gemm_kernel(xq_ptr, w_ptr, sx_ptr, sw_ptr, bias_ptr, out_ptr, ws_ptr, ticket_ptr, amax_ptr,
                          M, N, K, stride_xm, stride_wn, stride_om, k_per_split, num_splits, cols,
                          HAS_BIAS: tl.constexpr, USE_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, BF16_BITS: tl.constexpr, PDL: tl.constexpr,
                          GLU: tl.constexpr = False, PARTIALS: tl.constexpr = False, SPREAD: tl.constexpr = False):
        """GLU (`int8_gemm_glu`; no split-K): W's N rows pair gate and up rows (`glu_pair_rows`), and
        each program's tile goes through `_glu_epilogue_store` instead of the plain epilogue.
        PARTIALS (`int8_gemm_partials`): split s stores its int32 sums at ws[s] ([splits, M, N],
        plain stores, no epilogue); the reader adds them up. A program owns `cols` columns from
        pid_n·cols (= BLOCK_N unless SPREAD, `column_split`: then the tile's other columns are
        masked off, loaded as zeros and never stored)."""
        pdl_start(PDL)   # launched early: wait for the producer of x_q / s_x, let the consumer launch
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        num_m = (M + BLOCK_M - 1) // BLOCK_M
        num_n = (N + cols - 1) // cols
        pid_m, pid_n = _tile_of(pid, num_m, num_n, GROUP_M)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * cols + tl.arange(0, BLOCK_N)
        if SPREAD:
            mask_n = (tl.arange(0, BLOCK_N) < cols) & (offs_n < N)
        else:
            mask_n = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        # out-of-range rows/columns re-read valid ones (no load masks); the store drops them
        # (SPREAD: a masked load, since a tile's spare columns are mostly the next program's)
        rm = (offs_m % M).to(tl.int64)
        rn = (offs_n % N).to(tl.int64)
        k_lo = pid_k * k_per_split
        k_hi = tl.minimum(k_lo + k_per_split, K)
        a_ptrs = xq_ptr + rm[:, None] * stride_xm + (k_lo + offs_k)[None, :]
        b_ptrs = w_ptr + rn[None, :] * stride_wn + (k_lo + offs_k)[:, None]

        acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.int32)
        for k in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs)
                if SPREAD:
                    b = tl.load(b_ptrs, mask=mask_n[None, :], other=0)
                else:
                    b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=(k + offs_k)[None, :] < k_hi, other=0)
                b = tl.load(b_ptrs, mask=((k + offs_k)[:, None] < k_hi) & mask_n[None, :], other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K

        if GLU:
            _glu_epilogue_store(acc, sx_ptr, sw_ptr, bias_ptr, out_ptr, amax_ptr, offs_m, offs_n, mask_n, M, N,
                                stride_om, pid_n, num_n, cols, HAS_BIAS, BF16_BITS, BLOCK_M, BLOCK_N)
        elif PARTIALS:
            mask = (offs_m < M)[:, None] & mask_n[None, :]
            slab = ws_ptr + pid_k.to(tl.int64) * M * N
            tl.store(slab + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], acc, mask=mask)
        elif not USE_SPLIT:
            _epilogue_store(acc, sx_ptr, sw_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_n, M, stride_om,
                            HAS_BIAS, BF16_BITS)
        else:
            mask = (offs_m < M)[:, None] & mask_n[None, :]
            ws_ptrs = ws_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
            tl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")
            tl.debug_barrier()
            tile = pid_m * num_n + pid_n
            ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel")
            if ticket == num_splits - 1:
                total = tl.atomic_xchg(ws_ptrs, tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.int32), mask=mask,
                                       sem="acq_rel")
                _epilogue_store(total, sx_ptr, sw_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_n, M, stride_om,
                                HAS_BIAS, BF16_BITS)
                tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed")


    @triton.jit
    def _tma_tile(x_desc, w_desc, sx_ptr, sw_ptr, bias_ptr, out_ptr, amax_ptr, M, N, K, stride_om, tile, tile_out,
                  num_m, num_n, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, BF16_BITS: tl.constexpr, GLU: tl.constexpr):
        """One output tile of `_w8a8_gemm_tma_kernel`: the K loop of `tile`, the epilogue of `tile_out`
        (the same tile; the epilogue recomputes it from its own counter so that a flattened or
        warp-specialized loop may already be loading the next tile)."""
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.int32)
        for kt in range((K + BLOCK_K - 1) // BLOCK_K):
            a = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
        out_m, out_n = _tile_of(tile_out, num_m, num_n, GROUP_M)
        offs_m = out_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = out_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if GLU:
            _glu_epilogue_store(acc, sx_ptr, sw_ptr, bias_ptr, out_ptr, amax_ptr, offs_m, offs_n, offs_n < N, M, N,
                                stride_om, out_n, num_n, BLOCK_N, HAS_BIAS, BF16_BITS, BLOCK_M, BLOCK_N)
        else:
            _epilogue_store(acc, sx_ptr, sw_ptr, bias_ptr, out_ptr, offs_m, offs_n, offs_n < N, M, stride_om,
                            HAS_BIAS, BF16_BITS)

    @triton.jit(do_not_specialize=["M"])
    def _w8a8_gemm_tma_kernel(x_desc, w_desc, sx_ptr, sw_ptr, bias_ptr, out_ptr, amax_ptr, M, N, K, stride_om,
                              HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                              FLATTEN: tl.constexpr, WARP_SPEC: tl.constexpr, BF16_BITS: tl.constexpr,
                              GLU: tl.constexpr = False):
        """The same GEMM for many rows: NUM_PROGRAMS programs (one per SM) walk the output tiles in
        the grouped order, loading X_q / W_q tiles through TMA descriptors (out-of-range rows and
        K columns read as zeros, which add nothing to the integer sums). Same int32 accumulator,
        same epilogue, so the same bits as `_w8a8_gemm_kernel`. FLATTEN / WARP_SPEC: the tile loop
        flattened into the K loop / warp-specialized (producer and consumer warps) by the compiler."""
        first = tl.program_id(0)
        num_m = (M + BLOCK_M - 1) // BLOCK_M
        num_n = (N + BLOCK_N - 1) // BLOCK_N
        tile_out = first - NUM_PROGRAMS
        if WARP_SPEC:     # (the keyword only where asked: not every Triton takes it)
            for tile in tl.range(first, num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=True):
                tile_out += NUM_PROGRAMS
                _tma_tile(x_desc, w_desc, sx_ptr, sw_ptr, bias_ptr, out_ptr, amax_ptr, M, N, K, stride_om, tile,
                          tile_out, num_m, num_n, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, BF16_BITS, GLU)
        else:
            for tile in tl.range(first, num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN):
                tile_out += NUM_PROGRAMS
                _tma_tile(x_desc, w_desc, sx_ptr, sw_ptr, bias_ptr, out_ptr, amax_ptr, M, N, K, stride_om, tile,
                          tile_out, num_m, num_n, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, BF16_BITS, GLU)


class _Workspace:
    """Persistent zeroed int32 split-K workspace and tickets per device (kept zero by the kernel)."""

    def __init__(self):
        self.bufs: dict[tuple, torch.Tensor] = {}

    def get(self, device: torch.device, kind: str, numel: int) -> torch.Tensor:
        key = (device.type, device.index, kind)
        buf = self.bufs.get(key)
        if buf is None or buf.numel() < numel:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("triton_gemm: split-K workspace must be allocated before CUDA-graph "
                                   "capture; run the shapes once eagerly first (warm-up)")
            buf = torch.zeros(max(numel, 1 << 16), dtype=torch.int32, device=device)
            self.bufs[key] = buf
        return buf


_WORKSPACE = _Workspace()


def _operands(x_q: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor):
    """The GEMM's operands checked and made K-contiguous (scales contiguous)."""
    m, k = x_q.shape
    assert x_q.dtype == torch.int8 and w_q.dtype == torch.int8 and w_q.shape[1] == k
    assert s_x.dtype == torch.float32 and s_w.dtype == torch.float32
    if x_q.stride(-1) != 1:
        x_q = x_q.contiguous()
    if w_q.stride(-1) != 1:
        w_q = w_q.contiguous()
    return x_q, s_x.contiguous(), w_q, s_w.contiguous()


def _resolve_config(cfg: GemmConfig, explicit: bool) -> GemmConfig:
    """The table's config, minus the persistent kernel when AGENTQ_PERSISTENT_GEMM=0 (not for an
    explicit config: tuning sweeps measure what they ask for)."""
    if cfg.persistent and not explicit and os.environ.get("AGENTQ_PERSISTENT_GEMM", "1") == "0":
        return dataclasses.replace(cfg, persistent=0)
    return cfg


def int8_gemm(x_q: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype, config: GemmConfig | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Y = w8a8_epilogue(X_q · W_qᵀ, s_x, s_w, bias, out_dtype) for X_q [M, K], W_q [N, K] int8."""
    require_triton("triton_gemm.int8_gemm")
    x_q, s_x, w_q, s_w = _operands(x_q, s_x, w_q, s_w)
    m, k = x_q.shape
    n = w_q.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(quant.w8a8_epilogue(torch.zeros(m, n, dtype=torch.int32, device=x_q.device),
                                             s_x, s_w, bias, out_dtype))
    cfg = _resolve_config(config or pick_config(m, n, k, x_q.device), config is not None)
    if cfg.persistent and _tma_applies(x_q, w_q):
        _int8_gemm_tma(x_q, s_x, w_q, s_w, bias, out, s_w, n, cfg, glu=False)
        return out
    k_per_split, split = _k_slices(k, cfg)
    if split > 1:
        ws = _WORKSPACE.get(x_q.device, "acc", m * n)
        tickets = _WORKSPACE.get(x_q.device, "ticket",
                                 _cdiv(m, cfg.block_m) * column_split(n, cfg, num_sms(x_q.device))[1])
    else:
        ws = tickets = s_w       # unused
    _launch_plain(x_q, s_x, w_q, s_w, bias, out, ws, tickets, s_w, n, cfg, k_per_split, split, glu=False)
    return out


def _k_slices(k: int, cfg: GemmConfig) -> tuple[int, int]:
    """(K per split, splits) of cfg's split-K over k > 0: whole BLOCK_K steps, no empty split."""
    split = max(1, min(cfg.split_k, _cdiv(k, cfg.block_k)))
    k_per_split = _cdiv(_cdiv(k, split), cfg.block_k) * cfg.block_k
    return k_per_split, _cdiv(k, k_per_split)


def partials_config(m: int, n: int, k: int) -> GemmConfig | None:
    """`int8_gemm_partials`'s launch for M rows of a [N, K] weight: the "partials" table's row, or
    None where none was measured faster than the one-split GEMM with its epilogue (no row, or a
    row of split 1)."""
    cfg = _table_config(H200_PARTIALS_TABLE, m, n, k)
    return cfg if cfg is not None and cfg.split_k > 1 else None


def int8_gemm_partials(x_q: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                       bias: torch.Tensor | None, out_dtype: torch.dtype, config: GemmConfig) -> quant.PartialSums:
    """The W8A8 GEMM with its K range split `config.split_k` ways and no epilogue: each split's
    int32 sums go to their own slice of `sums` [S, M, N] (plain stores), for a reader that adds
    them and runs the epilogue (`quant.PartialSums`; `triton_norm.add_rms_norm`). At decode rows
    this buys more programs of wider weight tiles, each reading less of X_q, without the atomics
    and tickets whose cost sank the in-kernel split-K (module docstring)."""
    require_triton("triton_gemm.int8_gemm_partials")
    x_q, s_x, w_q, s_w = _operands(x_q, s_x, w_q, s_w)
    m, k = x_q.shape
    n = w_q.shape[0]
    if config.persistent:
        raise ValueError("int8_gemm_partials runs the plain kernel: a persistent config has no split-K")
    k_per_split, split = _k_slices(k, config) if k else (0, 1)
    sums = torch.empty((split, m, n), dtype=torch.int32, device=x_q.device)
    if m and n:
        if k == 0:
            sums.zero_()
        else:
            _launch_plain(x_q, s_x, w_q, s_w, bias, sums[0], sums, s_w, s_w, n, config, k_per_split, split,
                          glu=False, partials=True)
    return quant.PartialSums(sums, s_x, s_w, bias, out_dtype, (m,))


def _glu_width(rows: int) -> int:
    """The gate (= up) width of a gate_up weight of `rows` rows; an odd count is an error."""
    if rows % 2:
        raise ValueError(f"a gate_up weight holds as many gate as up rows: {rows} rows is odd")
    return rows // 2


def glu_pair_rows(t: torch.Tensor) -> torch.Tensor:
    """A gate_up weight, scale or bias stacked [gate; up] along dim 0 (2N rows) → paired rows: row
    2j is gate row j, row 2j + 1 up row j, the layout `int8_gemm_glu` reads (`glu_unpair_rows`
    undoes it). Paired, each GEMM tile holds the gate and up columns its SiLU·mul needs."""
    return t.reshape(2, _glu_width(t.shape[0]), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def glu_unpair_rows(t: torch.Tensor) -> torch.Tensor:
    """The inverse of `glu_pair_rows`: paired rows back to [gate; up]."""
    return t.reshape(_glu_width(t.shape[0]), 2, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def glu_config(m: int, n2: int, k: int, device: torch.device | None = None) -> GemmConfig:
    """`int8_gemm_glu`'s launch for a paired gate_up weight [n2, k]: the "glu" table's row if
    measured, else the plain GEMM's config for that weight (the same tiles and bytes: the epilogue
    differs), without split-K (each program needs whole sums of its gate and up columns)."""
    tuned = _table_config(H200_GLU_TABLE, m, n2, k)
    return tuned if tuned is not None else dataclasses.replace(pick_config(m, n2, k, device), split_k=1)


def int8_gemm_glu(x_q: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None, out_dtype: torch.dtype, config: GemmConfig | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A gate_up GEMM with SiLU·mul in its epilogue: W_q [2N, K], s_w and bias hold the gate and
    up rows paired (`glu_pair_rows` of an `EngineLinear`'s [gate; up] rows), and the result is

        h = silu_mul(g, u),   [g | u] = int8_gemm(X_q, s_x, W_q', s_w', bias', out_dtype)

    (primes: the stacked rows, `glu_unpair_rows`) bit for bit (`triton_norm.silu_mul`'s
    roundings), without g and u ever written. Returns (h [M, N], amax [M, P]): P per-column-tile
    partial row absmaxes of h, whose max is h's row absmax (`triton_quant.quantize_rows_from_amax`
    turns h into its codes in one read)."""
    require_triton("triton_gemm.int8_gemm_glu")
    x_q, s_x, w_q, s_w = _operands(x_q, s_x, w_q, s_w)
    m, k = x_q.shape
    n2 = w_q.shape[0]
    n = _glu_width(n2)
    cfg = _resolve_config(config or glu_config(m, n2, k, x_q.device), config is not None)
    if cfg.split_k != 1:
        raise ValueError("int8_gemm_glu has no split-K (each program needs whole sums of its gate and up columns)")
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    # every (row, column program) partial is written by that program: no memset launch
    amax = torch.empty((m, max(1, column_split(n2, cfg, num_sms(x_q.device))[1])), dtype=torch.float32,
                       device=x_q.device)
    if m == 0 or n == 0 or k == 0:
        amax.zero_()
        if m and n:   # k == 0: zero sums through the same epilogue and SiLU·mul (the torch ops)
            gu = quant.w8a8_epilogue(torch.zeros(m, n2, dtype=torch.int32, device=x_q.device),
                                     s_x, s_w, bias, out_dtype)
            out.copy_(torch.nn.functional.silu(gu[:, 0::2]) * gu[:, 1::2])
            amax[:, 0] = out.float().abs().amax(1)
        return out, amax
    if cfg.persistent and _tma_applies(x_q, w_q):
        _int8_gemm_tma(x_q, s_x, w_q, s_w, bias, out, amax, n2, cfg, glu=True)
    else:
        _launch_plain(x_q, s_x, w_q, s_w, bias, out, s_w, s_w, amax, n2, cfg, k, 1, glu=True)
    return out, amax


def _launch_plain(x_q, s_x, w_q, s_w, bias, out, ws, tickets, amax, n: int, cfg: GemmConfig, k_per_split: int,
                  split: int, glu: bool, partials: bool = False) -> None:
    """`_w8a8_gemm_kernel` over grid (row tiles × column programs, splits) for n output columns
    (partials: each split's sums to ws[split], no epilogue; spread configs: `column_split`)."""
    m, k = x_q.shape
    out_arg, bf16_bits = triton_quant.store_view(out, runs_interpreted(_w8a8_gemm_kernel))
    pdl = triton_quant.use_pdl(_w8a8_gemm_kernel, x_q.device, m)
    cols, column_programs = column_split(n, cfg, num_sms(x_q.device))
    launch_kernel(_w8a8_gemm_kernel, (_cdiv(m, cfg.block_m) * column_programs, split),
        x_q, w_q, s_x, s_w, bias if bias is not None else s_w, out_arg, ws, tickets, amax,
        m, n, k, x_q.stride(0), w_q.stride(0), out.stride(0), k_per_split, split, cols,
        HAS_BIAS=bias is not None, USE_SPLIT=split > 1 and not partials, EVEN_K=k % cfg.block_k == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, BF16_BITS=bf16_bits,
        PDL=pdl, GLU=glu, PARTIALS=partials, SPREAD=cols != cfg.block_n, launch_pdl=pdl, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, enable_fp_fusion=False)


def _tma_applies(x_q: torch.Tensor, w_q: torch.Tensor) -> bool:
    """TMA descriptors need sm_90+ (or the interpreter), 16-byte aligned bases and row strides."""
    return (tma_available(x_q.device, INTERPRETED)
            and all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in (x_q, w_q)))


def _int8_gemm_tma(x_q, s_x, w_q, s_w, bias, out, amax, n: int, cfg: GemmConfig, glu: bool) -> None:
    """`_w8a8_gemm_tma_kernel`: one program per SM over the output tiles of n columns."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x_q.shape
    interp = runs_interpreted(_w8a8_gemm_tma_kernel)
    x_desc = TensorDescriptor(x_q, [m, k], [x_q.stride(0), 1], [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor(w_q, [w_q.shape[0], k], [w_q.stride(0), 1], [cfg.block_n, cfg.block_k])
    tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
    programs = min(tiles, 4 if interp else num_sms(x_q.device))
    out_arg, bf16_bits = triton_quant.store_view(out, interp)
    launch_kernel(_w8a8_gemm_tma_kernel, (programs,),
        x_desc, w_desc, s_x, s_w, bias if bias is not None else s_w, out_arg, amax, m, n, k, out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, NUM_PROGRAMS=programs, FLATTEN=cfg.persistent >= 2, WARP_SPEC=cfg.persistent == 3,
        BF16_BITS=bf16_bits, GLU=glu,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False)


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                spec: QuantSpec, config: GemmConfig | None = None) -> torch.Tensor:
    """Fused per-token quant + W8A8 GEMM; bit-identical to `quant.w8a8_linear(x, w_q, s_w, bias, spec)`."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    x_q, s_x = triton_quant.quantize_per_token(x2, spec)
    y = int8_gemm(x_q, s_x, w_q, s_w, bias, x.dtype, config)
    return y.reshape(*shape[:-1], w_q.shape[0])

