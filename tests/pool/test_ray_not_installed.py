"""Ray is the optional `[ray]` extra: where it is not installed, a setting that runs on it (env_pool=ray,
placement=colocated|split) is refused at start-up in one line naming the setting and the pip command,
not a ModuleNotFoundError traceback from the pool or the placement once the run was under way.
`sys.modules["ray"] = None` makes `import ray` fail as it does where Ray is absent."""
from __future__ import annotations

import pytest

from agentq import build
from agentq.cli import main
from agentq.config import ConfigError, load_config
from agentq.pool import EnvSpec
from agentq.pool.ray_pool import RayPool, import_ray
from agentq.trainer.placement import Placement

FIX = "pip install -e \".[ray]\" in a checkout, else pip install ray"


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)


def said(setting: str) -> str:
    return f"{setting} runs on Ray, which is not installed (import of ray halted; None in sys.modules): {FIX}"


def test_import_ray_names_the_setting_and_the_pip_command(no_ray):
    with pytest.raises(ConfigError) as e:
        import_ray("env_pool=ray")
    assert str(e.value) == said("env_pool=ray")


@pytest.mark.parametrize("overrides, setting", [
    (["env_pool=ray"], "env_pool=ray"),
    (["placement=split"], "placement=split"),
    (["placement=colocated", "env_pool=ray"], "env_pool=ray"),
])
def test_the_start_up_check_names_the_first_setting_that_runs_on_ray(no_ray, overrides, setting):
    cfg = load_config(overrides)
    assert build.ray_settings(cfg)[0] == setting
    with pytest.raises(ConfigError) as e:
        build.check_ray_installed(cfg)
    assert str(e.value) == said(setting)


def test_settings_without_ray_need_no_ray(no_ray):
    cfg = load_config(["env_pool=process"])
    assert build.ray_settings(cfg) == []
    build.check_ray_installed(cfg)


def test_eval_and_sft_do_not_ask_for_ray_for_a_placement_they_never_read(no_ray):
    """A train command line's placement= copied to `agentq eval` / `sft` (which place no actors) runs."""
    cfg = load_config(["placement=colocated", "env_pool=process"])
    assert build.ray_settings(cfg) == ["placement=colocated"]
    assert build.ray_settings(cfg, placement=False) == []
    build.check_ray_installed(cfg, placement=False)
    with pytest.raises(ConfigError):
        build.check_ray_installed(cfg)


def test_the_pool_and_the_placement_say_the_same_line(no_ray):
    """Where they import Ray themselves (a caller that skipped the start-up check)."""
    with pytest.raises(ConfigError) as e:
        RayPool(EnvSpec("textworld_express", {}), num_envs=2)
    assert str(e.value) == said("env_pool=ray")
    with pytest.raises(ConfigError) as e:
        Placement(load_config(["placement=split"]))
    assert str(e.value) == said("placement=split")


@pytest.mark.parametrize("command, overrides, setting", [
    ("train", ["env_pool=ray"], "env_pool=ray"),
    ("train", ["placement=split", "env_pool=inline"], "placement=split"),
    ("eval", ["env_pool=ray"], "env_pool=ray"),
    ("sft", ["env_pool=ray"], "env_pool=ray"),
])
def test_commands_refuse_it_in_one_line_before_building_anything(no_ray, command, overrides, setting, tmp_path,
                                                                 capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("the model was built before Ray was found missing")

    monkeypatch.setattr(build, "load_tokenizer", never)
    out = {"train": "trainer.out_dir", "eval": "eval.out_dir", "sft": "sft.out_dir"}[command]
    assert main([command, *overrides, f"{out}={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"agentq: {said(setting)}" and "Traceback" not in err
    assert not (tmp_path / "out").exists()
