"""Every Triton kernel compiles for the H200 (sm_90) on this CPU machine.

The interpreter tests check what the kernels compute, not that they compile: a kernel can pass
them and still fail in the compiler (shapes the interpreter broadcasts, constexpr branches it never
lowers). `triton.compile` with a CUDA target runs the whole pipeline to a cubin (Triton's bundled
ptxas) without a GPU, so CI catches that before a GPU run does. The Triton here may be newer
than the GPU machine's; the compiled tests in `test_triton_cuda.py` & co. stay the final word.

Arguments not named in a case are 32-bit integers (sizes, strides); pointers and floats are named.
"""
import re

import pytest

from agentq.kernels import _interp

pytestmark = pytest.mark.skipif(not _interp.HAVE_TRITON, reason="triton is not installed")
BWD_PTRS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "gy_ptr": "*bf16", "dx_ptr": "*bf16", "dwp_ptr": "*fp32"}
NORM_PTRS = {"x_ptr": "*bf16", "d_ptr": "*bf16", "w_ptr": "*bf16", "s_ptr": "*bf16", "o_ptr": "*bf16",
             "q_ptr": "*i8", "qs_ptr": "*fp32", "psx_ptr": "*fp32", "psw_ptr": "*fp32", "pb_ptr": "*bf16"}


