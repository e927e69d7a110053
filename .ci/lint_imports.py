#!/usr/bin/env python3
"""Check the import layers (the contracts in pyproject.toml) with import-linter, seeing every package.

`agentq.envs`, `agentq.kernels`, `agentq.eval` and `agentq.conf` live in the top-level folders
`envs/ kernels/ eval/ conf/` (setup.py maps them into the `agentq` namespace). Tools that walk a
package's folder on disk, like import-linter, would see `agentq/` alone and miss every edge into or
out of those folders. So this builds the installed layout in a temporary folder (one symlink per
source file, folders as setup.py maps them) and runs `lint-imports` there.

    python .ci/lint_imports.py            # exit status 0: every contract kept
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_folders(setup_py: Path = REPO / "setup.py") -> dict[str, str]:
    """setup.py's FOLDERS: package name → folder relative to the checkout (one source of truth)."""
    for node in ast.parse(setup_py.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FOLDERS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{setup_py}: no FOLDERS = {{...}} assignment")


def mirror(dest: Path, folders: dict[str, str]) -> None:
    """Symlink every .py file of each mapped folder to where the package name puts it under `dest`."""
    for name, folder in folders.items():
        src = REPO / folder
        for root, dirs, files in os.walk(src):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            out = dest / Path(*name.split(".")) / Path(root).relative_to(src)
            out.mkdir(parents=True, exist_ok=True)
            for f in files:
                if f.endswith(".py"):
                    (out / f).symlink_to(Path(root) / f)


def lint_command(*args: str) -> list[str]:
    """`lint-imports` of this interpreter's environment (also when its bin/ is not on PATH)."""
    exe = Path(sys.executable).parent / "lint-imports"
    return [str(exe) if exe.exists() else "lint-imports", str(REPO / "pyproject.toml"), "--no-cache", *args]


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="agentq-imports-") as tmp:
        mirror(Path(tmp), package_folders())
        env = {**os.environ, "PYTHONPATH": tmp}
        # run in the mirror: import-linter puts its working folder first on sys.path
        return subprocess.run(lint_command(*argv), cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
