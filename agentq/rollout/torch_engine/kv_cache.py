"""Static KV cache with one slot per episode; quantize on write, read back dequantized.

Layout per layer: codes `[n_slots, n_kv_heads, max_len, head_dim]` (int8 for KV8, fp8 for the
fp8 option, the compute dtype without quantization) and fp32 scales `[n_slots, n_kv_heads,
max_len]` (int8 only). Every read — prefill or decode — returns dequantized values, so the
log-probs of a token do not depend on whether it was prefilled or decoded, and the learner
mirrors one rule (fake-quant K after RoPE/k_norm and V, per token per head).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from agentq.kernels import quant
from agentq.kernels.quant_spec import QuantSpec
from agentq.utils.device import device_tensor
from agentq.utils.memory import out_of_memory_hint


#: one layer's (k, v, k_scale, v_scale) for a kernel that writes K/V itself (scales None: a cache of values)
KVTensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _triton_ok() -> bool:
    from agentq.kernels._interp import HAVE_TRITON
    return HAVE_TRITON


def kv_code_dtype(spec: QuantSpec, dtype: torch.dtype) -> torch.dtype:
    """The cache's element type: int8 codes (KV8), fp8 codes, or the compute dtype (no KV quantization)."""
    return {"none": dtype, "int8_per_token_head_sym": torch.int8, "fp8_e4m3_per_tensor": torch.float8_e4m3fn}[spec.kv]


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, spec: QuantSpec, dtype: torch.dtype) -> int:
    """Bytes one cached token costs over all layers: K and V codes, plus an fp32 scale per head for int8."""
    codes = 2 * n_layers * n_kv_heads * head_dim * kv_code_dtype(spec, dtype).itemsize
    scales = 2 * n_layers * n_kv_heads * 4 if spec.kv == "int8_per_token_head_sym" else 0
    return codes + scales


def kv_memory_hint(n_slots: int, max_len: int, per_token: int, spec: QuantSpec) -> str:
    """What a cache that does not fit would need, and what lowers it (by the config names)."""
    need = n_slots * max_len * per_token
    text = (f"agentq: the KV cache of {n_slots} slots x {max_len} tokens needs {need / 2 ** 30:.1f} GiB "
            f"({per_token} bytes a token over all layers). Lower rollout.max_slots (episodes in flight) or "
            f"env.max_context_tokens (the slot length)")
    if spec.kv == "none":
        text += ", or quantize the cache (rollout=w8a8_kv8: int8 codes take about half of bf16's bytes)"
    return text + "."