def _cases():
    """(module, kernel, pointer dtypes by arg, float args, constexprs, num_warps, num_stages)."""
    q8 = {"x_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*fp32"}
    attn_ptrs = {"q_ptr": "*fp16", "k_ptr": "*i32", "v_ptr": "*i32", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
                 "slot_ptr": "*i32", "lens_ptr": "*i32", "o_ptr": "*bf16", "po_ptr": "*fp32", "plse_ptr": "*fp32"}
    attn = {"GROUP": 4, "BLOCK_G": 16, "HEAD_D": 128, "BLOCK_N": 128, "DOT_DTYPE": "fp16", "INPUT_PREC": "tf32",
            "ASM_I8": True, "BF16_BITS": False}
    rope_io = {p: "*bf16" for p in ("q_ptr", "k_ptr", "v_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "oq_ptr",
                                    "ok_ptr")}
    return [
        ("triton_quant", "_quant_rows_kernel", {**q8, "cs_ptr": "*fp32"}, {"floor"},
         {"HALF_AWAY": False, "BLOCK_K": 4096, "SINGLE_PASS": True, "PDL": True, "COL_SCALE": False}, 16, 3),
        ("triton_quant", "_quant_rows_kernel", {**q8, "cs_ptr": "*fp32"}, {"floor"},       # the int8 dX's dY · s_w
         {"HALF_AWAY": False, "BLOCK_K": 4096, "SINGLE_PASS": True, "PDL": False, "COL_SCALE": True}, 8, 3),
        ("triton_quant", "_quant_rows_kernel", {**q8, "cs_ptr": "*fp32"}, {"floor"},
         {"HALF_AWAY": False, "BLOCK_K": 4096, "SINGLE_PASS": False, "PDL": False, "COL_SCALE": True}, 8, 3),
        *(("triton_quant", "_quant_row_chunks_kernel", {**q8, "cs_ptr": "*fp32"}, {"floor"},   # dY · s_w in row tiles
           {"HALF_AWAY": False, "COL_SCALE": cs, "BLOCK_M": 4, "BLOCK_K": 1024}, 4, 3) for cs in (True, False)),
        ("triton_quant", "_quant_row_tiles_kernel", {**q8, "o_ptr": "*bf16"}, {"floor"},
         {"HALF_AWAY": False, "DEQUANT": False, "BF16_BITS": False, "BLOCK_M": 32, "BLOCK_K": 128}, 4, 3),
        ("triton_quant", "_quant_row_tiles_kernel", {"x_ptr": "*bf16", "q_ptr": "*bf16", "s_ptr": "*bf16",
                                                     "o_ptr": "*bf16"}, {"floor"},
         {"HALF_AWAY": True, "DEQUANT": True, "BF16_BITS": False, "BLOCK_M": 32, "BLOCK_K": 128}, 4, 3),
        ("triton_quant", "_dequant_rows_kernel", {"q_ptr": "*i8", "s_ptr": "*fp32", "o_ptr": "*bf16"}, set(),
         {"BF16_BITS": False, "BLOCK_M": 4, "BLOCK_K": 1024}, 4, 3),
        ("triton_quant", "_quant_kv_cache_kernel", {"x_ptr": "*bf16", "slot_ptr": "*i32", "pos_ptr": "*i32",
                                                    "c_ptr": "*i8", "cs_ptr": "*fp32"}, {"floor"},
         {"HALF_AWAY": False, "BLOCK_D": 128}, 1, 3),
        *(("triton_gemm", "_w8a8_gemm_kernel", {"xq_ptr": "*i8", "w_ptr": "*i8", "sx_ptr": "*fp32", "sw_ptr": "*fp32",
                                                "bias_ptr": "*fp32", "out_ptr": "*bf16", "ws_ptr": "*i32",
                                                "ticket_ptr": "*i32", "amax_ptr": "*fp32"}, set(),
           {"HAS_BIAS": glu, "USE_SPLIT": False, "EVEN_K": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128,
            "GROUP_M": 8, "BF16_BITS": False, "PDL": True, "GLU": glu, "PARTIALS": parts, "SPREAD": spread},
           8 if bm > 64 or bn > 128 else 4, 3)
          for bm, bn, glu, parts, spread in ((128, 128, False, False, False), (64, 64, True, False, False),
                                             (64, 128, False, True, False), (64, 256, True, False, True),
                                             (64, 64, False, False, True))),
        *(("triton_gemm", "_w8a8_gemm_tma_kernel", {"x_desc": f"tensordesc<i8[{bm},128]>",
                                                    "w_desc": "tensordesc<i8[128,128]>", "sx_ptr": "*fp32",
                                                    "sw_ptr": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*bf16",
                                                    "amax_ptr": "*fp32"}, set(),
           {"HAS_BIAS": False, "BLOCK_M": bm, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "NUM_PROGRAMS": 132,
            "FLATTEN": True, "WARP_SPEC": False, "BF16_BITS": False, "GLU": glu}, 8, 3)
          for bm, glu in ((256, False), (128, True))),
        ("triton_quant", "_quant_rows_amax_kernel", {"x_ptr": "*bf16", "amax_ptr": "*fp32", "q_ptr": "*i8",
                                                     "s_ptr": "*fp32"}, {"floor"},
         {"HALF_AWAY": False, "BLOCK_M": 2, "BLOCK_K": 2048, "BLOCK_P": 128, "PDL": True}, 8, 3),
        ("triton_attention", "_decode_kernel", attn_ptrs, {"qk_scale"},
         {**attn, "BLOCK_D": 128, "SCALE_MODE": 1, "SPLIT": False, "PV_DTYPE": "fp16", "EVEN_D": True, "K_AS_A": False,
          "WORDS": True, "PDL": False}, 4, 3),
        ("triton_attention", "_decode_planes_kernel", attn_ptrs, {"qk_scale"},
         {**attn, "SPLIT": True, "PDL": True, "TMA": False}, 4, 3),
        *(("triton_attention", "_decode_planes_kernel", {**attn_ptrs, "k_desc": "tensordesc<i32[64,32]>",
                                                         "v_desc": "tensordesc<i32[64,32]>"}, {"qk_scale"},
           {**attn, "BLOCK_N": 64, "SPLIT": False, "PDL": True, "TMA": True, "ASM_I8": asm}, 2, 4)
          for asm in (1, 2)),
        ("triton_attention", "_combine_kernel", {"po_ptr": "*fp32", "plse_ptr": "*fp32", "o_ptr": "*bf16"}, set(),
         {"HEAD_D": 128, "BLOCK_D": 128, "BLOCK_S": 4, "BF16_BITS": False, "PDL": True}, 4, 3),
        ("triton_norm", "_rms_norm_kernel", {"x_ptr": "*bf16", "w_ptr": "*bf16", "o_ptr": "*bf16"}, {"eps"},
         {"BLOCK": 4096, "BF16_BITS": False}, 16, 3),
        ("triton_norm", "_rms_norm_rows_kernel", {"x_ptr": "*bf16", "w_ptr": "*bf16", "o_ptr": "*bf16"}, {"eps"},
         {"ROWS": 16, "BLOCK": 128, "BF16_BITS": False}, 16, 3),
        ("triton_norm", "_rms_norm_bwd_kernel", BWD_PTRS, {"eps"},
         {"ROWS": 2, "BLOCK": 2048, "STAGES": 2, "BF16_BITS": False}, 8, 3),
        ("triton_norm", "_rms_norm_bwd_kernel", {**BWD_PTRS, "x_ptr": "*fp16", "w_ptr": "*fp16", "gy_ptr": "*fp16",
                                                 "dx_ptr": "*fp16"}, {"eps"},
         {"ROWS": 32, "BLOCK": 128, "STAGES": 1, "BF16_BITS": False}, 8, 3),
        ("triton_norm", "_silu_mul_kernel", {"g_ptr": "*bf16", "u_ptr": "*bf16", "o_ptr": "*bf16"}, set(),
         {"BLOCK": 1024, "BF16_BITS": False}, 4, 3),
        *(("triton_norm", "_add_rms_norm_kernel", {**NORM_PTRS, "d_ptr": "*i32" if parts else "*bf16"},
           {"eps", "floor"},
           {"HAS_DELTA": True, "QUANT": True, "STORE_NORMED": True, "HALF_AWAY": False, "BLOCK": 4096,
            "BF16_BITS": False, "PDL": True, "PARTIALS": parts, "P_BIAS": parts > 0}, 16, 3)
          for parts in (0, 3)),      # delta as rows, or as a W8A8 linear's partial sums
        ("triton_norm", "_silu_mul_quant_kernel", {"g_ptr": "*bf16", "u_ptr": "*bf16", "q_ptr": "*i8",
                                                   "qs_ptr": "*fp32", "y_ptr": "*bf16"}, {"floor"},
         {"HALF_AWAY": False, "BLOCK": 16384, "BF16_BITS": False, "OUT_DTYPE": "bf16", "STORE_Y": True,
          "PDL": True, "CHUNKED": False}, 32, 3),
        ("triton_norm", "_silu_mul_quant_kernel", {"g_ptr": "*bf16", "u_ptr": "*bf16", "q_ptr": "*i8",
                                                   "qs_ptr": "*fp32", "y_ptr": "*bf16"}, {"floor"},
         {"HALF_AWAY": True, "BLOCK": 2048, "BF16_BITS": False, "OUT_DTYPE": "bf16", "STORE_Y": True,
          "PDL": False, "CHUNKED": True}, 4, 3),
        # qk_norm_rope; decode's K/V write; a prefill chunk's (ragged rows) into an int8 and a bf16 cache;
        # one head per program (decode's launch) and head groups (prefill's), a warp per head
        *(("triton_norm", "_qk_norm_rope_kernel", {**rope_io, "kc_ptr": code, "vc_ptr": code, "ks_ptr": scale,
                                                    "vs_ptr": scale, "slot_ptr": "*i64", "pos_ptr": "*i64",
                                                    "nnew_ptr": "*i32"},
           {"eps", "floor"}, {"NORM": write, "WRITE_KV": write, "RAGGED": ragged, "KV_INT8": code == "*i8",
                              "HALF_AWAY": False, "HEADS": heads, "TOKENS": tokens, "BLOCK_D": 128,
                              "BF16_BITS": False, "PDL": heads == 1}, heads, 3)
          for write, ragged, code, scale, heads, tokens in (
              (False, False, "*i8", "*fp32", 1, 1), (True, False, "*i8", "*fp32", 1, 1),
              (True, True, "*i8", "*fp32", 1, 1), (True, True, "*bf16", "*bf16", 1, 1),
              (False, False, "*i8", "*fp32", 8, 1), (True, True, "*i8", "*fp32", 8, 1),
              (True, True, "*bf16", "*bf16", 8, 1), (True, True, "*i8", "*fp32", 16, 1),
              (True, True, "*i8", "*fp32", 8, 4), (True, True, "*bf16", "*bf16", 8, 4),
              (True, False, "*i8", "*fp32", 2, 2))),
        ("triton_norm", "_rope_heads_kernel", {p: "*bf16" for p in ("q_ptr", "k_ptr", "cos_ptr", "sin_ptr", "oq_ptr",
                                                                     "ok_ptr")},
         set(), {"HB": 8, "BLOCK_D": 128, "BF16_BITS": False}, 4, 3),
        ("triton_sample", "_split_max_sum_kernel", {"logits_ptr": "*fp32", "temp_ptr": "*fp32", "pm_ptr": "*fp32",
                                                    "ps_ptr": "*fp32"}, set(), {"BLOCK_V": 2048, "PDL": True}, 4, 3),
        ("triton_sample", "_row_keys_kernel", {"seeds_ptr": "*i64", "pos_ptr": "*i64", "out_ptr": "*i64"}, set(),
         {"BLOCK": 64}, 1, 3),
        ("triton_sample", "_split_argmax_kernel", {"logits_ptr": "*fp32", "keys_ptr": "*i64", "vkeys_ptr": "*i64",
                                                   "temp_ptr": "*fp32", "pm_ptr": "*fp32", "ps_ptr": "*fp32",
                                                   "pv_ptr": "*fp32", "pi_ptr": "*i32", "norm_ptr": "*fp32"},
         set(), {"GREEDY": False, "BLOCK_V": 2048, "BLOCK_S": 32, "PDL": True}, 4, 3),
        ("triton_sample", "_pick_kernel", {"logits_ptr": "*fp32", "temp_ptr": "*fp32", "pv_ptr": "*fp32",
                                           "pi_ptr": "*i32", "norm_ptr": "*fp32", "tok_ptr": "*i64", "lp_ptr": "*fp32"},
         set(), {"BLOCK_S": 32, "PDL": True}, 1, 3),
        *(("triton_prefill", "_prefill_kernel", {"q_ptr": "*bf16", "k_ptr": code, "v_ptr": code, "ks_ptr": "*fp32",
                                                 "vs_ptr": "*fp32", "slot_ptr": "*i32", "nnew_ptr": "*i32",
                                                 "lens_ptr": "*i32", "o_ptr": "*bf16"}, {"qk_scale"},
           {"GROUP": 4, "BLOCK_G": 4, "BLOCK_T": 16, "BLOCK_N": 64, "HEAD_D": 128, "SCALED": True,
            "DOT_DTYPE": "fp16", "INPUT_PREC": "tf32", "BF16_BITS": False, "WORDS": words, "ASM_I8": words,
            "KV_BY_ROW": by_row}, 4, 2)
          for code, words, by_row in (("*i8", False, False), ("*i32", True, False))),
        ("triton_prefill", "_dequant_copy_kernel", {"k_ptr": "*i8", "v_ptr": "*i8", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
                                                    "slot_ptr": "*i32", "lens_ptr": "*i32", "ok_ptr": "*bf16",
                                                    "ov_ptr": "*bf16"}, set(),
         {"BLOCK_L": 64, "HEAD_D": 128, "BF16_BITS": False}, 4, 3),
        *(("triton_prefill", "_prefill_kernel", {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "ks_ptr": "*bf16",
                                               "vs_ptr": "*bf16", "slot_ptr": "*i32", "nnew_ptr": "*i32",
                                               "lens_ptr": "*i32", "o_ptr": "*bf16"}, {"qk_scale"},
         {"GROUP": 2, "BLOCK_G": 2, "BLOCK_T": 32, "BLOCK_N": 64, "HEAD_D": 128, "SCALED": False,
          "DOT_DTYPE": "bf16", "INPUT_PREC": "tf32", "BF16_BITS": False, "WORDS": False, "ASM_I8": False,
          "KV_BY_ROW": by_row}, 4, 2) for by_row in (False, True)),
        ("triton_logprob", "_logprob_fwd_kernel", {"x_ptr": "*bf16", "tgt_ptr": "*i64", "lp_ptr": "*fp32",
                                                   "lse_ptr": "*fp32"}, {"temperature"},
         {"SCALED": True, "BLOCK": 4096}, 8, 3),
        ("triton_logprob", "_logprob_bwd_kernel", {"x_ptr": "*bf16", "tgt_ptr": "*i64", "lse_ptr": "*fp32",
                                                   "g_ptr": "*fp32", "dx_ptr": "*bf16"}, {"temperature"},
         {"SCALED": True, "BLOCK": 4096, "BF16_BITS": False}, 8, 3),
    ]


