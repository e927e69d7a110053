"""An environment from outside agentq: the worked example of docs/adding-an-environment.md, built
from that page into a temporary folder, found as a plugin (entry points) and as "module:Class",
trained 2 RL steps, evaluated and fine-tuned on its expert's demonstrations through the `agentq`
command. agentq's own tree is not touched."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from gymnasium.utils.env_checker import check_env

from conftest import REPO, one_task_env, run_cli

DOC = REPO / "docs" / "adding-an-environment.md"


def _doc_files() -> dict[str, str]:
    """The doc's code blocks whose first line is `# file: <path>`."""
    blocks = re.findall(r"```\w*\n# file: (\S+)\n(.*?)```", DOC.read_text(), flags=re.S)
    return {path: body for path, body in blocks}


def _entry_points(pyproject: str) -> str:
    """entry_points.txt as pip would write it from the example's pyproject.toml."""
    import tomllib

    eps = tomllib.loads(pyproject)["project"]["entry-points"]
    return "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
                   for group, items in eps.items())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder that, on sys.path / PYTHONPATH, holds the example package and its dist-info (the
    metadata `pip install` writes: importlib.metadata finds the entry points there)."""
    files = _doc_files()
    assert set(files) == {"guess_env/__init__.py", "guess_env/conf/env/guess.yaml", "pyproject.toml"}
    root = tmp_path_factory.mktemp("site")
    for path in ("guess_env/__init__.py", "guess_env/conf/env/guess.yaml"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(files[path])
    (root / "guess_env" / "conf" / "__init__.py").write_text("")
    info = root / "guess_env-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: guess-env\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(_entry_points(files["pyproject.toml"]))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout


def test_plugin_and_module_class_routes_make_the_env(site):
    import agentq.envs as envs
    from agentq.config import load_config

    assert envs.plugins()["guess"] == "guess_env:GuessEnv"
    assert envs.env_id("guess") == "plugin/guess"
    assert envs.env_id("guess_env:GuessEnv") == "ext/guess_env.GuessEnv"
    env = envs.make("guess_env:GuessEnv", split="test", expert=True)
    check_env(env.unwrapped)
    obs, info = env.reset(options={"task_id": "16/401"})        # target 1 + 401·7919 mod 16 = 16
    assert obs == "I am thinking of a number between 1 and 16." and info["task_type"] == "range16"
    actions = []
    while True:
        actions.append(info["expert_action"])
        obs, reward, term, trunc, info = env.step(actions[-1])
        if term or trunc:
            break
    assert actions == ["guess 8", "guess 12", "guess 14", "guess 15", "guess 16"] and reward == 1.0 and info["won"]
    env.close()
    # the plugin's config package joins Hydra's search path by itself; a folder can also be given
    assert load_config(["env=guess"]).env.name == "guess"
    conf = load_config(["env=guess", "env.name=guess_env:GuessEnv",
                        f"hydra.searchpath=[file://{site / 'guess_env' / 'conf'}]"])
    assert conf.env.name == "guess_env:GuessEnv" and conf.env.max_steps == 6
    with pytest.raises(Exception, match="plugins: \\['guess'\\]"):
        envs.env_id("gues")
    with pytest.raises(TypeError, match="not an agentq TextEnv"):
        envs.make("gymnasium.envs.classic_control:CartPoleEnv")


PROBE = """
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv
from agentq.envs import TaskStep, TextEnv
""" + one_task_env("Tiny", ("train",)) + """

class Hookless(TextEnv):
    def _tasks(self, split):
        return ["a"]


