"""The learner's straight-through ops: the aligned W8A8 linear and the KV-cache round trip.

Forward values are the engine's (`quant.w8a8_linear`, `quant.kv_roundtrip`) bit for bit; gradients
are straight-through. On CUDA (with Triton) the forward runs the engine's own kernels: the fused
per-token quant (`triton_quant`) and the int8 GEMM (`triton_gemm.int8_gemm`), which are
bit-identical to the torch reference; elsewhere the torch reference runs.

**Weight cache.** `WeightCache` holds one master weight's int8 codes and scales, computed once per
weight version: its key is the tensor's storage pointer and autograd version counter
(`Tensor._version`), which every in-place write bumps — `optimizer.step()`, `load_state_dict`,
`copy_` under `no_grad`. So π_old, π_ref and every micro-batch of a step quantize each weight once,
and the next optimizer step invalidates it with no hook to forget. (Writes through `.data` bypass
the counter: call `invalidate()` after those.) The codes are what the engine computes at a weight
sync (`quantize_weight` of the same tensor), so the cache can feed a sync.

**STE variant (backward).** Y = X_fq · W_fqᵀ + b with X_fq, W_fq the dequantized tensors; the
gradient goes straight through to the full-precision X and W:
  dX = dY · W_fq,   dW = dYᵀ · X_fq,   db = Σ_rows dY.
The backward runs in the compute dtype: fp32 for fp32 models (bit-identical to the previous fp32
backward), bf16/fp16 GEMMs (fp32 accumulation in cuBLAS) for half-precision models, with W_fq
dequantized once per weight version (cached beside the codes, built at the first backward) and
X_fq dequantized from the saved int8 codes (1 byte per activation saved instead of 2), once for the
linears that read the same codes (q/k/v, gate/up: `ActivationCache.dequantized`); on CUDA both
dequantizations run one Triton kernel (`triton_quant.dequantize_rows`, same bits).

**int8 dX (opt-in, `grad_input="int8"`).** dX = (dY · s_w) · W_q with dY · s_w quantized per token
to int8 (SwitchBack-style; dW and db stay in the compute dtype): one int8 GEMM instead of a bf16
one, against the transposed weight codes `WeightCache.transposed()` (once per weight version). Its
error is the gradient rows' int8 rounding, ≈1 % relative (Frobenius) on Gaussian-like rows.
"""
from __future__ import annotations

import torch

from . import cpu_gemm, quant
from ._interp import HAVE_TRITON
from .grad_mode import records_graph
from .quant_spec import QuantSpec


def triton_path(t: torch.Tensor, backend: str | None = None) -> bool:
    """Whether the Triton kernels run for tensor `t`: backend "triton" forces them (e.g. under
    TRITON_INTERPRET=1 on CPU), "torch" forbids them, None = on CUDA when Triton is importable."""
    if backend not in (None, "triton", "torch"):
        raise ValueError(f"backend={backend!r}; valid: None, 'triton', 'torch'")
    if backend is not None:
        return backend == "triton"
    return t.is_cuda and HAVE_TRITON