def _compile(*case):
    from agentq.eval.sass_loop import compile_sm90      # (the script that counts a kernel's loop)
    return compile_sm90(*case)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[1]}-{len(c[4])}")
def test_kernel_compiles_for_sm90(case):
    compiled = _compile(*case)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert compiled.metadata.shared <= 227 * 1024            # fits an H200 multiprocessor


def _row_layout(compiled, combine: str | None = None) -> dict[str, list[int]]:
    """The blocked layout of the first reduction's operand (a norm's sum of squares; with
    `combine`, e.g. "addf", the first reduction combining with that op) in the compiled kernel's
    TTGIR, keyed by field (sizePerThread, threadsPerWarp, warpsPerCTA, order)."""
    return _row_layouts(compiled, combine)[0]


def _row_layouts(compiled, combine: str | None = None) -> list[dict[str, list[int]]]:
    """`_row_layout` of every such reduction, in the order of the TTGIR (an unrolled loop has one each)."""
    ttgir = compiled.asm["ttgir"]
    body = rf"arith\.{combine} [^\n]*\n\s*tt\.reduce\.return[^\n]*\n\s*" if combine else ""
    operands = re.findall(body + r"\}\) : \(tensor<[0-9x]+xf32, (#\w+)>\)", ttgir)
    assert operands, "no reduction found"
    layouts = []
    for operand in operands:
        layout = re.search(rf"^{operand} = #ttg\.blocked<\{{(.*)\}}>", ttgir, re.M)
        assert layout, f"{operand} is not a blocked layout"
        layouts.append({k: [int(v) for v in vals.split(",")]
                        for k, vals in re.findall(r"(\w+) = \[([\d, ]+)\]", layout.group(1))})
    return layouts


