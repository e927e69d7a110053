"""`placement=` configs: one schema for every mode, `single` as the default, bad values named; a
local Ray cluster started for a placement listens on loopback only."""
import os

import pytest

from agentq.config import ConfigError, load_config
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
    # were a torch.distributed traceback after the actors were up (-1), a timeout with Ray's resource table (0)
    ("placement.timeout_s=-1", "^placement.timeout_s=-1: must be > 0$"),
    ("placement.timeout_s=0", "^placement.timeout_s=0: must be > 0$"),
    ("placement.timeout_s=abc", "^placement.timeout_s=abc: must be > 0$"),
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


@pytest.mark.parametrize("address", [None, "auto"])
def test_placement_starts_a_local_ray_cluster_on_loopback_only(monkeypatch, address):
    """What `Placement` passes to ray.init (no cluster is started: a real one takes its time on two
    cores; tests/pool/test_ray_resources.py starts real ones): a local cluster gets the env pool's
    loopback setup, so its services listen on 127.0.0.1 only, as the README says."""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")          # restored after the test
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    checked = []          # a joined address is checked to answer first (tests/pool/test_ray_address.py)
    monkeypatch.setattr("agentq.pool.ray_pool.check_reachable", checked.append)
    monkeypatch.setattr("agentq.pool.ray_pool.announce_join", lambda *a: None)     # no cluster to name
    cfg = load_config(["placement=colocated", "ray.num_cpus=2", *([f"ray.address={address}"] if address else [])])
    p = Placement.__new__(Placement)
    p._start_ray(cfg)
    (kw,) = calls
    # a null address is Ray's "local" (a new cluster even where one runs), not Ray's None (join one)
    assert (kw["address"], kw["include_dashboard"], kw["log_to_driver"]) == (address or "local", False, False)
    if address is None:          # a local cluster: loopback only, and Ray's "no cluster" mode
        assert (kw["_node_ip_address"], kw["num_cpus"]) == ("127.0.0.1", 2)
        assert ray_constants.ENABLE_RAY_CLUSTER is False
        assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    else:                        # joining a running cluster: as given, once it answers
        assert "_node_ip_address" not in kw and kw["num_cpus"] is None and checked == [address]
        assert ray_constants.ENABLE_RAY_CLUSTER is True


def test_gpus_asked_of_a_cluster_without_one_is_a_config_error():
    """`placement.use_gpus=true` where the cluster has no GPU is the settings' fault: one line, not
    a traceback. (A stand-in for the cluster's resources: CI has no GPU cluster to ask.)"""
    from agentq.config import ConfigError

    p = Placement.__new__(Placement)
    p._ray = type("NoGPUs", (), {"cluster_resources": staticmethod(lambda: {"CPU": 2.0})})()
    assert p._resolve_gpus("auto") is False and p._resolve_gpus(False) is False
    with pytest.raises(ConfigError, match="placement.use_gpus=true but the Ray cluster has no GPU"):
        p._resolve_gpus(True)


def test_an_env_pools_own_cluster_settings_are_refused_with_a_ray_placement():
    """placement=split|colocated starts Ray first (ray.address, ray.num_cpus) and the env pool joins
    it: env_pool.address / env_pool.num_cpus set apart from ray.* were dropped without a word (a
    dead env_pool.address=127.0.0.1:1 ran normally). placement=single still reads them."""
    from agentq.trainer.placement import check_placement_config

    split = ["env_pool=ray", "placement=split", "placement.cpus_per_actor=0.5"]
    with pytest.raises(ConfigError, match=r"^env_pool.address='127.0.0.1:1' with placement=split: .* set "
                                          r"ray.address=127.0.0.1:1 instead$"):
        check_placement_config(load_config([*split, "env_pool.address=127.0.0.1:1"]))
    with pytest.raises(ConfigError, match=r"^env_pool.num_cpus=1 with placement=split: the placement starts Ray first, "
                                          r"with ray.num_cpus=None, .* set ray.num_cpus=1 instead$"):
        check_placement_config(load_config([*split, "env_pool.num_cpus=1"]))
    check_placement_config(load_config([*split, "ray.address=auto", "ray.num_cpus=2"]))    # the ray.* keys: read
    check_placement_config(load_config(["env_pool=ray", "env_pool.address=127.0.0.1:1"]))  # placement=single
