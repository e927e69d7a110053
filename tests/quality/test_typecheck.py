"""mypy over the whole `agentq` package at the strictness stated in pyproject.toml ([tool.mypy])."""
from __future__ import annotations

import subprocess
import sys

import pytest
from layout import REPO, package_tree


@pytest.mark.timeout(900)
def test_mypy_passes_on_agentq(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    root = package_tree(tmp_path / "tree")
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                          "--cache-dir", str(tmp_path / "cache"), "-p", "agentq"],
                         cwd=root, capture_output=True, text=True, timeout=880)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Success" in out.stdout
