"""conf/algo/*.yaml: each preset names a registered objective with every parameter spelled out,
fixes rollout quantization and learner alignment as in issue 4's table, and composes under Hydra
(the preset selects the rollout group; a CLI `rollout=...` still wins)."""
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentq.algos import make_objective

CONF = Path(__file__).resolve().parents[2] / "conf"
TABLE = {   # preset: (rollout, learner_quant, objective) — issue 4
    "bf16": ("bf16", "none", "grpo"),
    "grpo": ("w8a8_kv8", "none", "grpo"),
    "flashrl_tis": ("w8a8_kv8", "none", "tis"),
    "ais": ("w8a8_kv8", "none", "ais"),
    "qurl": ("w8a8_kv8", "none", "qurl"),
    "qat": ("w8a8_kv8", "aligned", "grpo"),
    "qat_tis": ("w8a8_kv8", "aligned", "tis"),
    "qat_ais": ("w8a8_kv8", "aligned", "ais"),
    "interq": ("w8a8_kv8", "aligned", "interq"),
    "tbpo": ("w8a8_kv8", "aligned", "tbpo"),
}


def test_every_preset_is_in_the_table():
    assert {p.stem for p in (CONF / "algo").glob("*.yaml")} == set(TABLE)


@pytest.mark.parametrize("preset", sorted(TABLE))
def test_preset_builds_its_objective_with_all_params(preset):
    cfg = OmegaConf.load(CONF / "algo" / f"{preset}.yaml")
    rollout, learner, objective = TABLE[preset]
    assert OmegaConf.to_container(cfg.defaults) == [{"override /rollout": rollout}]
    a = cfg.algo
    assert (a.name, a.learner_quant, a.objective) == (preset, learner, objective)
    params = OmegaConf.to_container(a.objective_params)
    obj = make_objective(a.objective, clip_eps=a.clip_eps, dual_clip=a.dual_clip, kl_coef=a.kl_coef, **params)
    assert params == type(obj).defaults            # every parameter spelled out, at the code's default
    assert (obj.clip_eps, obj.dual_clip, obj.kl_coef) == (0.2, 10.0, 0.001)


def test_presets_compose_under_hydra(tmp_path):
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    # a minimal primary config and stub rollout group (the real ones live elsewhere in conf/)
    shutil.copytree(CONF / "algo", tmp_path / "algo")
    (tmp_path / "rollout").mkdir()
    for name in ("bf16", "w8a8_kv8"):
        (tmp_path / "rollout" / f"{name}.yaml").write_text(f"name: {name}\n")
    (tmp_path / "config.yaml").write_text("defaults:\n  - rollout: bf16\n  - algo: grpo\n  - _self_\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        for preset, (rollout, learner, objective) in TABLE.items():
            cfg = compose("config", overrides=[f"algo={preset}"])
            assert (cfg.rollout.name, cfg.algo.learner_quant, cfg.algo.objective) == (rollout, learner, objective)
            cfg = compose("config", overrides=[f"algo={preset}", "rollout=bf16"])
            assert cfg.rollout.name == "bf16"           # the CLI wins over the preset
            make_objective(cfg.algo.objective, clip_eps=cfg.algo.clip_eps, dual_clip=cfg.algo.dual_clip,
                           kl_coef=cfg.algo.kl_coef, **cfg.algo.objective_params)
    GlobalHydra.instance().clear()
