"""HF RMSNorm and SiLU-MLP modules with the learner's fused elementwise forward (`kernels.learner_ops`).

`install_fused_elementwise(model, ...)` swaps the class of every known Llama-formula RMSNorm and
SiLU MLP (parameters, names and optimizer state untouched, as for `QATLinear`) to a subclass
whose forward runs one Triton launch with autograd on CUDA bf16/fp16 and HF's own forward
elsewhere. Where the next linear is a W8A8 one, the same launch also returns the output's
per-token int8 codes and leaves them in the model's `ActivationCache`, so q/k/v (after the input
norm), gate/up (after the post-attention norm) and down (after SiLU·mul) skip their quantization
pass — the codes are `quantize_rows` of the output, bit for bit.

`install_fused_rope(model)` routes the attention's RoPE (HF's `apply_rotary_pos_emb`) through one
launch each way (`learner_ops.rope`), bit-identical to HF's eager ops.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn

from agentq.kernels import learner_ops, ste

#: RMSNorm classes computing HF's Llama formula w · dtype(x · rsqrt(mean(x²) + ε)) (not Gemma's 1 + w)
FUSED_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm")
#: MLP classes computing down(act(gate(x)) · up(x))
FUSED_MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")
#: attention classes whose forward calls their modeling module's `apply_rotary_pos_emb(q, k, cos, sin)`
FUSED_ROPE = ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention")


class FusedRMSNorm(nn.Module):
    """Mixin over an HF RMSNorm class (`_fused_class`)."""

    agentq_codes: tuple[float, str] | None       # (floor, rounding) of the W8A8 linears reading the output
    agentq_act_cache: ste.ActivationCache
    weight: torch.Tensor                         # the HF class's
    variance_epsilon: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not learner_ops.fused_applies(x, self.weight):
            return super().forward(x)
        y, codes = learner_ops.rms_norm(x, self.weight, float(self.variance_epsilon), self.agentq_codes)
        if codes is not None and self.agentq_codes is not None:
            self.agentq_act_cache.put(y, codes, *self.agentq_codes)
        return y


class FusedSiLUMLP(nn.Module):
    """Mixin over an HF gate/up/down MLP class with a SiLU activation."""

    agentq_codes: tuple[float, str] | None
    agentq_act_cache: ste.ActivationCache
    gate_proj: nn.Module                         # the HF class's
    up_proj: nn.Module
    down_proj: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not learner_ops.fused_applies(x):
            return super().forward(x)
        group = _gate_up_group(self.gate_proj, self.up_proj)
        if group is not None:          # one [.., 2N] output: its gradient is written whole (no cat)
            n = int(group.rows[0])
            h, codes = learner_ops.silu_mul_stacked(group.stacked(x), n, self.agentq_codes)
        else:
            h, codes = learner_ops.silu_mul(self.gate_proj(x), self.up_proj(x), self.agentq_codes)
        if codes is not None and self.agentq_codes is not None:
            self.agentq_act_cache.put(h, codes, *self.agentq_codes)
        return self.down_proj(h)


def _gate_up_group(gate: nn.Module, up: nn.Module) -> Any:
    """The `qat.ProjectionGroup` of exactly [gate, up] (in that order) when neither module has
    hooks that calling the group directly would skip; else None."""
    group = getattr(gate, "group", None)
    members = getattr(group, "members", None)          # None when gate has no group
    if members is None or getattr(up, "group", None) is not group or list(members) != [gate, up]:
        return None
    if any(m._forward_hooks or m._forward_pre_hooks for m in (gate, up)):
        return None
    return group


_CLASSES: dict[tuple[type, type], type] = {}


def _fused_class(mixin: type, base: type) -> type:
    """The (mixin, base) subclass, made once and registered here by name (so it pickles)."""
    if (mixin, base) not in _CLASSES:
        name = f"Fused{base.__name__}"
        cls = type(name, (mixin, base), {"agentq_base": base, "__module__": __name__, "__qualname__": name})
        globals()[name] = _CLASSES[mixin, base] = cls
    return _CLASSES[mixin, base]


def _is_silu(act: nn.Module) -> bool:
    from transformers.activations import SiLUActivation
    return isinstance(act, (nn.SiLU, SiLUActivation))


def install_fused_elementwise(model: nn.Module, codes: tuple[float, str] | None,
                              quantized: Callable[[nn.Module], bool], act_cache: ste.ActivationCache) -> int:
    """Swap the known norms and MLPs of `model` in place; returns how many modules were swapped.

    Args:
        codes: (scale floor, rounding) of the activations of W8A8 linears (None: no quantized linears).
        quantized: whether a linear runs the W8A8 forward (then the module before it emits codes).
        act_cache: the model's shared activation-code cache."""
    feeds: dict[int, bool] = {}          # norm / MLP id -> does it feed quantized linears?
    for m in model.modules():
        attn, mlp = getattr(m, "self_attn", None), getattr(m, "mlp", None)
        if hasattr(m, "input_layernorm") and attn is not None and hasattr(attn, "q_proj"):
            feeds[id(m.input_layernorm)] = quantized(attn.q_proj)
        if hasattr(m, "post_attention_layernorm") and mlp is not None and hasattr(mlp, "gate_proj"):
            feeds[id(m.post_attention_layernorm)] = quantized(mlp.gate_proj)
    swapped = 0
    for m in list(model.modules()):
        name = type(m).__name__
        if name in FUSED_NORMS and hasattr(m, "variance_epsilon"):
            mixin: type = FusedRMSNorm
            feeds_q = feeds.get(id(m), False)
        elif name in FUSED_MLPS and _is_silu(getattr(m, "act_fn", None) or nn.Identity()):
            mixin, feeds_q = FusedSiLUMLP, quantized(getattr(m, "down_proj"))
        else:
            continue
        m.__class__ = _fused_class(mixin, type(m))
        setattr(m, "agentq_codes", codes if feeds_q else None)
        setattr(m, "agentq_act_cache", act_cache)
        swapped += 1
    return swapped