class KVCache:
    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, max_len: int, head_dim: int,
                 spec: QuantSpec, dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.spec, self.dtype, self.device = spec, dtype, torch.device(device)
        self.n_layers, self.n_slots, self.n_kv, self.max_len, self.head_dim = n_layers, n_slots, n_kv_heads, max_len, head_dim
        shape = (n_slots, n_kv_heads, max_len, head_dim)
        code_dtype = kv_code_dtype(spec, dtype)
        self.k_scale: list[torch.Tensor] | None
        self.v_scale: list[torch.Tensor] | None
        with out_of_memory_hint(lambda: kv_memory_hint(
                n_slots, max_len, kv_bytes_per_token(n_layers, n_kv_heads, head_dim, spec, dtype), spec)):
            self.k = [torch.zeros(shape, dtype=code_dtype, device=self.device) for _ in range(n_layers)]
            self.v = [torch.zeros(shape, dtype=code_dtype, device=self.device) for _ in range(n_layers)]
            if spec.kv == "int8_per_token_head_sym":
                self.k_scale = [torch.ones(shape[:3], dtype=torch.float32, device=self.device) for _ in range(n_layers)]
                self.v_scale = [torch.ones(shape[:3], dtype=torch.float32, device=self.device) for _ in range(n_layers)]
            else:
                self.k_scale = self.v_scale = None
        self._fused_int8_write = spec.kv == "int8_per_token_head_sym" and self.device.type == "cuda" and _triton_ok()
        # a decode kernel may write K/V itself (int8 or value caches on CUDA; not fp8): decided once
        self._fused_decode_write = (self.device.type == "cuda" and _triton_ok()
                                    and spec.kv != "fp8_e4m3_per_tensor")
        # fp8: one per-tensor scale per layer for K and V (1.0 = vLLM's uncalibrated default)
        self.fp8_k_scale = [1.0] * n_layers
        self.fp8_v_scale = [1.0] * n_layers
        # `reuse_reads`: CPU read buffers kept while a scope is open (name → flat tensor)
        self._reuse_depth = 0
        self._workspace: dict[str, torch.Tensor] = {}

    def fused_write_args(self, layer: int) -> KVTensors | None:
        """(k, v, k_scale, v_scale) of one layer for a kernel that writes the tokens' K/V itself
        (`triton_norm.qk_norm_rope_to_cache`): int8 or model-dtype caches on CUDA; None otherwise
        (fp8, CPU), where `write` stores them."""
        if not self._fused_decode_write:
            return None
        if self.k_scale is None or self.v_scale is None:
            return self.k[layer], self.v[layer], None, None
        return self.k[layer], self.v[layer], self.k_scale[layer], self.v_scale[layer]

    def kv_quant(self) -> tuple[float, str] | None:
        """(scale floor, rounding) of the int8 codes, None for a cache of values."""
        if self.spec.kv != "int8_per_token_head_sym":
            return None
        return self.spec.kv_scale_floor, self.spec.kv_rounding

    def bytes_per_token(self) -> int:
        """Bytes one cached token costs over all layers (K and V, codes + scales)."""
        return kv_bytes_per_token(self.n_layers, self.n_kv, self.head_dim, self.spec, self.dtype)

    def _encode(self, x: torch.Tensor, fp8_scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.spec.kv == "int8_per_token_head_sym":
            return quant.quantize_kv(x, self.spec)
        if self.spec.kv == "fp8_e4m3_per_tensor":
            return quant.quantize_fp8(x, fp8_scale), None
        return x.to(self.dtype), None

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
              ) -> None:
        """Store N tokens: slots [N], positions [N], k/v [N, n_kv, head_dim]."""
        if self._fused_int8_write:        # one Triton launch each for K and V (same bits as below)
            from agentq.kernels import triton_quant
            for cache, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
                assert scales is not None                # int8 KV always has scales
                triton_quant.quantize_kv_to_cache(x, cache[layer], scales[layer], slots, positions, self.spec)
            return
        for cache, scales, x, s8 in ((self.k, self.k_scale, k, self.fp8_k_scale[layer]),
                                     (self.v, self.v_scale, v, self.fp8_v_scale[layer])):
            codes, scale = self._encode(x, s8)
            cache[layer][slots, :, positions] = codes
            if scales is not None and scale is not None:     # int8: both, else neither
                scales[layer][slots, :, positions] = scale

    def copy_slots(self, src: list[int], dst: list[int], length: int) -> None:
        """Copy positions [0, length) of slot src[i] into slot dst[i] (codes and scales, every
        layer): a prefix computed once serves every slot whose context starts with it. Positions of
        a source past its own cached length are copied too; the destination's length bookkeeping
        (the engine's) never reads them before they are written."""
        if not src:
            return
        if len(src) != len(dst) or set(src) & set(dst) or len(set(dst)) != len(dst):
            raise ValueError(f"copy_slots: sources {src} and destinations {dst} must pair up, distinct")
        s, d = device_tensor(src, self.device), device_tensor(dst, self.device)
        for tensors in (self.k, self.v, self.k_scale or [], self.v_scale or []):
            for t in tensors:
                t[d, :, :length] = t[s, :, :length]

    @contextlib.contextmanager
    def reuse_reads(self) -> Iterator[None]:
        """Within this scope a CPU `read` writes into buffers it keeps (grown by a quarter when a
        read needs more) instead of fresh tensors; they are freed when the outermost scope ends.

        Why: the torch attention path reads every cached token of every row at each decode step,
        dequantized (and in fp64 for an fp32 model), so a step allocated a few tensors of
        B × kv heads × length × head_dim per layer, each one token longer than the step before. glibc
        serves such blocks (over 128 KiB) with a fresh mmap whenever the size exceeds the last one
        freed, so every step page-faulted all of them in and unmapped them again: on 2 cores a
        50-turn ALFWorld eval of 8 episodes spent 284 s in the kernel against 143 s in user code.
        `TorchEngine.generate` opens one scope per call (its prefill and decode steps). Same values
        as outside a scope; a tensor returned inside one is overwritten by the next `read`."""
        self._reuse_depth += 1
        try:
            yield
        finally:
            self._reuse_depth -= 1
            if not self._reuse_depth:
                self._workspace.clear()

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of `shape` on the front of the scope's buffer `name` (`reuse_reads`), or
        a new one outside a scope."""
        if not self._reuse_depth:
            return torch.empty(shape, dtype=dtype, device=self.device)
        need = 1
        for n in shape:
            need *= n
        buf = self._workspace.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < need:
            buf = self._workspace[name] = torch.empty(need + need // 4, dtype=dtype, device=self.device)
        return buf[:need].view(shape)

    def _rows(self, t: torch.Tensor, slots: torch.Tensor, length: int, run: int | None, out: str
              ) -> torch.Tensor:
        """t[slots, :, :length] on a CPU: a view where the slots are the run `run`, run + 1, … (`_run`),
        else a gather (`index_select`: torch's advanced indexing of int8 is ~14× slower there) into
        the buffer `out` (`_buffer`)."""
        if run is not None:
            return t[run:run + len(slots), :, :length]
        src = t[:, :, :length]
        return torch.index_select(src, 0, slots, out=self._buffer(out, (len(slots), *src.shape[1:]), t.dtype))

    def _run(self, slots: torch.Tensor) -> int | None:
        """The first slot where `slots` are consecutive and on the CPU (read there without a device
        wait), else None."""
        if slots.device.type != "cpu" or slots.numel() == 0:
            return None
        first, last = int(slots[0]), int(slots[-1])
        if last - first + 1 == slots.numel() and torch.equal(slots, torch.arange(first, last + 1)):
            return first
        return None

    def read(self, layer: int, slots: torch.Tensor, length: int, dtype: torch.dtype | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V of `slots` for positions [0, length): [B, n_kv, length, head_dim] in
        `dtype` (default the cache's compute dtype; another one is the dequantized value converted,
        as `.to(dtype)` gives it). Views of the cache itself where nothing needs dequantizing or
        converting and the slots are consecutive on a CPU: read-only. Inside `reuse_reads` (CPU)
        the results live in the scope's buffers, valid until the next `read`."""
        dtype = self.dtype if dtype is None else dtype
        if self.device.type == "cpu":
            return self._read_cpu(layer, slots, length, dtype, self._run(slots))
        out = []
        for cache, scales, s8 in ((self.k, self.k_scale, self.fp8_k_scale[layer]),
                                  (self.v, self.v_scale, self.fp8_v_scale[layer])):
            codes = cache[layer][slots, :, :length]
            if scales is not None:
                x = quant.dequantize_rows(codes, scales[layer][slots, :, :length], self.dtype)
            elif self.spec.kv == "fp8_e4m3_per_tensor":
                x = quant.dequantize_rows(codes, s8, self.dtype)
            else:
                x = codes
            out.append(x.to(dtype))
        return out[0], out[1]

    def _read_cpu(self, layer: int, slots: torch.Tensor, length: int, dtype: torch.dtype, run: int | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """`read` on a CPU: `quant.dequantize_rows` in the compute dtype (per-row scales, or the fp8
        per-tensor scale), then `.to(dtype)`, written into the `reuse_reads` buffers inside a scope
        (its `out=`/`work=` form), so a decode step allocates no tensor of the read's size once they
        are large enough; into new tensors outside one."""
        shape = (len(slots), self.n_kv, length, self.head_dim)
        out = []
        for name, cache, scales, s8 in (("k", self.k, self.k_scale, self.fp8_k_scale[layer]),
                                        ("v", self.v, self.v_scale, self.fp8_v_scale[layer])):
            codes = self._rows(cache[layer], slots, length, run, out=f"{name}_codes")
            if scales is None and self.spec.kv != "fp8_e4m3_per_tensor":     # values in the compute dtype
                if codes.dtype != dtype:
                    codes = self._buffer(name, shape, dtype).copy_(codes)
                out.append(codes)
                continue
            scale = s8 if scales is None else self._rows(scales[layer], slots, length, run, out="scales")
            dst = self._buffer(name, shape, dtype)
            # one rounding, fp32 → dtype, unless the compute dtype rounds in between (bf16 read as fp64)
            to = dtype if self.dtype in (torch.float32, dtype) else self.dtype
            res = dst if to == dtype else self._buffer("rounded", shape, to)
            work = None if to == torch.float32 else self._buffer("f32", shape, torch.float32)
            quant.dequantize_rows(codes, scale, to, out=res, work=work)
            out.append(dst if res is dst else dst.copy_(res))
        return out[0], out[1]
