"""Ray env actors import a `module:Class` env that the trainer finds only through its own sys.path
(a module beside the user's script, a `sys.path.insert`), when agentq starts the local cluster; on a
cluster agentq did not start they say in one line which module they cannot import.

The env module is written into a temporary folder that is put on this process's sys.path only (not
on the PYTHONPATH this test runs with, which the cluster's processes would inherit)."""
from __future__ import annotations

import os
import sys

import pytest

from agentq.pool import EnvSpec, make_pool
from agentq.pool.ray_pool import driver_import_paths, keep_local_cluster_on_loopback, ray_init_kwargs

ray = pytest.importorskip("ray")

MODULE = "agentq_test_sys_path_env"       # a name no installed package uses
PLUGIN = '''
import os
from agentq.envs import TaskStep, TextEnv


class SysPathEnv(TextEnv):
    def _tasks(self, split):
        return ["a", "b"]

    def _reset_task(self, task_id, split):
        return "goal", TaskStep(obs=f"sys.path env starts {task_id}")

    def _step_task(self, action):
        return TaskStep(obs=f"sys.path env heard {action!r} in pid {os.getpid()}")
'''
NAME = f"{MODULE}:SysPathEnv"


@pytest.fixture
def plugin_on_sys_path(tmp_path, monkeypatch):
    """The plugin's folder, on this process's sys.path only; Ray is down before and after."""
    (tmp_path / f"{MODULE}.py").write_text(PLUGIN)
    assert str(tmp_path) not in os.environ.get("PYTHONPATH", "")
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield tmp_path
    finally:
        if ray.is_initialized():
            ray.shutdown()
        sys.modules.pop(MODULE, None)


def test_driver_import_paths_hold_the_drivers_own_folders_only(plugin_on_sys_path, monkeypatch):
    paths = driver_import_paths()
    assert paths[0] == str(plugin_on_sys_path)
    assert not [p for p in paths if "site-packages" in p or p.startswith(sys.base_prefix)], paths
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    env = ray_init_kwargs(None)["runtime_env"]["env_vars"]["PYTHONPATH"].split(os.pathsep)
    assert env[0] == str(plugin_on_sys_path) and env[-1] == "/inherited"
    assert "runtime_env" not in ray_init_kwargs("auto")       # a joined cluster is left as it is


def play(pool) -> list[str]:
    starts = pool.reset([(s, {"options": {"task_id": "ab"[s]}}) for s in (0, 1)])
    steps = pool.step([(0, "left"), (1, "right")])
    assert all(r.ok for r in starts + steps), [r.error for r in starts + steps]
    return [r.obs for r in starts] + [r.obs.rsplit(" in pid ", 1)[0] for r in steps]


def test_a_local_cluster_started_by_agentq_imports_an_env_from_the_drivers_sys_path(plugin_on_sys_path):
    from agentq import envs

    assert envs.env_class(NAME).__name__ == "SysPathEnv"      # the trainer resolves env.name so
    pool = make_pool("ray", EnvSpec(NAME, {}), 2, num_workers=2, num_cpus=2, call_timeout_s=60, start_timeout_s=120)
    try:
        assert play(pool) == ["sys.path env starts a", "sys.path env starts b",
                              "sys.path env heard 'left'", "sys.path env heard 'right'"]
        pids = {int(r.obs.rsplit(" ", 1)[1]) for r in pool.step([(0, "x"), (1, "y")])}
        assert os.getpid() not in pids                      # it ran in the actors, not here
    finally:
        pool.close()


def test_an_actor_that_cannot_import_the_env_names_the_module(plugin_on_sys_path):
    """A cluster agentq did not start (as one joined with `address`) keeps its own import path."""
    keep_local_cluster_on_loopback()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    with pytest.raises(RuntimeError) as error:
        make_pool("ray", EnvSpec(NAME, {}), 2, num_workers=2, call_timeout_s=60, start_timeout_s=120)
    message = str(error.value)
    assert "\n" not in message, message
    assert (f"env actor 0 failed to start ({NAME}): ModuleNotFoundError: env {NAME!r}: cannot import module "
            f"{MODULE!r} on Ray node 127.0.0.1; the env class (and what it imports) must be importable on every "
            "Ray node") in message, message