@pytest.mark.parametrize("block", [32, 64, 128, 256, 512, 1024])
def test_multi_row_norm_gives_each_row_the_one_row_layout(block):
    """`rms_norm`'s multi-row launch (aligned rows) puts each row's elements in the threads, lanes
    and warps the one-row kernels use, so its sum of squares adds up in the same order and the
    outputs are the same bits (what `_rms_norm_rows_kernel` promises; the CUDA test checks values)."""
    from agentq.kernels import triton_norm
    ptrs = {"x_ptr": "*bf16", "w_ptr": "*bf16", "o_ptr": "*bf16"}
    aligned = ("x_ptr", "w_ptr", "o_ptr", "N", "stride_x", "stride_o")
    rows = min(16, triton_norm.FWD_ELEMS // block)
    warps = triton_norm._norm_warps(block)
    assert rows > 1 and block <= triton_norm.FWD_MAX_MULTI_ROW
    multi = _row_layout(_compile("triton_norm", "_rms_norm_rows_kernel", ptrs, {"eps"},
                                 {"ROWS": rows, "BLOCK": block, "BF16_BITS": False}, rows * warps, 3, aligned))
    one = _row_layout(_compile("triton_norm", "_rms_norm_kernel", ptrs, {"eps"},
                               {"BLOCK": block, "BF16_BITS": False}, warps, 3, aligned))
    fused = _row_layout(_compile("triton_norm", "_add_rms_norm_kernel", NORM_PTRS, {"eps", "floor"},
                                 {"HAS_DELTA": False, "QUANT": True, "STORE_NORMED": True, "HALF_AWAY": False,
                                  "BLOCK": block, "BF16_BITS": False, "PDL": False, "PARTIALS": 0,
                                  "P_BIAS": False}, warps, 3,
                                 aligned + ("s_ptr", "q_ptr", "stride_s", "stride_q")))
    assert one == fused
    # rows on dim 0, one row's elements along dim 1 exactly as the 1-D kernels hold them
    assert multi["sizePerThread"] == [1] + one["sizePerThread"]
    assert multi["threadsPerWarp"] == [1] + one["threadsPerWarp"]
    assert multi["warpsPerCTA"] == [rows] + one["warpsPerCTA"]


@pytest.mark.parametrize("dtype", ["*bf16", "*fp32"])
@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("heads, tokens", [(2, 1), (8, 1), (16, 1), (8, 4), (8, 8), (1, 4)])
def test_qk_norm_rope_head_groups_give_each_head_the_one_head_layout(dtype, write, heads, tokens):
    """`_qk_norm_rope_kernel` over HEADS heads per program in HEADS warps (its launch on aligned q
    and k, `triton_norm._heads_fit`) holds each head's row in the threads, lanes and single warp
    that the one-head program holds it in, so the norm's sum of squares adds up in the same order
    and every HEADS stores the same bits (the CUDA test in test_triton_norm.py checks values); with
    TOKENS > 1 so does each token's norm. Fewer warps than heads would not: e.g. 8 heads in 4 warps put a row in 16 lanes × 8 elements."""
    ptrs = {**{p: dtype for p in ("q_ptr", "k_ptr", "v_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "oq_ptr",
                                  "ok_ptr")},
            "kc_ptr": "*i8", "vc_ptr": "*i8", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "slot_ptr": "*i64",
            "pos_ptr": "*i64", "nnew_ptr": "*i32"}
    aligned = ("q_ptr", "k_ptr", "D", "sq_b", "sq_t", "sq_h", "sk_b", "sk_t", "sk_h")     # what _heads_fit asks
    consts = {"NORM": True, "WRITE_KV": write, "RAGGED": write, "KV_INT8": True, "HALF_AWAY": False, "BLOCK_D": 128,
              "BF16_BITS": False, "PDL": False}
    one = _row_layout(_compile("triton_norm", "_qk_norm_rope_kernel", ptrs, {"eps", "floor"},
                               {**consts, "HEADS": 1, "TOKENS": 1}, 1, 3, aligned), "addf")
    multi = _row_layouts(_compile("triton_norm", "_qk_norm_rope_kernel", ptrs, {"eps", "floor"},
                                  {**consts, "HEADS": heads, "TOKENS": tokens}, heads, 3, aligned), "addf")
    assert one["threadsPerWarp"] == [1, 32] and one["warpsPerCTA"] == [1, 1]
    assert len(multi) == tokens and all(m == {**one, "warpsPerCTA": [heads, 1]} for m in multi)   # each token's

