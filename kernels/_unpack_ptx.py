"""The PTX that turns int8 KV-cache codes into exact fp16 values, one text for both decode attentions.

fp16 bits 0x64XX are the value 1024 + XX. With XX = code ^ 0x80 (the code's byte with its sign bit
flipped) that is 1152 + code, so one XOR a word of four codes, one PRMT a pair of codes (each byte
placed under a 0x64 byte) and one packed fp16 subtraction of (1152, 1152) give two codes exactly.

`word_to_halves`: one word → two fp16x2 registers, codes (0, 1) and (2, 3).
`words_to_planes`: two words → four fp16x2 registers, register j holding byte j of both words (how the
MMA operands pair positions), two PRMTs fewer than unpacking each word and re-pairing the halves.

Both return instruction lines over operand names the caller picks (Triton's `inline_asm_elementwise`
writes `$0`, CUDA C++'s asm `%0`) and scratch registers named in `SCRATCH`; `asm_block` wraps them.
`tests/kernels/test_unpack_ptx.py` runs the lines through a small PTX emulator for all 256 codes.
"""
from __future__ import annotations

FLIP_SIGNS = "0x80808080"
HIGH_BYTES = "0x64646464"
BIAS_1152 = "0x64806480"            # fp16x2 (1152, 1152)
LOW_PAIR, HIGH_PAIR = "0x5140", "0x7362"   # PRMT selectors: bytes 0, 1 / 2, 3 of the first operand,
                                           # each under a byte of the second
SCRATCH = ("t0", "t1", "lo", "hi", "m")


def word_to_halves(word: str, lo: str, hi: str) -> list[str]:
    """PTX lines unpacking the 4 codes of `word` into fp16x2 `lo` (codes 0, 1) and `hi` (codes 2, 3).

    Args:
        word: the b32 operand holding four int8 codes, byte 0 first.
        lo, hi: the b32 registers or operands written (may not be `t0` or `m`).
    Returns:
        The instruction lines (scratch: t0, m).
    """
    return [f"xor.b32 t0, {word}, {FLIP_SIGNS};",
            f"prmt.b32 {lo}, t0, {HIGH_BYTES}, {LOW_PAIR};",
            f"prmt.b32 {hi}, t0, {HIGH_BYTES}, {HIGH_PAIR};",
            f"mov.b32 m, {BIAS_1152};",
            f"sub.f16x2 {lo}, {lo}, m;",
            f"sub.f16x2 {hi}, {hi}, m;"]


def words_to_planes(word0: str, word1: str, planes: tuple[str, str, str, str]) -> list[str]:
    """PTX lines unpacking two words into four fp16x2 planes: planes[j] = (byte j of word0, of word1).

    Args:
        word0, word1: b32 operands of four int8 codes each (two positions' codes, byte 0 first).
        planes: the four b32 registers or operands written.
    Returns:
        The instruction lines (scratch: t0, t1, lo, hi, m).
    """
    d0, d1, d2, d3 = planes
    return [f"xor.b32 t0, {word0}, {FLIP_SIGNS};",
            f"xor.b32 t1, {word1}, {FLIP_SIGNS};",
            f"prmt.b32 lo, t0, t1, {LOW_PAIR};",
            f"prmt.b32 hi, t0, t1, {HIGH_PAIR};",
            f"prmt.b32 {d0}, lo, {HIGH_BYTES}, {LOW_PAIR};",
            f"prmt.b32 {d1}, lo, {HIGH_BYTES}, {HIGH_PAIR};",
            f"prmt.b32 {d2}, hi, {HIGH_BYTES}, {LOW_PAIR};",
            f"prmt.b32 {d3}, hi, {HIGH_BYTES}, {HIGH_PAIR};",
            f"mov.b32 m, {BIAS_1152};",
            *(f"sub.f16x2 {d}, {d}, m;" for d in planes)]


def asm_block(lines: list[str], extra_regs: tuple[str, ...] = ()) -> str:
    """`lines` as one scoped PTX block declaring the scratch registers (and `extra_regs`) as b32."""
    regs = ", ".join((*SCRATCH, *extra_regs))
    return "{\n.reg .b32 " + regs + ";\n" + "\n".join(lines) + "\n}"
