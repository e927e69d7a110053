"""`QuantSpec`: the one definition of agentq's quantization numerics.

The rollout engine, the learner's aligned (fake-quant) forward and any checkpoint export read the
same `QuantSpec`, so their int8 codes are identical by construction (tests check it bit for bit).

Conventions (see docs/quantization.md for the reasoning):

| tensor      | granularity                      | scale                              | rounding (default)      | range        |
|-------------|----------------------------------|------------------------------------|-------------------------|--------------|
| weights     | per output channel, symmetric    | absmax/127, floor 1e-8, fp32       | half to even            | [-128, 127]  |
| activations | per token, dynamic, symmetric    | absmax/127, floor 1e-8, fp32       | half to even (= vLLM)   | [-128, 127]  |
| KV (int8)   | per token per KV head, dynamic   | max(absmax/127, 1e-6), fp32        | half away (= vLLM int8_per_token_head) | [-128, 127] |
| KV (fp8)    | per tensor (k_scale, v_scale)    | 1.0 (vLLM's uncalibrated default; nothing calibrates it) | fp8 E4M3 round-to-nearest-even, saturating | ±448 |

Every code is computed as `round(x / scale)` (true IEEE division, not a reciprocal multiply), so
the torch reference, the Triton kernels and the learner agree bit for bit. vLLM rounds the same
way but computes x·(1/s) with no scale floor, so its codes are close to these, not equal
(docs/vllm.md, "vLLM is close to QuantSpec, not equal"). Keys are quantized
after RoPE (and after Qwen3's k_norm); every cached position is read back dequantized, for
prefill and decode alike.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Iterable

WEIGHT_FORMATS = ("none", "int8_per_channel_sym")
ACT_FORMATS = ("none", "int8_per_token_dynamic_sym")
KV_FORMATS = ("none", "int8_per_token_head_sym", "fp8_e4m3_per_tensor")
ROUNDING = ("half_even", "half_away")

#: projections of a Llama/Qwen-family decoder layer that run as W8A8 linears
DEFAULT_QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: modules that stay in the compute dtype by design (norms and rotary have no weights to quantize)
DEFAULT_IGNORED = ("embed_tokens", "lm_head")
#: projections the torch engine and vLLM run as one fused linear (one GEMM, one scheme): a spec
#: quantizes all of a group or none of it
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


@dataclass(frozen=True)
class QuantSpec:
    weights: str = "int8_per_channel_sym"
    acts: str = "int8_per_token_dynamic_sym"
    kv: str = "int8_per_token_head_sym"
    weight_rounding: str = "half_even"
    act_rounding: str = "half_even"
    kv_rounding: str = "half_away"
    weight_scale_floor: float = 1e-8
    act_scale_floor: float = 1e-8
    kv_scale_floor: float = 1e-6
    quantized_modules: tuple[str, ...] = DEFAULT_QUANTIZED
    ignored_modules: tuple[str, ...] = DEFAULT_IGNORED
    name: str = field(default="custom", compare=False)

    def __post_init__(self):
        for value, valid, what in ((self.weights, WEIGHT_FORMATS, "weights"), (self.acts, ACT_FORMATS, "acts"),
                                   (self.kv, KV_FORMATS, "kv"), (self.weight_rounding, ROUNDING, "weight_rounding"),
                                   (self.act_rounding, ROUNDING, "act_rounding"), (self.kv_rounding, ROUNDING, "kv_rounding")):
            if value not in valid:
                raise ValueError(f"QuantSpec.{what}={value!r} is not one of {list(valid)}")
        if (self.weights == "none") != (self.acts == "none"):
            raise ValueError("W8A8 needs both weights and acts quantized (or neither); "
                             f"got weights={self.weights!r}, acts={self.acts!r}")
        for floor, what in ((self.weight_scale_floor, "weight_scale_floor"), (self.act_scale_floor, "act_scale_floor"),
                            (self.kv_scale_floor, "kv_scale_floor")):
            # an all-zero row has absmax 0: its scale is the floor, and codes x / 0 would be NaN
            if not (isinstance(floor, (int, float)) and math.isfinite(floor) and floor > 0):
                raise ValueError(f"QuantSpec.{what}={floor!r} must be a finite number > 0")
        overlap = set(self.quantized_modules) & set(self.ignored_modules)
        if overlap:
            raise ValueError(f"modules both quantized and ignored: {sorted(overlap)}")
        self._check_fused_groups()

    def _check_fused_groups(self) -> None:
        """Refuse a spec that quantizes part of a fused group (q but not k/v): the torch engine and vLLM
        run each group as one GEMM and refused it only when the engine was built, while the aligned
        learner took it; refused here, every side refuses it alike, at construction."""
        for group in FUSED_GROUPS:
            inside = [m for m in group if m in self.quantized_modules]
            if self.linear_quantized and inside and len(inside) != len(group):
                raise ValueError(f"QuantSpec quantizes {inside} but not all of {list(group)}: the torch engine and "
                                 "vLLM run these projections as one fused linear with one scheme; quantize all or "
                                 "none of them")

    # ------------------------------------------------------------------ presets
    @staticmethod
    def preset(name: str) -> "QuantSpec":
        if name not in PRESETS:
            raise ValueError(f"unknown quantization preset {name!r}; valid: {sorted(PRESETS)}")
        return PRESETS[name]

    @property
    def linear_quantized(self) -> bool:
        return self.weights != "none"

    @property
    def kv_quantized(self) -> bool:
        return self.kv != "none"

    def quantizes(self, module: str) -> bool:
        """Whether linears of this leaf name (`q_proj`, `lm_head`, ...) run W8A8 under this spec."""
        return self.linear_quantized and module in self.quantized_modules

    def describe(self) -> str:
        """One line for a person: what this spec quantizes and what it leaves in the compute dtype."""
        if not (self.linear_quantized or self.kv_quantized):
            return f"{self.name}: nothing quantized"
        parts = []
        if self.linear_quantized:
            parts.append(f"{', '.join(self.quantized_modules)} W8A8 (int8 weights per channel, int8 activations "
                         "per token)")
        kv = {"int8_per_token_head_sym": "int8 KV per token and head", "fp8_e4m3_per_tensor": "fp8 KV per tensor"}
        parts.append(kv.get(self.kv, "KV in the compute dtype"))
        kept = [m for m in (*self.quantized_modules, *self.ignored_modules) if not self.quantizes(m)]
        if kept:
            parts.append(f"{', '.join(kept)} in the compute dtype")
        default = QuantSpec()
        parts += [f"{f} {getattr(self, f)}" for f in ("weight_rounding", "act_rounding", "kv_rounding",
                                                      "weight_scale_floor", "act_scale_floor", "kv_scale_floor")
                  if getattr(self, f) != getattr(default, f)]
        return f"{self.name}: " + "; ".join(parts)

    # ------------------------------------------------------------------ module audit
    def check_linears(self, linear_names: Iterable[str]) -> dict[str, list[str]]:
        """Classify a model's nn.Linear names; raise if any is neither quantized nor ignored.

        Returns {"quantized": [...], "ignored": [...]}. A quantized module kind that never occurs is
        also an error: a spec naming `gate_proj` on a model without it means the spec is wrong for
        this model, and silently running a layer unquantized is exactly what we refuse to do.
        """
        quantized, ignored, unknown = [], [], []
        seen = set()
        for full in linear_names:
            leaf = full.rsplit(".", 1)[-1]
            if leaf in self.ignored_modules:
                ignored.append(full)
            elif self.quantizes(leaf):
                quantized.append(full)
                seen.add(leaf)
            elif leaf in self.quantized_modules:
                ignored.append(full)   # spec quantizes no linears (e.g. preset "kv8")
            else:
                unknown.append(full)
        if unknown:
            raise ValueError(
                f"QuantSpec does not say how to run linear layer(s) {unknown[:6]}{'...' if len(unknown) > 6 else ''}: "
                f"add their names to quantized_modules {list(self.quantized_modules)} or "
                f"ignored_modules {list(self.ignored_modules)}")
        missing = set(self.quantized_modules) - seen
        if self.linear_quantized and missing:
            raise ValueError(f"QuantSpec quantizes {sorted(missing)} but the model has no such linear layers; "
                             f"linears found: {sorted({n.rsplit('.', 1)[-1] for n in quantized + ignored})}")
        return {"quantized": quantized, "ignored": ignored}


NONE = QuantSpec(weights="none", acts="none", kv="none", name="none")
PRESETS: dict[str, QuantSpec] = {
    "none": NONE,
    "w8a8": QuantSpec(kv="none", name="w8a8"),
    "kv8": QuantSpec(weights="none", acts="none", name="kv8"),
    "w8a8_kv8": QuantSpec(name="w8a8_kv8"),
    "w8a8_fp8kv": QuantSpec(kv="fp8_e4m3_per_tensor", name="w8a8_fp8kv"),
    # w8a8_kv8 with the LM head a W8A8 linear too: the head is the largest single weight of a small
    # model (Qwen3-1.7B: 0.31 B of its 1.7 B parameters) and ~0.6 GB a decode step reads at 8B
    "w8a8_kv8_head": QuantSpec(quantized_modules=DEFAULT_QUANTIZED + ("lm_head",), ignored_modules=("embed_tokens",),
                               name="w8a8_kv8_head"),
}
