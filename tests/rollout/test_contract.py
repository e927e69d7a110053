"""The `RolloutBackend` contract (`agentq.rollout.contract.check_backend`) and the route for a backend
of one's own (`rollout.backend=module:Class`): the torch engine keeps the contract, each broken
clause is named, and a plugin backend trains and is refused in one line where it cannot serve (the CUDA
engine's case: tests/rollout/test_engine_cuda.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentq.kernels.quant_spec import QuantSpec
from agentq.rollout.backend import load_safetensors_dir
from agentq.rollout.contract import ContractError, check_backend
from agentq.rollout.torch_engine.engine import TorchEngine

PLUGINS = Path(__file__).parent / "plugins"


def contexts(tokenizer):
    return [tokenizer.encode(t) for t in ("You are in the kitchen. ", "A closed door is to the east of the hall. ",
                                          "Take the coin.")]


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    import engine_plugin

    return engine_plugin


@pytest.mark.parametrize("quant", ["w8a8_kv8", "none"])
def test_the_torch_engine_keeps_the_contract(tiny_model_dir, tokenizer, quant):
    eng = TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset(quant), max_slots=4, max_len=256)
    weights = list(load_safetensors_dir(str(tiny_model_dir)).items())
    check_backend(eng, contexts(tokenizer), stop_token_ids=(tokenizer.eos_token_id,), weights=weights,
                  logprob_atol=1e-5)
    assert eng.policy_version == 1


@pytest.mark.parametrize("fault, said", [
    ("unseeded", "episode 0 (seed 11) sampled "),
    ("hot", "episode 0: score() of its sampled tokens gave "),
    ("version", "update_weights(version=1) returned SyncStats(version=0"),
])
def test_each_broken_clause_is_named(tiny_model_dir, tokenizer, plugins, fault, said):
    eng = TorchEngine.from_pretrained(str(tiny_model_dir), QuantSpec.preset("w8a8_kv8"), max_slots=4, max_len=256)
    backend = plugins.Faulty(eng, fault)
    with pytest.raises(ContractError) as e:
        check_backend(backend, contexts(tokenizer), stop_token_ids=(tokenizer.eos_token_id,),
                      weights=list(load_safetensors_dir(str(tiny_model_dir)).items()))
    assert str(e.value).startswith(said)


def test_a_backend_of_ones_own_trains_from_its_module_class_name(tmp_path, plugins, capsys):
    from agentq.cli import main

    run = tmp_path / "run"
    assert main(["train", "rollout.backend=engine_plugin:EngineBehindPlugin", "trainer.steps=1", "trainer.eval_every=-1",
                 "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2", "env.max_new_tokens=8",
                 "env_pool=inline", f"trainer.out_dir={run}"]) == 0
    assert "  backend: engine_plugin:EngineBehindPlugin\n" in (run / "config.yaml").read_text()
    assert (run / "checkpoints" / "step_000001").is_dir()
    # its SyncStats.extra numbers reach the metrics as sync/<name>; its text does not
    import json
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert row["sync/plugin_syncs"] == 1.0 and row["sync/plugin_ok"] == 1.0 and "sync/plugin_mode" not in row


@pytest.mark.parametrize("name, said", [
    ("engine_plugin:OtherNumerics", "rollout.backend='engine_plugin:OtherNumerics' serves quant 'none: nothing quantized', not the run's "
                                     "rollout.quant='w8a8_kv8'"),
    ("engine_plugin:Nowhere", "rollout.backend='engine_plugin:Nowhere' does not import: AttributeError"),
    ("no_such_module:Backend", "rollout.backend='no_such_module:Backend' does not import: ModuleNotFoundError"),
    ("engine_plugin:TorchEngine", "rollout.backend='engine_plugin:TorchEngine' is not a RolloutBackend subclass with "
                                  "a from_config classmethod"),
    ("torch engine", "rollout.backend='torch engine' (str): must be one of ['torch', 'vllm'], or 'module:Class'"),
])
def test_a_backend_that_cannot_serve_the_run_is_one_line(tmp_path, plugins, capsys, name, said):
    from agentq.cli import main

    run = tmp_path / "run"
    assert main(["train", f"rollout.backend={name}", "trainer.steps=1", "trainer.eval_every=-1", "env_pool=inline",
                 f"trainer.out_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("agentq:") == 1 and "Traceback" not in err and not run.exists()



def test_a_backend_whose_weight_sync_does_not_take_stops_the_run(tmp_path, plugins, capsys):
    """A backend that ignored `update_weights` trained off-policy without a word (its turns' versions were
    never read): step 2's rollouts say the version step 1 synced, else the run stops naming the backend."""
    from agentq.cli import main

    run = tmp_path / "run"
    assert main(["train", "rollout.backend=engine_plugin:NoSync", "trainer.steps=2", "trainer.eval_every=-1",
                 "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2", "env.max_new_tokens=8",
                 "env_pool=inline", f"trainer.out_dir={run}"]) == 1
    err = capsys.readouterr().err
    assert ("agentq: run stopped: the rollout backend NoSync sampled episode 2's turn with policy_version 0, but the "
            "learner's weights were synced into it as version 1: its update_weights did not take them") in err


def test_a_half_written_backend_says_what_it_lacks(tokenizer):
    """The protocol's bodies were `...`: a subclass without `generate` returned None from it."""
    from agentq.rollout.backend import RolloutBackend

    class Half(RolloutBackend):
        quant, policy_version = QuantSpec.preset("none"), 0

    with pytest.raises(NotImplementedError, match=r"^Half\.release: a rollout backend must free ended episodes$"):
        check_backend(Half(), contexts(tokenizer))
    with pytest.raises(NotImplementedError, match=r"^Half\.generate: a rollout backend must sample turns$"):
        Half().generate([])
    assert Half().kv_bytes_per_token() == 0 and Half().prefill_counts() == {} and Half().vocab_size is None


def test_a_plugin_may_set_its_vocab_size_and_return_numpy_numbers(tiny_model_dir, tokenizer):
    """`vocab_size` was a read-only property of the protocol (a plugin assigning it raised), and numpy
    float log-probs were refused as "non-finite"."""
    import numpy as np

    from agentq.rollout.backend import RolloutBackend, SamplingParams, TurnRequest, TurnResult, turn_error

    class Numpy(RolloutBackend):
        def __init__(self):
            self.quant, self.policy_version, self.vocab_size = QuantSpec.preset("none"), 0, 100

    assert Numpy().vocab_size == 100
    q = TurnRequest(0, [1, 2], SamplingParams(max_new_tokens=4, stop_token_ids=(9,)))
    ok = TurnResult(0, list(np.array([3, 9])), list(np.array([-0.1, -0.2], np.float32)), "stop")
    assert turn_error(q, ok, 100) is None
    bad = TurnResult(0, [3, 9], [-0.1, torch.tensor(-0.2)], "stop")
    assert turn_error(q, bad, 100) == "a behaviour log-prob that is no number (tensor(-0.2000), a Tensor) at token 1"