NOT_A_CLASS = 3
gym.register(id="agentq_probe_ns/Tiny-v0", entry_point=Tiny)
gym.register(id="agentq_probe_ns/Cart-v0", entry_point=CartPoleEnv)
"""


def test_registry_takes_namespaced_ids_and_checks_classes_on_registration(tmp_path, monkeypatch):
    """`module:namespace/Id-vN` (what gymnasium.make takes) is accepted; `module:Class` must be a
    TextEnv subclass implementing the hooks, checked when the name is resolved (a TypeError naming
    it), not at the first construction in an env worker."""
    import gymnasium as gym

    import agentq.envs as envs

    (tmp_path / "agentq_registry_probe.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert envs.env_id("agentq_registry_probe:agentq_probe_ns/Tiny-v0") == "agentq_probe_ns/Tiny-v0"
    env = envs.make("agentq_registry_probe:agentq_probe_ns/Tiny-v0")
    assert env.reset(seed=0)[0] == "start" and env.step("go")[4]["won"]
    assert envs.env_id("agentq_registry_probe:Tiny") == "ext/agentq_registry_probe.Tiny"
    for entry, error in [("gymnasium.envs.classic_control:CartPoleEnv", "is CartPoleEnv, not an agentq TextEnv"),
                         ("agentq_registry_probe:NOT_A_CLASS", "is 3 \\(of type int\\), not an agentq TextEnv"),
                         ("agentq.envs:TextEnv", "is TextEnv, which does not implement .*'_tasks'"),
                         ("agentq_registry_probe:Hookless", "does not implement the TextEnv hook\\(s\\) "
                                                            "\\['_reset_task', '_step_task'\\]"),
                         ("agentq_registry_probe:agentq_probe_ns/Cart-v0", "is CartPoleEnv, not an agentq TextEnv")]:
        with pytest.raises(TypeError, match=error):
            envs.env_id(entry)
        module, _, attr = entry.partition(":")
        assert f"ext/{module}.{attr}" not in gym.registry              # a refused class stays unregistered


def test_a_module_that_cannot_be_imported_says_how_to_fix_it_or_where(tmp_path, monkeypatch, capsys):
    """`No module named 'x'` alone: for the env's own module it gave no hint (the guide's step of
    putting its folder on PYTHONPATH), for one its code imports no file or line."""
    from agentq.cli import main

    pkg = tmp_path / "lacks_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "env.py").write_text("from agentq.envs import TextEnv\n\nimport agentq_no_such_dependency  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hint = "; put its folder on PYTHONPATH or pip install its package (docs/adding-an-environment.md)"
    for name, said in [("agentq_no_such_env:Env", f"No module named 'agentq_no_such_env'{hint}"),
                       ("agentq_no_such_pkg.env:Env", f"No module named 'agentq_no_such_pkg'{hint}"),
                       ("lacks_pkg.nothing_here:Env", f"No module named 'lacks_pkg.nothing_here'{hint}"),
                       ("lacks_pkg.env:Env", "No module named 'agentq_no_such_dependency' (raised at env.py:3)")]:
        assert main(["config", f"env.name={name}"]) == 2
        assert capsys.readouterr().err.strip() == f"agentq: env.name={name!r}: {said}", name


def test_a_plugin_named_like_a_built_in_is_not_hidden_silently(tmp_path, monkeypatch):
    """A plugin `alfworld` resolved to agentq's ALFWorld without a word. The built-in still wins (a
    run's env.name keeps its meaning whatever is installed), but resolving the name warns, naming the
    plugin's "module:Class", which picks it."""
    import warnings

    import agentq.envs as envs

    (tmp_path / "shadow_env.py").write_text("from agentq.envs import TaskStep, TextEnv\n"
                                            + one_task_env("ShadowEnv", ("train",)))
    info = tmp_path / "shadow_env-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow-env\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[agentq.envs]\nalfworld = shadow_env:ShadowEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    envs.refresh_plugins()                        # a rerun in this process warns again
    assert envs.plugins()["alfworld"] == "shadow_env:ShadowEnv"
    with pytest.warns(UserWarning) as caught:
        assert [envs.env_id("alfworld") for _ in range(3)] == ["agentq/ALFWorld-v0"] * 3    # a config load: several
    assert [str(w.message) for w in caught] == [                                       # once
        "environment 'alfworld' is agentq's built-in environment agentq/ALFWorld-v0; the installed plugin of that "
        "name (shadow_env:ShadowEnv, entry point of group 'agentq.envs') is not used: set "
        "env.name=shadow_env:ShadowEnv to use the plugin"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                               # no plugin of these names: no warning
        assert envs.env_id("webshop") == "agentq/WebShop-v0"
        assert envs.env_id("shadow_env:ShadowEnv") == "ext/shadow_env.ShadowEnv"     # the named form picks it


def test_the_plugin_scan_is_read_once_per_path(tmp_path, monkeypatch):
    """`env_id` read every installed package's entry points (~4 ms) on each lookup, a built-in name's
    too. One scan per sys.path now: a folder put on the path (a test's plugin) is scanned then, and
    `refresh_plugins` rescans one installed into a folder already scanned."""
    import importlib.metadata

    import agentq.envs as envs

    scans = []
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: scans.append(kw) or real(**kw))
    envs.refresh_plugins()
    assert [envs.env_id("textworld_express") for _ in range(50)] == ["agentq/TextWorldExpress-v0"] * 50
    assert scans == [{"group": "agentq.envs"}] and "late" not in envs.plugins()
    monkeypatch.syspath_prepend(str(tmp_path))                   # a new folder on the path: scanned once
    assert "late" not in envs.plugins() and envs.env_id("alfworld") == "agentq/ALFWorld-v0" and len(scans) == 2
    info = tmp_path / "late_env-0.1.0.dist-info"                  # installed into that folder afterwards
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: late-env\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[agentq.envs]\nlate = late_env:LateEnv\n")
    assert "late" not in envs.plugins() and len(scans) == 2       # the cached scan
    envs.refresh_plugins()
    assert envs.plugins()["late"] == "late_env:LateEnv" and len(scans) == 3


