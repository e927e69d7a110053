"""The CPU integer GEMM, dispatched by what is fast on this CPU; every path gives `torch._int_mm`'s bits.

Why: on CPU, `torch._int_mm` runs oneDNN's int8 kernel only where the CPU has AVX-512 VNNI; anywhere
else (every AVX2-only x86: Zen 3, most laptops) it falls back to a scalar loop that is 20–35× slower
than an fp32 matmul of the same shape. Integer products can be computed exactly in float BLAS:

* ``fp32``: int8 codes are exact in fp32, every product |x·w| ≤ 128² = 2¹⁴, so every partial sum of
  up to ``FP32_EXACT_K`` = 2²⁴ / 2¹⁴ = 1024 products is an integer of magnitude ≤ 2²⁴ — exact in
  fp32 whatever order BLAS adds in. K is cut into chunks of at most 1024; each chunk's exact sum is
  converted to int32 and the chunks are added in int32 (as `_int_mm` accumulates).
* ``fp64``: exact for any K below 2⁵³ / 2¹⁴ (one matmul, no chunking; about half fp32's speed).
* ``int_mm``: `torch._int_mm` itself (fast with VNNI).

The path is chosen once per process: `AGENTQ_CPU_INT_GEMM` (or the config key `cpu_int_gemm`, via
`set_path`) names one, or ``auto`` times the three on a probe shape of a decoder's size and keeps
the fastest. Sums that overflow int32 (K > 2¹⁷ of ±128² products) are out of any model's range.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Iterator

import torch

PATHS = ("int_mm", "fp32", "fp64")
ENV_VAR = "AGENTQ_CPU_INT_GEMM"
#: largest K whose every partial sum of int8 products is exact in fp32: 2^24 / 128^2
FP32_EXACT_K = 1024
#: (M, K, N) timed by `auto`: a decode batch through a small decoder's fused gate/up projection
PROBE_SHAPE = (32, 512, 1024)

log = logging.getLogger("agentq.kernels")
_chosen: dict[str, object] = {}


def int_mm(x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """X_q[M,K] · W_q[N,K]ᵀ via torch._int_mm (the [N,K] row-major weight's .t() view: 4× faster
    than a contiguous [K,N] on the VNNI path)."""
    return torch._int_mm(x_q, w_q.t())


def _fp32_exact_ok(k: int) -> bool:
    return k <= FP32_EXACT_K and torch.get_float32_matmul_precision() == "highest"


def float_exact(x_q: torch.Tensor, w_q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """X_q · W_qᵀ → int32 through a float matmul: exact for fp64 (one matmul) and fp32 (K in chunks
    of `FP32_EXACT_K`, chunk sums added in int32). Needs full-precision fp32 matmul (no TF32/bf16
    shortcuts: `torch.get_float32_matmul_precision() == "highest"`), else fp64 is used."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        dtype = torch.float64
    k = x_q.shape[1]
    step = FP32_EXACT_K if dtype == torch.float32 else k
    acc = None
    for s in range(0, k, max(step, 1)):
        part = (x_q[:, s:s + step].to(dtype) @ w_q[:, s:s + step].to(dtype).t()).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    return acc if acc is not None else torch.zeros(x_q.shape[0], w_q.shape[0], dtype=torch.int32)


