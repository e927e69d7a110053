#!/usr/bin/env python3
"""Compile an agentq Triton kernel for the H200 (sm_90) on any machine and count the instructions
of its main loop: how much work one iteration issues, without a GPU.

`triton.compile` with a CUDA target runs the whole pipeline to a cubin (Triton's bundled ptxas), and
its disassembler gives the SASS. The main loop is taken as the smallest backward-branch loop with
the most tensor-core instructions (HMMA / HGMMA / IMMA), so the wait loops around TMA barriers are
not counted as the body.

    python -m agentq.eval.sass_loop --attn                 # int8 decode attention (TMA word tiles)
    python -m agentq.eval.sass_loop --attn --pairs         # ... unpacking two words per asm call
    python -m agentq.eval.sass_loop --attn --no-tma        # ... pointer loads
    python -m agentq.eval.sass_loop --codes                # the GLU codes (no loop): instructions an element

Needs triton (the CPU wheel is enough); `tests/kernels/test_compile_sm90.py` uses `compile_sm90`.
"""
from __future__ import annotations

import argparse
import collections
import re
from typing import Any, Sequence

from agentq.kernels import _interp

MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_gemm", "agentq.kernels.triton_attention",
           "agentq.kernels.triton_norm", "agentq.kernels.triton_sample", "agentq.kernels.triton_logprob",
           "agentq.kernels.triton_prefill")
MMA = ("HMMA", "HGMMA", "IMMA", "IGMMA")


def compile_sm90(module: str, name: str, ptrs: dict[str, str], floats: set[str], consts: dict[str, Any],
                 warps: int, stages: int, aligned: Sequence[str] = ()) -> Any:
    """`triton.compile` of `agentq.kernels.<module>.<name>` for sm_90.

    Args:
        ptrs: pointer / descriptor types by argument ("*bf16", "tensordesc<i8[64,128]>", ...);
            floats: the fp32 scalar arguments; any other argument not in `consts` is an i32.
        consts: the constexpr values ("fp16" / "bf16" strings become Triton dtypes).
        aligned: integer / pointer arguments specialized as divisible by 16 (as the JIT does).
    Returns:
        the compiled kernel (`.asm["cubin"]`, `.asm["ttgir"]`, `.metadata`)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mods = dict(zip((m.rsplit(".", 1)[1] for m in MODULES), _interp.load_compiled(MODULES)))
    kernel = getattr(mods[module], name)
    assert not _interp.runs_interpreted(kernel)
    names = kernel.arg_names
    unknown = set(ptrs) | floats | set(consts) | set(aligned)
    assert unknown <= set(names), unknown - set(names)
    signature = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in floats else "i32") for n in names}
    dtypes = {"fp16": tl.float16, "bf16": tl.bfloat16}
    values = {k: dtypes.get(v, v) if isinstance(v, str) else v for k, v in consts.items()}
    src = ASTSource(fn=kernel, signature=signature, constexprs={(names.index(k),): v for k, v in values.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def sass_of(compiled: Any) -> str:
    from triton.tools.disasm import get_sass
    return compiled.asm.get("sass") or get_sass(compiled.asm["cubin"])


def _opcode(line: str) -> str | None:
    """The opcode of a SASS instruction line (after its predicate, if any); None for labels."""
    if "\t" not in line:
        return None
    toks = line.split("\t", 1)[1].strip().split()
    return toks[1] if toks[0].startswith("@") and len(toks) > 1 else toks[0]


def main_loop_opcodes(sass: str) -> collections.Counter:
    """Opcode counts of the kernel's main loop (see the module docstring); empty when it has none."""
    lines = sass.splitlines()
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if "\t" not in line}
    best: tuple[int, int, collections.Counter] | None = None
    for i, line in enumerate(lines):
        m = re.search(r"BRA (\w+)", line)
        start = labels.get(m.group(1), i) if m else i
        if start >= i:
            continue
        ops = collections.Counter(op for op in map(_opcode, lines[start:i + 1]) if op)
        mma = sum(v for k, v in ops.items() if k.split(".")[0] in MMA)
        key = (mma, -sum(ops.values()))
        if best is None or key > best[:2]:
            best = (*key, ops)
    return best[2] if best else collections.Counter()


