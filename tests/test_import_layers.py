"""The import layers of ARCHITECTURE.md (pyproject.toml's import-linter contract), as CI checks them.

`.ci/lint_imports.py` runs import-linter over the installed layout (envs/, kernels/, eval/ mapped
into `agentq`); these tests run it on the checkout, show it catches an upward import into a remapped
folder, and check the contract names every package and every module of eval/.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location("lint_imports", REPO / ".ci" / "lint_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _layer_modules() -> set[str]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = cfg["contracts"]
    return {m.strip() for layer in contract["layers"] for m in layer.replace(":", "|").split("|")}


def _lint(tmp_path: Path, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    runner = _runner()
    runner.mirror(tmp_path, runner.package_folders())
    for rel, text in (extra or {}).items():
        (tmp_path / rel).unlink(missing_ok=True)       # a symlink into the checkout: never write through it
        (tmp_path / rel).write_text(text)
    return subprocess.run(runner.lint_command(), cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=300)


def test_layers_kept():
    r = subprocess.run([sys.executable, str(REPO / ".ci" / "lint_imports.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 kept, 0 broken" in r.stdout


def test_upward_import_from_a_remapped_folder_fails(tmp_path):
    """kernels/ (agentq.kernels, bottom layer) importing the trainer, and one eval script importing
    another: both reported, so the check sees the folders setup.py maps into `agentq`."""
    r = _lint(tmp_path, {"agentq/kernels/_upward.py": "from agentq.trainer import rl\n",
                         "agentq/eval/bench_webshop.py": "from agentq.eval import bench_engine\n"})
    assert r.returncode != 0, r.stdout
    assert "agentq.kernels._upward -> agentq.trainer.rl" in r.stdout
    assert "agentq.eval.bench_webshop -> agentq.eval.bench_engine" in r.stdout


def test_contract_names_every_package_and_eval_module():
    named = _layer_modules()
    folders = _runner().package_folders()
    packages = {f"agentq.{p.stem}" for p in (REPO / "agentq").iterdir()
                if p.name != "__init__.py" and p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir())}
    packages |= {n for n in folders if n not in ("agentq", "agentq.eval", "agentq.conf")}
    eval_modules = {f"agentq.eval.{p.stem}" for p in (REPO / folders["agentq.eval"]).glob("*.py")
                    if p.name != "__init__.py"}
    assert packages - named == set(), "packages the layer contract in pyproject.toml does not place"
    assert eval_modules - named == set(), "eval/ modules the contract names neither library nor script"