def run_path(path: str, x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """X_q[M,K] int8 · W_q[N,K]ᵀ int8 → int32 [M,N] on the named CPU path (all bit-identical)."""
    if path == "int_mm":
        return int_mm(x_q, w_q)
    if path == "fp32":
        return float_exact(x_q, w_q, torch.float32)
    if path == "fp64":
        return float_exact(x_q, w_q, torch.float64)
    raise ValueError(f"CPU int GEMM path {path!r}; valid: {list(PATHS)}")


def _time_path(path: str, x_q: torch.Tensor, w_q: torch.Tensor, reps: int = 3) -> float:
    run_path(path, x_q, w_q)                                       # warm-up (oneDNN primitive creation)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        run_path(path, x_q, w_q)
        best = min(best, time.perf_counter() - t0)
    return best


def probe(shape: tuple[int, int, int] = PROBE_SHAPE) -> dict[str, float]:
    """Seconds per GEMM of each path on `shape` (best of 3, with the caller's thread count)."""
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    x_q = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w_q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    return {p: _time_path(p, x_q, w_q) for p in PATHS}


def set_path(path: str | None) -> str:
    """Fix this process's CPU int GEMM path: one of `PATHS`, or "auto"/None (the `AGENTQ_CPU_INT_GEMM`
    environment variable if set, else the fastest on `probe()`). Returns the path in use."""
    _chosen.clear()
    requested = (path or "auto").lower()
    if requested == "auto":
        requested = os.environ.get(ENV_VAR, "auto").lower() or "auto"
        source = f"{ENV_VAR}={requested}"
    else:
        source = "cpu_int_gemm"
    if requested == "auto":
        times = probe()
        requested = min(times, key=lambda p: times[p])
        source = "probe " + ", ".join(f"{p} {1e3 * t:.2f} ms" for p, t in times.items())
        _chosen["probe_ms"] = {p: 1e3 * t for p, t in times.items()}
    if requested not in PATHS:
        raise ValueError(f"CPU int GEMM path {requested!r} (from {source}); valid: {['auto', *PATHS]}")
    _chosen.update(path=requested, source=source)
    log.info("CPU int8 GEMM path: %s (%s; torch CPU capability %s)", requested, source, cpu_capability())
    return requested


def configure(path: str | None) -> str:
    """`set_path(path)` unless this process already resolved the same request (a run calls this from
    SFT, RL and eval alike; the probe runs once). Returns the path in use."""
    request = (path or "auto").lower()
    if _chosen.get("request") != request:
        set_path(request)
        _chosen["request"] = request
    return str(_chosen["path"])


@contextlib.contextmanager
def use_path(path: str) -> Iterator[str]:
    """Run a block on `path` (one of `PATHS`), then restore the process's previous choice."""
    saved = dict(_chosen)
    set_path(path)
    try:
        yield path
    finally:
        _chosen.clear()
        _chosen.update(saved)


def is_configured() -> bool:
    return "path" in _chosen


def current_path() -> str:
    """The path in use; chosen on first call (see `set_path`)."""
    if "path" not in _chosen:
        set_path(None)
    return str(_chosen["path"])


def cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


def describe() -> dict:
    """{"path", "source", "cpu_capability", "onednn_int8", ["probe_ms"]}: what runs and why (for
    logs and benchmarks). onednn_int8: whether `_int_mm` can take oneDNN's fast kernel here (torch
    uses it only with oneDNN enabled on a CPU with AVX-512 VNNI)."""
    current_path()
    out = {k: v for k, v in _chosen.items() if k != "request"}
    return {**out, "cpu_capability": cpu_capability(), "onednn_int8": _has_vnni() and torch.backends.mkldnn.enabled}


def _has_vnni() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx512_vnni" in line.split() for line in f)
    except OSError:
        return False


def weight_code_dtype(device: torch.device | str, compute_dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype to hold int8 weight codes in: fp32 for fp32 compute on a CPU whose path is
    ``fp32`` (the codes are small integers, exact in fp32, and that path would otherwise cast every
    int8 weight to fp32 at every call: the largest cost of quantized rollouts on such a CPU), else
    int8 (half-precision compute may run the Triton kernels, which take int8 codes). The torch
    path takes either (`int8_matmul_as_float`); only the memory and the casts differ."""
    fp32_path = torch.device(device).type == "cpu" and compute_dtype == torch.float32 and current_path() == "fp32"
    return torch.float32 if fp32_path else torch.int8


def int8_matmul(x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """X_q[M,K] int8 · W_q[N,K]ᵀ int8 → int32 [M,N] on this process's CPU path."""
    return run_path(current_path(), x_q, w_q)


def int8_matmul_as_float(x_c: torch.Tensor, w_c: torch.Tensor) -> torch.Tensor:
    """`int8_matmul(x_c, w_c).float()` bit for bit, from int8 codes or the same codes held in fp32.

    On the fp32 path with K ≤ `FP32_EXACT_K` this is one fp32 matmul and nothing else: its sums are
    exact integers ≤ 2²⁴, the values the int32 → fp32 cast gives; fp32 codes also skip the int8 →
    fp32 casts. (The casts are the learner's largest cost after the GEMM itself.)"""
    path = current_path()
    if path == "fp32" and _fp32_exact_ok(x_c.shape[1]):
        return (x_c.float() @ w_c.float().t()).add_(0.0)     # + 0: a -0.0 sum becomes the cast's +0.0
    if path == "int_mm":
        return int_mm(x_c.to(torch.int8), w_c.to(torch.int8)).float()
    return run_path(path, x_c, w_c).float()