def attention_case(tma: bool, pairs: bool) -> tuple:
    """`_decode_planes_kernel` as the engine launches it for Qwen3-8B heads (GQA 4:1, D 128, int8
    cache, bf16 out, 64-token tiles, 2 warps, one split)."""
    ptrs = {"q_ptr": "*fp16", "k_ptr": "*i32", "v_ptr": "*i32", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
            "slot_ptr": "*i32", "lens_ptr": "*i32", "o_ptr": "*bf16", "po_ptr": "*fp32", "plse_ptr": "*fp32"}
    if tma:
        ptrs |= {"k_desc": "tensordesc<i32[64,32]>", "v_desc": "tensordesc<i32[64,32]>"}
    consts = {"GROUP": 4, "BLOCK_G": 16, "HEAD_D": 128, "BLOCK_N": 64, "SPLIT": False, "DOT_DTYPE": "fp16",
              "INPUT_PREC": "tf32", "ASM_I8": 2 if pairs else 1, "BF16_BITS": False, "PDL": True, "TMA": tma}
    return "triton_attention", "_decode_planes_kernel", ptrs, {"qk_scale"}, consts, 2, 4 if tma else 3


def straight_opcodes(sass: str) -> collections.Counter:
    """Opcode counts from the kernel's entry to its first EXIT: the path a loop-free kernel runs
    (subroutines after it, e.g. a division's slow path, are not counted)."""
    ops: collections.Counter = collections.Counter()
    for op in map(_opcode, sass.splitlines()):
        if op:
            ops[op] += 1
            if op.startswith("EXIT"):
                break
    return ops


def codes_case() -> tuple:
    """`_quant_rows_amax_kernel` as the engine launches it at prefill rows (the GLU codes: 2 rows
    × 2,048 columns a program, 8 warps: 16 elements a thread)."""
    ptrs = {"x_ptr": "*bf16", "amax_ptr": "*fp32", "q_ptr": "*i8", "s_ptr": "*fp32"}
    consts = {"HALF_AWAY": False, "BLOCK_M": 2, "BLOCK_K": 2048, "BLOCK_P": 128, "PDL": True}
    aligned = ("x_ptr", "amax_ptr", "q_ptr", "s_ptr", "K", "P", "stride_x", "stride_q")    # as the JIT sees them
    return "triton_quant", "_quant_rows_amax_kernel", ptrs, {"floor"}, consts, 8, 3, aligned


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn", action="store_true", help="the int8 decode attention kernel (the only case so far)")
    ap.add_argument("--no-tma", action="store_true", help="--attn: pointer loads instead of TMA word tiles")
    ap.add_argument("--pairs", action="store_true", help="--attn: two words per unpacking asm call")
    ap.add_argument("--codes", action="store_true", help="the GLU codes kernel at prefill rows (loop-free)")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    if a.codes:
        case = codes_case()
        ops = straight_opcodes(sass_of(compile_sm90(*case)))
        per_thread = case[4]["BLOCK_M"] * case[4]["BLOCK_K"] // (32 * case[5])
        print(f"{case[1]} {case[4]}\n{sum(ops.values())} instructions per thread to EXIT, "
              f"{per_thread} elements a thread: {sum(ops.values()) / per_thread:.1f} an element")
        for op, n in ops.most_common(a.top):
            print(f"  {n:5d}  {op}")
        return
    if not a.attn:
        ap.error("name a kernel (--attn or --codes)")
    case = attention_case(not a.no_tma, a.pairs)
    ops = main_loop_opcodes(sass_of(compile_sm90(*case)))
    mma = sum(v for k, v in ops.items() if k.split(".")[0] in MMA)
    print(f"{case[1]} {case[4]}\nmain loop: {sum(ops.values())} instructions per warp per iteration, {mma} MMA")
    for op, n in ops.most_common(a.top):
        print(f"  {n:5d}  {op}")


if __name__ == "__main__":
    main()
