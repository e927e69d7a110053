"""`model.path` names an HF checkpoint folder. The folder a command printed (an RL run's, an SFT run's,
a pipeline's) is not one: the error names the checkpoint inside it, as `checkpoint=` did already."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agentq import build
from agentq.config import ConfigError, load_config


def model_path_error(path) -> str:
    cfg = load_config([])
    OmegaConf.update(cfg, "model.path", str(path))
    with pytest.raises(ConfigError) as e:
        build.model_path(cfg)
    return str(e.value)


def make_checkpoint(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")


@pytest.mark.parametrize("inside, meant", [
    (["checkpoints/step_000002", "checkpoints/step_000010"], "checkpoints/step_000010"),    # agentq train
    (["checkpoint"], "checkpoint"),                                                        # agentq sft
    (["sft/checkpoint", "rl/checkpoints/step_000032"], "rl/checkpoints/step_000032"),      # agentq pipeline
])
def test_a_run_folder_as_model_path_names_the_checkpoint_inside(tmp_path, inside, meant):
    for sub in inside:
        make_checkpoint(tmp_path / "run" / sub)
    said = model_path_error(tmp_path / "run")
    assert f"model.path='{tmp_path / 'run'}' is not an HF checkpoint folder (no config.json); a run folder? its " \
           f"last checkpoint is model.path={tmp_path / 'run' / meant}" == said


def test_a_hub_id_is_not_downloaded():
    assert model_path_error("Qwen/Qwen3-0.6B").endswith(
        "; no such folder (model.path takes a local folder: nothing is downloaded)")


def test_a_checkpoint_is_taken(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    cfg = load_config([])
    OmegaConf.update(cfg, "model.path", str(tmp_path / "ckpt"))
    assert build.model_path(cfg) == str(tmp_path / "ckpt")