def quantize_rows(x: torch.Tensor, floor: float, rounding: str, backend: str | None,
                   col_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row int8 codes of x (of x · col_scale per column when given): the Triton kernel where
    `triton_path` says so, else the torch reference (`quant`); the same bits either way."""
    if triton_path(x, backend):
        from . import triton_quant
        return triton_quant.quantize_rows(x.detach(), floor, rounding, col_scale=col_scale)
    if col_scale is not None:
        return quant.quantize_scaled_rows(x, col_scale, floor, rounding)
    return quant.quantize_rows(x, floor, rounding)


def _int8_linear(x_q: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, backend: str | None) -> torch.Tensor:
    if triton_path(x_q, backend):
        from . import triton_gemm
        return triton_gemm.int8_gemm(x_q, s_x, w_q, s_w, bias, out_dtype)
    return quant.w8a8_epilogue(quant.codes_matmul(x_q, w_q), s_x, s_w, bias, out_dtype)


def _tiled_triton(t: torch.Tensor, backend: str | None) -> bool:
    if not triton_path(t, backend):
        return False
    from . import triton_quant
    return triton_quant.tiles_enabled()


def _dequantize_rows(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, backend: str | None) -> torch.Tensor:
    if _tiled_triton(codes, backend):
        from . import triton_quant
        return triton_quant.dequantize_rows(codes, scale, dtype)
    return quant.dequantize_rows(codes, scale, dtype)


#: the STE backward's dX GEMM: "bf16" = dY · W_fq in the compute dtype (fp32 on CPU); "int8" = the
#: per-token int8 codes of dY · s_w times the weight codes (`_int8_grad_input`)
GRAD_INPUTS = ("bf16", "int8")


def check_grad_input(grad_input: str) -> str:
    """`grad_input` itself when it names a dX GEMM (`GRAD_INPUTS`), else a ValueError listing them."""
    if grad_input not in GRAD_INPUTS:
        raise ValueError(f"grad_input={grad_input!r}; valid: {list(GRAD_INPUTS)}")
    return grad_input


def grad_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the STE backward GEMMs: the compute dtype for bf16/fp16, fp32 otherwise."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


class WeightCache:
    """int8 codes + fp32 scales of one master weight (or of several stacked by rows), recomputed
    only when a weight changes.

    `get(w, spec)` returns (w_q, s_w) = `quant.quantize_weight(w)` (bit for bit), from the cache
    when `w` is the same storage at the same version; `get((w1, w2, …), spec)` the same for the
    row-stacked weights (per-channel codes: row for row those of each weight alone).
    `dequantized(dtype)` is W_fq in `dtype`, built once per version (the backward's operand);
    `transposed()` the codes as the int8 dX GEMM's weight, also once per version.

    A *pinned* cache (`pin()`, for CUDA graphs that read its tensors by address) recomputes in
    place: the codes, scales and, where they were built, W_fq and the transposed codes are
    rewritten into the same tensors at the next `get` after a weight changes. (Unpinned caches
    make new tensors, so a backward still pending on old codes keeps them; a pinned cache's
    rewrite of codes saved for such a backward fails autograd's version check instead.)"""

    def __init__(self):
        self.key: tuple | None = None
        self.w_q: torch.Tensor | None = None
        self.s_w: torch.Tensor | None = None
        self._deq: torch.Tensor | None = None
        self._t: tuple[torch.Tensor, torch.Tensor] | None = None
        self.pinned = False
        self.recomputes = 0          # how many times the codes were (re)computed: tests, diagnostics
        self.transposes = 0          # how many times `transposed()` was built: tests

    def get(self, w: torch.Tensor | tuple[torch.Tensor, ...], spec: QuantSpec, backend: str | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        ws = (w,) if isinstance(w, torch.Tensor) else w
        key = (tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in ws), ws[0].dtype, ws[0].device, spec)
        if key != self.key:
            rows = ws[0].detach() if len(ws) == 1 else torch.cat([t.detach() for t in ws])
            w_q, s_w = quantize_rows(rows, spec.weight_scale_floor, spec.weight_rounding, backend)
            if not triton_path(rows, backend):      # fp32 codes on the CPU's fp32 path: cast once, not per call
                w_q = w_q.to(cpu_gemm.weight_code_dtype(w_q.device, rows.dtype))
            if self.pinned and self.w_q is not None:
                self._rewrite(w_q, s_w, backend)
            else:
                self.w_q, self.s_w = w_q, s_w
                self._deq = self._t = None
            self.key = key
            self.recomputes += 1
        assert self.w_q is not None and self.s_w is not None
        return self.w_q, self.s_w

    def dequantized(self, dtype: torch.dtype, backend: str | None = None) -> torch.Tensor:
        if self._deq is None or self._deq.dtype != dtype:
            assert self.w_q is not None and self.s_w is not None, "get() first"
            self._deq = _dequantize_rows(self.w_q, self.s_w, dtype, backend)
        return self._deq

    def transposed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_qᵀ [K, N] int8 contiguous, ones [K] fp32): the weight operand of the int8 dX GEMM
        (its rows are the K input features) and its unit per-row scales."""
        if self._t is None:
            assert self.w_q is not None, "get() first"
            self._t = transposed_codes(self.w_q)
            self.transposes += 1
        return self._t

    def pin(self) -> None:
        """From now on recompute in place (class docstring): a CUDA graph captured over this
        cache's tensors stays valid across weight updates."""
        self.pinned = True

    def _rewrite(self, w_q: torch.Tensor, s_w: torch.Tensor, backend: str | None) -> None:
        assert self.w_q is not None and self.s_w is not None
        if w_q.shape != self.w_q.shape or s_w.shape != self.s_w.shape:
            raise RuntimeError(f"a pinned WeightCache's weight changed shape ({tuple(self.w_q.shape)} -> "
                               f"{tuple(w_q.shape)}): the CUDA graphs reading it would read stale codes")
        self.w_q.copy_(w_q)
        self.s_w.copy_(s_w)
        if self._deq is not None:
            self._deq.copy_(_dequantize_rows(w_q, s_w, self._deq.dtype, backend))
        if self._t is not None:
            self._t[0].copy_(w_q.t())

    def invalidate(self) -> None:
        self.key = None
        if not self.pinned:              # a pinned cache keeps its tensors; the next get rewrites them
            self.w_q = self.s_w = self._deq = self._t = None


def transposed_codes(w_q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`WeightCache.transposed` of codes `w_q` [N, K], uncached."""
    return w_q.t().contiguous(), torch.ones(w_q.shape[1], dtype=torch.float32, device=w_q.device)


class ActivationCache:
    """The int8 codes of the last activation a linear quantized, for linears that read the same
    input tensor: HF calls q/k/v_proj (and gate/up_proj) with one tensor object, so its per-token
    quantization runs once instead of three (two) times, with the same bits.

    Keyed on the tensor object itself (held here, so its storage cannot be reused by another tensor
    while cached) and its version counter (an in-place write invalidates).

    The backward side mirrors it: `dequantized` keeps the last X_fq built from a set of codes, so
    the linears that share them (whose backwards autograd runs one after another) dequantize once.
    `clear()` drops both: after each forward, and after each backward (the learner calls it)."""

    def __init__(self):
        self.x: torch.Tensor | None = None
        self.key: tuple | None = None
        self.codes: tuple[torch.Tensor, torch.Tensor] | None = None
        self.hits = 0                # quantizations saved: tests, diagnostics
        self._deq: tuple[torch.Tensor, torch.Tensor] | None = None    # (codes, X_fq) of the backward
        self.deq_hits = 0            # dequantizations saved in backward

    def get(self, x: torch.Tensor, spec: QuantSpec, backend: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        key = (x._version, spec.act_scale_floor, spec.act_rounding, backend)
        if self.x is x and self.key == key and self.codes is not None:
            self.hits += 1
            return self.codes
        x2 = x.detach().reshape(-1, x.shape[-1])
        codes = quantize_rows(x2, spec.act_scale_floor, spec.act_rounding, backend)
        self.x, self.key, self.codes = x, key, codes
        return codes

    def put(self, x: torch.Tensor, codes: tuple[torch.Tensor, torch.Tensor], floor: float, rounding: str,
            backend: str | None = None) -> None:
        """Record codes computed elsewhere for x (a fused norm / SiLU·mul launch): they must be
        `quantize_rows(x, floor, rounding)` bit for bit; `get` then returns them as its own."""
        k = x.shape[-1]
        self.x, self.key = x, (x._version, floor, rounding, backend)
        self.codes = (codes[0].reshape(-1, k), codes[1].reshape(-1))

    def dequantized(self, x_q: torch.Tensor, s_x: torch.Tensor, dtype: torch.dtype, backend: str | None) -> torch.Tensor:
        """X_fq = dequantize(x_q, s_x) in `dtype`, reused while the same codes ask again (same
        storage and shape: codes are never written in place, and the entry holds them, so their
        storage cannot be reused by other codes while it stands)."""
        held = self._deq
        if (held is not None and held[0].data_ptr() == x_q.data_ptr() and held[0].shape == x_q.shape
                and held[1].dtype == dtype):
            self.deq_hits += 1
            return held[1]
        x_fq = _dequantize_rows(x_q, s_x, dtype, backend)
        self._deq = (x_q, x_fq)
        return x_fq

    def clear(self) -> None:
        self.x = self.key = self.codes = self._deq = None


def _stacked_bias(biases: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    return None if not biases else biases[0] if len(biases) == 1 else torch.cat(biases)


#: arguments of `_W8A8STE.forward` before its weights and biases (x2 … n_weights)
_STE_LEAD_ARGS = 9


def _int8_grad_input(g: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, cache: WeightCache, spec: QuantSpec,
                     out_dtype: torch.dtype, backend: str | None) -> torch.Tensor:
    """dX = dY · W_fq = (dY · s_w[None, :]) · W_q as an int8 GEMM (SwitchBack-style): G' = dY · s_w
    (s_w lies on the reduction axis N, so it goes into G' rather than the epilogue) quantized per
    token (symmetric absmax, the activations' rounding, `quant.GRAD_SCALE_FLOOR`), then G'_q [M, N]
    times W_qᵀ [K, N] with exact int32 sums, scaled by s_g per row and 1 per column."""
    g_q, s_g = quantize_rows(g, quant.GRAD_SCALE_FLOOR, spec.act_rounding, backend, col_scale=s_w)
    w_t, unit = cache.transposed() if cache.w_q is w_q else transposed_codes(w_q)
    return _int8_linear(g_q, s_g, w_t, unit, None, out_dtype, backend)


class _W8A8STE(torch.autograd.Function):
    """Y = [X·W1ᵀ + b1 | X·W2ᵀ + b2 | …] for one or more weights read by the same X, as one W8A8
    GEMM over the row-stacked codes; `params` = the weights, then their biases (all or none)."""

    @staticmethod
    def forward(ctx, x2, spec, cache, backend, x_q, s_x, act_cache, grad_input, n_weights, *params):
        ws = params[:n_weights]
        w_q, s_w = cache.get(ws, spec, backend)
        y = _int8_linear(x_q, s_x, w_q, s_w, _stacked_bias(params[n_weights:]), x2.dtype, backend)
        ctx.save_for_backward(x_q, s_x, w_q, s_w)
        ctx.cache, ctx.act_cache, ctx.backend = cache, act_cache, backend
        ctx.spec, ctx.grad_input = spec, grad_input
        ctx.rows = [w.shape[0] for w in ws]
        ctx.has_bias = len(params) > n_weights
        ctx.dtypes = (x2.dtype, ws[0].dtype)
        return y

    @staticmethod
    def backward(ctx, gy):
        x_q, s_x, w_q, s_w = ctx.saved_tensors
        xd, wd = ctx.dtypes
        cd = grad_dtype(xd)
        g = gy.to(cd)
        n = len(ctx.rows)
        gx = None
        gws: list[torch.Tensor | None] = [None] * n
        gbs: list[torch.Tensor | None] = [None] * n if ctx.has_bias else []
        if ctx.needs_input_grad[0] and ctx.grad_input == "int8":
            gx = _int8_grad_input(g, w_q, s_w, ctx.cache, ctx.spec, xd, ctx.backend)
        elif ctx.needs_input_grad[0]:
            cache = ctx.cache
            w_fq = cache.dequantized(cd, ctx.backend) if cache.w_q is w_q else _dequantize_rows(w_q, s_w, cd, ctx.backend)
            gx = (g @ w_fq).to(xd)
        first_w = _STE_LEAD_ARGS
        if any(ctx.needs_input_grad[first_w: first_w + n]):     # one dW GEMM for the stack, split by rows
            gw = (g.t() @ ctx.act_cache.dequantized(x_q, s_x, cd, ctx.backend)).to(wd)
            gws = [gw] if n == 1 else list(gw.split(ctx.rows))
        if ctx.has_bias and any(ctx.needs_input_grad[first_w + n:]):
            gb = g.sum(0, dtype=torch.float32).to(wd)
            gbs = [gb] if n == 1 else list(gb.split(ctx.rows))
        return (gx, *[None] * (_STE_LEAD_ARGS - 1), *gws, *gbs)


def w8a8_linear_ste(x: torch.Tensor, w: torch.Tensor | tuple[torch.Tensor, ...],
                    bias: torch.Tensor | tuple[torch.Tensor, ...] | None, spec: QuantSpec,
                    cache: WeightCache | None = None, backend: str | None = None,
                    act_cache: ActivationCache | None = None, grad_input: str = "bf16") -> torch.Tensor:
    """The learner's aligned linear: value identical to `quant.w8a8_linear(x, *quantize_weight(w))`,
    straight-through gradients to the master weight `w`, to `x` and to `bias`.

    Several linears that read the same x (q/k/v, gate/up) may run as one: `w` a tuple of weights,
    `bias` a tuple of their biases (or None), and the output their outputs side by side, each
    bit for bit its own linear's (per-channel codes, per-token scales, exact int32 sums). Their
    backward is one dX GEMM over the stacked weights (the sum of the separate dX, rounded once)
    and one dW GEMM split by rows.

    Args:
        x: [..., K] activations (compute dtype).
        w: [N, K] master weight, or a tuple of [Nᵢ, K]; bias: [N] (a tuple of [Nᵢ]) or None.
        spec: the shared QuantSpec.
        cache: the module's `WeightCache` (None: quantize `w` for this call only).
        backend: None (Triton on CUDA), "triton" or "torch" (see `triton_path`).
        act_cache: the model's `ActivationCache` (None: quantize x for this call only).
        grad_input: dX in backward, one of `GRAD_INPUTS`: "bf16" (dY · W_fq in the compute dtype)
            or "int8" (`_int8_grad_input`: per-token int8 dY · s_w, int8 GEMM; ≈1 % relative error).
    Returns:
        [..., N] (N = Σ Nᵢ) in x's dtype.
    """
    check_grad_input(grad_input)
    shape = x.shape
    ws = (w,) if isinstance(w, torch.Tensor) else tuple(w)
    bs = () if bias is None else (bias,) if isinstance(bias, torch.Tensor) else tuple(bias)
    act_cache = act_cache or ActivationCache()
    x_q, s_x = act_cache.get(x, spec, backend)
    cache = cache or WeightCache()
    if records_graph(x, *ws, *bs):
        y = _W8A8STE.apply(x.reshape(-1, shape[-1]), spec, cache, backend, x_q, s_x, act_cache, grad_input, len(ws),
                           *ws, *bs)
    else:                       # no_grad (π_old, π_ref): _W8A8STE.forward's computation, no graph node
        y = _int8_linear(x_q, s_x, *cache.get(ws, spec, backend), _stacked_bias(bs), x.dtype, backend)
    return y.reshape(*shape[:-1], y.shape[-1])


def kv_roundtrip(x: torch.Tensor, spec: QuantSpec, fp8_scale_value: float | None = None,
                 backend: str | None = None) -> torch.Tensor:
    """`quant.kv_roundtrip` (same bits); int8 on CUDA: quantize and dequantize in one Triton
    launch that reads x in place (HF's K/V are transposed views) and writes x's dtype."""
    if spec.kv == "int8_per_token_head_sym" and _tiled_triton(x, backend):
        from . import triton_quant
        return triton_quant.kv_roundtrip(x.detach(), spec.kv_scale_floor, spec.kv_rounding)
    if spec.kv == "int8_per_token_head_sym" and triton_path(x, backend):      # AGENTQ_QUANT_TILES=0
        codes, scale = quantize_rows(x, spec.kv_scale_floor, spec.kv_rounding, backend)
        return quant.dequantize_rows(codes, scale, x.dtype)
    return quant.kv_roundtrip(x, spec, fp8_scale_value)


class _KVSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, spec, fp8_scale_value, backend):
        return kv_roundtrip(x, spec, fp8_scale_value, backend)

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None


def kv_fake_quant(x: torch.Tensor, spec: QuantSpec, fp8_scale_value: float | None = None,
                  backend: str | None = None) -> torch.Tensor:
    """Learner side of the KV cache: the dequantized value the engine reads, identity gradient."""
    if spec.kv == "none":
        return x
    if not records_graph(x):
        return kv_roundtrip(x, spec, fp8_scale_value, backend)
    return _KVSTE.apply(x, spec, fp8_scale_value, backend)
