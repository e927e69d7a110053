"""`placement=` configs: one schema for every mode, `single` as the default, bad values named."""
import pytest

from agentq.config import load_config
from agentq.trainer.placement import Placement


def test_placement_modes_share_one_schema_and_single_is_the_default():
    assert load_config([]).placement.mode == "single"
    keys = {m: set(load_config([f"placement={m}"]).placement.keys()) for m in ("single", "colocated", "split")}
    assert keys["single"] == keys["colocated"] == keys["split"]
    assert load_config(["env_pool=ray", "ray.address=auto"]).env_pool.address == "auto"


@pytest.mark.parametrize("override,match", [
    ("placement.mode=cluster", "placement.mode='cluster'; valid: \\['single', 'colocated', 'split'\\]"),
    ("placement.weight_sync=nccl", "placement.weight_sync='nccl'; valid: \\['object_store'\\]"),
    ("placement.strategy=RANDOM", "placement.strategy='RANDOM'; valid"),
    ("placement.learner_ranks=0", "placement.learner_ranks=0: must be ≥ 1"),
])
def test_bad_placement_values_are_named(override, match):
    cfg = load_config(["placement=split", override])
    with pytest.raises(ValueError, match=match):
        Placement(cfg)           # refused before any Ray cluster starts


def test_bundles_per_mode():
    p = Placement.__new__(Placement)       # the layout only (no cluster)
    p.rollout_workers, p.learner_ranks, p.cpus, p.use_gpus = 2, 3, 0.5, True
    p.mode = "split"
    assert p.bundles() == [{"CPU": 0.5, "GPU": 1.0}] * 5 and p.rank_bundle(0) == 2
    p.mode = "colocated"
    assert p.bundles() == [{"CPU": 1.0, "GPU": 1.0}] * 3 and p.rank_bundle(0) == 0 and p.engine_bundle(1) == 1