def install_fused_rope(model: nn.Module) -> int:
    """Route the RoPE of the model's attention classes through `learner_ops.rope` where it applies.

    HF's attention forward calls `apply_rotary_pos_emb` from its modeling module, so the hook is that
    module's function, replaced by a dispatcher that calls the original for anything `rope` does not
    take. Process-wide for those classes, and safe so: the fused op gives HF's bits in both
    directions (tested). Returns the number of modeling modules patched now."""
    import sys

    patched = 0
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        original = getattr(mod, "apply_rotary_pos_emb", None)
        if type(m).__name__ not in FUSED_ROPE or original is None or hasattr(original, "agentq_original"):
            continue
        setattr(mod, "apply_rotary_pos_emb", _rope_dispatcher(original))
        patched += 1
    return patched


def _rope_dispatcher(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze_dim = args[0] if args else kwargs.get("unsqueeze_dim", 1)
        if unsqueeze_dim == 1 and len(args) <= 1 and set(kwargs) <= {"unsqueeze_dim"} and \
                learner_ops.rope_applies(q, k, cos, sin):
            return learner_ops.rope(q, k, cos, sin)
        return original(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb.agentq_original = original  # type: ignore[attr-defined]  # marks the patch
    return apply_rotary_pos_emb


def remove_fused_elementwise(model: nn.Module) -> None:
    """Back to the HF classes (e.g. before save_pretrained)."""
    for m in model.modules():
        if isinstance(m, (FusedRMSNorm, FusedSiLUMLP)):
            m.__class__ = m.agentq_base  # type: ignore[assignment]  # swapping the class back in place
            del m.agentq_codes, m.agentq_act_cache


__all__ = ["FUSED_MLPS", "FUSED_NORMS", "FUSED_ROPE", "FusedRMSNorm", "FusedSiLUMLP", "install_fused_elementwise",
           "install_fused_rope", "remove_fused_elementwise"]
