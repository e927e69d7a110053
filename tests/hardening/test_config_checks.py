"""Bad config values fail at start-up with the key named, before any model or worker is built;
a truncated weight file is an error naming the file."""
import shutil

import pytest

from agentq.config import ConfigError, load_config
from conftest import run_cli


@pytest.mark.parametrize("override, named", [
    ("trainer.steps=-1", "trainer.steps=-1 (int): must be a positive integer"),
    ("trainer.steps=abc", "trainer.steps='abc' (str): must be a positive integer"),
    ("trainer.group_size=0", "trainer.group_size=0"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5 (float): must be a number in (0, 1]"),
    ("env_pool.call_timeout_s=0", "env_pool.call_timeout_s=0"),
    ("trainer.overwrite=maybe", "trainer.overwrite='maybe' (str): must be true or false"),
    ("trainer.pack_tokens=0", "trainer.pack_tokens=0 (int): must be a positive integer or null"),
    ("trainer.grad_input=fp8", "trainer.grad_input='fp8' (str): must be one of ['bf16', 'int8']"),
    ("rollout.run_ahead=sometimes", "rollout.run_ahead='sometimes' (str): must be true or false"),
    ("rollout.prefill_graph_max=-1", "rollout.prefill_graph_max=-1 (int): must be an integer >= 0"),
    # found at start-up, not at the first evaluation after training
    ("eval.selection=frist", "eval.selection='frist' (str): must be one of ['stratified', 'first']"),
    ("sft.val_fraction=1.0", "sft.val_fraction=1.0 (float): must be a number in [0, 1)"),
    ("sft.val_fraction=-0.1", "sft.val_fraction=-0.1 (float): must be a number in [0, 1)"),
    # clip_grad_norm_ to 0 would zero every gradient
    ("trainer.grad_clip=0", "trainer.grad_clip=0 (int): must be a number > 0"),
])
def test_bad_values_name_their_key(override, named):
    with pytest.raises(ConfigError, match="invalid config value") as e:
        load_config([override])
    assert named in str(e.value)


def test_eval_selection_rule_lists_the_methods_selection_knows():
    from agentq.config_schema import RULES
    from agentq.eval.selection import METHODS

    assert RULES["eval.selection"]("none") == f"one of {list(METHODS)}"
    assert all(RULES["eval.selection"](m) is None for m in METHODS)
    assert RULES["sft.val_fraction"](0) is None and RULES["sft.val_fraction"](0.99) is None


def test_every_problem_is_listed_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(["trainer.steps=0", "env.max_steps=-3"])
    assert "trainer.steps=0" in str(e.value) and "env.max_steps=-3" in str(e.value)


def test_default_configs_pass():
    load_config([])
    load_config([], config_name="pipeline")


def test_cli_rejects_before_building_anything(tmp_path):
    p = run_cli(["train", "trainer.steps=-1", f"trainer.out_dir={tmp_path / 'r'}"], timeout=120)
    assert p.returncode == 2 and "trainer.steps=-1" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r").exists()


def test_truncated_weight_file_is_named(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, ckpt)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    p = run_cli(["eval", f"checkpoint={ckpt}", "eval.num_tasks=1", "env_pool=inline", f"eval.out_dir={tmp_path / 'e'}"],
                timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"weight file {weights} is damaged or truncated" in p.stderr and "Traceback" not in p.stderr
