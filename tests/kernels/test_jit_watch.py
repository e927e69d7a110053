"""`jit_watch.counting_compiles`: counts through Triton's post-compile hook and keeps the hook that was
there. CPU Triton compiles nothing (the interpreter runs kernels as Python), so these tests call the
installed hook as Triton's `_do_compile` does, with its keyword arguments; the GPU benchmarks are
where it counts real compiles."""
from __future__ import annotations

import pytest

from agentq.kernels import jit_watch

knobs = pytest.importorskip("triton.knobs", reason="Triton with knobs (>= 3.4) needed")


def _fire(name: str) -> None:
    """What Triton's `_do_compile` does after it compiled `name` (the keywords that matter here)."""
    knobs.runtime.jit_post_compile_hook(key=("k",), repr=f"{name}[num_warps=4, num_stages=3](M: i32)",
                                        fn=None, compile={}, is_manual_warmup=False, already_compiled=False)


def test_counts_by_kernel_and_restores_an_empty_hook():
    assert knobs.runtime.jit_post_compile_hook is None
    with jit_watch.counting_compiles() as count:
        _fire("_w8a8_gemm_kernel")
        _fire("_w8a8_gemm_kernel")
        _fire("_rms_norm_kernel")
    assert count.available and count.total == 3
    assert count.by_kernel == {"_w8a8_gemm_kernel": 2, "_rms_norm_kernel": 1}
    assert count.describe() == "3 compiles (_w8a8_gemm_kernel ×2, _rms_norm_kernel)"
    assert knobs.runtime.jit_post_compile_hook is None


def test_the_hook_already_installed_still_sees_every_compile():
    seen = []

    def theirs(**kwargs):
        seen.append(kwargs["repr"].split("[")[0])

    knobs.runtime.jit_post_compile_hook = theirs
    try:
        with jit_watch.counting_compiles() as outer:
            _fire("a")
            with jit_watch.counting_compiles() as inner:
                _fire("b")
            _fire("c")
        assert knobs.runtime.jit_post_compile_hook is theirs
    finally:
        knobs.runtime.jit_post_compile_hook = None
    assert seen == ["a", "b", "c"]
    assert outer.total == 3 and inner.by_kernel == {"b": 1}


def test_a_block_that_raises_puts_the_hook_back():
    with pytest.raises(KeyError), jit_watch.counting_compiles():
        raise KeyError
    assert knobs.runtime.jit_post_compile_hook is None


def test_describe_without_compiles_or_without_triton():
    assert jit_watch.CompileCount(available=True).describe() == "no compiles"
    assert jit_watch.CompileCount(available=False).describe() == "compiles not counted"
    many = jit_watch.CompileCount(available=True)
    many.by_kernel.update({"a": 3, "b": 2, "c": 1, "d": 1})
    assert many.describe(top=2) == "7 compiles (a ×3, b ×2, …)"
