"""The installed layout of the package for tools that read source files (imported by name: pytest
puts this folder on sys.path because it has no __init__.py).

setup.py installs the top-level folders envs/, kernels/, eval/ and conf/ as agentq.envs, ... ;
a type checker run on the checkout sees them only in a tree shaped like the installed package,
which `package_tree` builds from symlinks."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def folder_map() -> dict[str, str]:
    """setup.py's FOLDERS: package name → folder in the checkout (read, not executed)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FOLDERS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no FOLDERS mapping")


def package_tree(dest: Path) -> Path:
    """dest/agentq shaped like the installed package: agentq/'s entries plus a link per mapped folder.

    Returns:
        dest (the folder to run the tool in).
    """
    pkg = dest / "agentq"
    pkg.mkdir(parents=True)
    for entry in (REPO / "agentq").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in folder_map().items():
        if name != "agentq":
            (pkg / name.split(".", 1)[1]).symlink_to(REPO / folder)
    return dest
