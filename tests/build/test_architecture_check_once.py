"""The vLLM architecture check builds the model on the meta device once per start: `train` and `eval`
with model.path checked the folder at `model_path` and again at `make_backend`, and built it twice."""
from __future__ import annotations

import json
import shutil

import pytest

from agentq import build
from agentq.cli import main
from agentq.config import ConfigError
from agentq.kernels import QuantSpec


@pytest.fixture
def meta_builds(monkeypatch) -> list[str]:
    """Every `AutoModelForCausalLM.from_config` call (its model_type); the check's cache emptied first,
    and the vLLM engine's start replaced by a refusal (the check is all that is measured)."""
    from transformers import AutoModelForCausalLM

    from agentq.rollout.vllm_backend import VLLMBackend

    build._linears_built.cache_clear()
    real, calls = AutoModelForCausalLM.from_config, []

    def counting(config, **kw):
        calls.append(config.model_type)
        return real(config, **kw)

    def no_engine(*a, **k):
        raise ConfigError("stopped before the vLLM engine")

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", counting)
    monkeypatch.setattr(VLLMBackend, "from_pretrained", no_engine)
    yield calls
    build._linears_built.cache_clear()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_vllm_start_builds_the_meta_model_once(tiny_model_dir, tmp_path, meta_builds, capsys, command):
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    out = ([f"trainer.out_dir={tmp_path / 'run'}", "trainer.steps=1"] if command == "train"
           else [f"eval.out_dir={tmp_path / 'ev'}", "eval.num_tasks=1"])
    assert main([command, "model=hf", f"model.path={model}", "rollout.backend=vllm", "env_pool=inline", *out]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "agentq: stopped before the vLLM engine"     # checks passed
    assert meta_builds == ["qwen3"]


def test_a_model_the_meta_device_cannot_build_is_tried_once_and_still_warned_about(tiny_model_dir, tmp_path,
                                                                                   meta_builds, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    def no_meta(config, **kw):
        meta_builds.append(config.model_type)
        raise NotImplementedError("Could not run 'aten::_custom_op' with arguments from the 'Meta' backend.")

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", no_meta)
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    assert main(["eval", "model=hf", f"model.path={model}", "rollout.backend=vllm", "env_pool=inline",
                 f"eval.out_dir={tmp_path / 'ev'}", "eval.num_tasks=1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "its weight names were not checked before the start (NotImplementedError: Could not run" in err
    assert meta_builds == ["qwen3"]


def test_a_folder_whose_config_changed_is_built_again(tiny_model_dir, tmp_path, meta_builds):
    """The cache is keyed by the folder and its config.json: a folder rewritten with another model is
    checked as the model it now holds."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    spec = QuantSpec.preset("w8a8")
    build.check_vllm_architecture(str(model), spec, spec)
    build.check_vllm_architecture(str(model), spec, spec)
    assert meta_builds == ["qwen3"]
    names = build.model_linears(str(model))[1]
    config = json.loads((model / "config.json").read_text())
    one_layer = {"num_hidden_layers": 1, **({"layer_types": config["layer_types"][:1]} if "layer_types" in config else {})}
    (model / "config.json").write_text(json.dumps({**config, **one_layer}))
    fewer = build.model_linears(str(model))[1]
    assert meta_builds == ["qwen3", "qwen3"] and set(fewer) < set(names)


def test_a_cached_build_error_whose_constructor_takes_more_is_raised_as_its_kind(tiny_model_dir, tmp_path,
                                                                                  meta_builds, monkeypatch):
    """The cache keeps an error's type and arguments; a JSONDecodeError (a ValueError whose constructor
    takes three) rebuilt from its one-argument args raised TypeError, a traceback instead of the
    check's one line. It comes back as the ValueError it is, with its text."""
    from transformers import AutoModelForCausalLM

    def bad_json(config, **kw):
        meta_builds.append(config.model_type)
        raise json.JSONDecodeError("Expecting value", "x", 0)

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", bad_json)
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    for _ in range(2):
        with pytest.raises(ValueError, match="Expecting value"):
            build.model_linears(str(model))
    assert meta_builds == ["qwen3"]
    with pytest.raises(ConfigError, match="cannot build as a causal LM: JSONDecodeError: Expecting value"):
        build.check_vllm_architecture(str(model), QuantSpec.preset("w8a8_kv8"), QuantSpec.preset("w8a8_kv8"))