def test_plugin_trains_two_steps_and_evaluates_from_the_cli(site, tmp_path):
    before = _git_status()
    out = tmp_path / "run"
    env = {"PYTHONPATH": str(site)}
    p = run_cli(["train", "env=guess", "trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2",
                 "trainer.eval_num_tasks=4", "env_pool.num_workers=1", f"trainer.out_dir={out}"], extra_env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2]
    final = json.loads((out / "eval" / "step_000002" / "eval.json").read_text())
    assert final["episodes"] == 4 and final["env"] == "guess"
    assert final["task_selection"]["per_type"] == {"range16": [2, 40], "range8": [2, 40]}
    p = run_cli(["eval", f"checkpoint={out / 'checkpoints' / 'step_000002'}", "env=guess", "eval.num_tasks=6",
                 "env_pool.num_workers=1", f"eval.out_dir={tmp_path / 'ev'}"], extra_env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert rep["episodes"] == 6 and set(rep["per_task_type"]) <= {"range8", "range16"}
    assert _git_status() == before                               # agentq's tree untouched


def test_plugin_sft_learns_from_its_expert_from_the_cli(site, tmp_path):
    """The guide's `agentq sft` / `agentq pipeline` need the example's expert: every demonstration is
    played by it and won, none lost."""
    out = tmp_path / "sft"
    p = run_cli(["sft", "env=guess", "sft.num_demos=6", "sft.epochs=1", "sft.batch_size=2", "env_pool.num_workers=1",
                 f"sft.out_dir={out}"], extra_env={"PYTHONPATH": str(site)})
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "sft_summary.json").read_text())
    assert [summary[k] for k in ("demos_collected", "demos_won", "demos_lost", "demos_not_won", "demos_used")] == \
        [6, 6, 0, 0, 6]
    assert (out / "checkpoint" / "config.json").exists()


def test_the_example_pyproject_installs_only_its_package(site):
    """`agentq train` run in the package's folder writes runs/; setuptools' automatic discovery then
    refused to (re)install ("Multiple top-level packages discovered in a flat-layout"). The example
    names its packages, the config folder among them."""
    import tomllib

    from setuptools import find_packages

    found = tomllib.loads(_doc_files()["pyproject.toml"])["tool"]["setuptools"]["packages"]["find"]
    (site / "runs" / "guess-grpo").mkdir(parents=True)
    assert sorted(find_packages(str(site), include=found["include"])) == ["guess_env", "guess_env.conf"]
