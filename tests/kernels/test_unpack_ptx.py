"""The int8 → fp16 unpacking PTX that both decode attentions run, executed by a small emulator of its
four instructions (PTX ISA semantics), so CPU CI checks the arithmetic, not only that it compiles."""
import numpy as np
import pytest

from agentq.kernels import _unpack_ptx


def _f16x2(bits: int) -> tuple[float, float]:
    halves = np.array([bits & 0xFFFF, bits >> 16], dtype=np.uint16).view(np.float16)
    return float(halves[0]), float(halves[1])


def _run(lines: list[str], regs: dict[str, int]) -> dict[str, int]:
    """Execute xor.b32 / prmt.b32 (default mode) / mov.b32 / sub.f16x2 lines over 32-bit registers."""
    def val(x: str) -> int:
        return int(x, 16) if x.startswith("0x") else regs[x]

    for line in lines:
        op, args = line.rstrip(";").split(" ", 1)
        d, *src = [a.strip() for a in args.split(",")]
        if op == "xor.b32":
            regs[d] = val(src[0]) ^ val(src[1])
        elif op == "mov.b32":
            regs[d] = val(src[0])
        elif op == "prmt.b32":
            pool = val(src[0]) | (val(src[1]) << 32)       # bytes 0-3 from a, 4-7 from b
            sel = val(src[2])
            regs[d] = sum(((pool >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        elif op == "sub.f16x2":
            a = np.array([val(src[0]) & 0xFFFF, val(src[0]) >> 16], dtype=np.uint16).view(np.float16)
            b = np.array([val(src[1]) & 0xFFFF, val(src[1]) >> 16], dtype=np.uint16).view(np.float16)
            r = (a - b).view(np.uint16)
            regs[d] = int(r[0]) | (int(r[1]) << 16)
        else:
            raise AssertionError(f"the emulator does not know {op}")
    return regs


def _words(seed: int) -> list[int]:
    """All 256 codes once, shuffled, as 64 little-endian words."""
    codes = np.random.default_rng(seed).permutation(np.arange(-128, 128)).astype(np.int8)
    return [int(w) for w in codes.view(np.uint32)]


def _bytes(word: int) -> list[int]:
    return [int(b) for b in np.array([word], dtype=np.uint32).view(np.int8)]


def test_word_to_halves_gives_every_code_exactly():
    lines = _unpack_ptx.word_to_halves("w", "lo", "hi")
    for word in _words(0):
        regs = _run(lines, {"w": word})
        assert _f16x2(regs["lo"]) + _f16x2(regs["hi"]) == tuple(float(c) for c in _bytes(word))


def test_words_to_planes_pairs_byte_j_of_both_words():
    lines = _unpack_ptx.words_to_planes("a", "b", ("d0", "d1", "d2", "d3"))
    words = _words(1)
    for a, b in zip(words[::2], words[1::2]):
        regs = _run(lines, {"a": a, "b": b})
        for j in range(4):
            assert _f16x2(regs[f"d{j}"]) == (_bytes(a)[j], _bytes(b)[j])


@pytest.mark.parametrize("mutate", [("0x64806480", "0x64006400"), ("0x5140", "0x5041"), ("0x80808080", "0x00000000")])
def test_the_emulator_catches_a_wrong_constant(mutate):
    """Each constant matters: a wrong bias, selector or sign flip gives other values."""
    lines = [line.replace(*mutate) for line in _unpack_ptx.word_to_halves("w", "lo", "hi")]
    wrong = 0
    for word in _words(2):
        regs = _run(lines, {"w": word})
        wrong += _f16x2(regs["lo"]) + _f16x2(regs["hi"]) != tuple(float(c) for c in _bytes(word))
    assert wrong > 0


def test_both_kernels_carry_the_same_lines():
    """cuda_attention's source and triton_attention's asm strings are built from these lines."""
    from agentq.kernels import cuda_attention, triton_attention

    for line in _unpack_ptx.word_to_halves("%2", "%0", "%1") + _unpack_ptx.words_to_planes(
            "%4", "%5", ("%0", "%1", "%2", "%3")):
        assert f'"{line}\\n\\t"' in cuda_attention.SOURCE
    if triton_attention.HAVE_TRITON:
        for line in _unpack_ptx.word_to_halves("$4", "lo", "hi"):
            assert line in triton_attention._WORD_ASM.value.splitlines()
        for line in _unpack_ptx.words_to_planes("$4", "$5", ("$0", "$1", "$2", "$3")):
            assert line in triton_attention._PAIR_ASM.value.splitlines()
