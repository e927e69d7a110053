"""Counting Triton's JIT compiles, so that a benchmark can tell a timed step that compiled a kernel
from one that did not.

Triton compiles a kernel once per *specialization* (argument dtypes, 16-byte alignment, an integer
argument being 1 or a multiple of 16, the constexprs), so a step whose shapes land in a class not
seen before compiles again, warm-up or not: a pack of 20,479 tokens after one of 20,480, say. Such a
step's time holds the compile (0.1 s to seconds each), which a user's long run pays once but a
two-step benchmark reports as the step's cost. `counting_compiles()` counts them through Triton's
`knobs.runtime.jit_post_compile_hook`, which Triton calls after each in-memory cache miss (a compile,
or a load from Triton's on-disk cache), and hands the hook already installed its calls as before.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any, Iterator

from agentq.kernels._interp import HAVE_TRITON


@dataclasses.dataclass
class CompileCount:
    """The compiles seen inside one `counting_compiles()` block.

    Attributes:
        available: False where Triton (or its compile hook, Triton < 3.4) is missing: nothing is
            counted, and `total` 0 means "unknown", not "none".
        by_kernel: kernel name -> compiles.
    """
    available: bool
    by_kernel: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return sum(self.by_kernel.values())

    def describe(self, top: int = 3) -> str:
        """One short phrase: "no compiles", "3 compiles (a ×2, b)" or "compiles not counted"."""
        if not self.available:
            return "compiles not counted"
        if not self.total:
            return "no compiles"
        names = ", ".join(n if c == 1 else f"{n} ×{c}" for n, c in self.by_kernel.most_common(top))
        more = ", …" if len(self.by_kernel) > top else ""
        return f"{self.total} compile{'s' if self.total != 1 else ''} ({names}{more})"


def _runtime_knobs() -> Any | None:
    if not HAVE_TRITON:
        return None
    try:
        from triton import knobs
    except ImportError:     # Triton < 3.4: no knobs module
        return None
    return knobs.runtime if hasattr(knobs.runtime, "jit_post_compile_hook") else None


def _kernel_name(kwargs: dict) -> str:
    """The kernel's function name from the hook's `repr` ("name[num_warps=…](args)")."""
    return str(kwargs.get("repr", "?")).split("[", 1)[0] or "?"


@contextlib.contextmanager
def counting_compiles() -> Iterator[CompileCount]:
    """Count Triton's compiles in this block (all threads; blocks do not nest usefully).

    Yields:
        A `CompileCount`, filled as compiles happen and final when the block ends.
    """
    runtime = _runtime_knobs()
    count = CompileCount(available=runtime is not None)
    if runtime is None:
        yield count
        return
    before = runtime.jit_post_compile_hook

    def hook(*args: Any, **kwargs: Any) -> Any:
        count.by_kernel[_kernel_name(kwargs)] += 1
        return before(*args, **kwargs) if before is not None else None

    runtime.jit_post_compile_hook = hook
    try:
        yield count
    finally:
        runtime.jit_post_compile_hook = before


__all__ = ["CompileCount", "counting_compiles"]
