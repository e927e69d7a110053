"""Every library function is at most 50 lines (def line to last line, docstring and nested
functions included), read with `ast` over agentq/, envs/, kernels/ and eval/.

Not counted: scripts (modules of eval/ with a `__main__` guard: benchmarks, data preparation) and
`@triton.jit` kernels: a kernel compiles to one GPU program, and its body stays whole so the tiling
and the order of floating-point operations that the bit-exact tests pin read in one place.
"""
from __future__ import annotations

import ast
from pathlib import Path

from layout import REPO

MAX_LINES = 50
FOLDERS = ("agentq", "envs", "kernels", "eval")


def _is_script(tree: ast.Module, path: Path) -> bool:
    return path.parts[0] == "eval" and any(
        isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def _is_triton_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("triton.jit" in ast.unparse(d) for d in fn.decorator_list)


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, def node) of every function in `node`, outermost first (nested ones are
    counted in their parent, not again)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
        elif isinstance(child, (ast.ClassDef, ast.If, ast.Try, ast.With)):
            yield from _functions(child, prefix + child.name + "." if isinstance(child, ast.ClassDef) else prefix)


def long_functions(repo: Path = REPO, max_lines: int = MAX_LINES) -> dict[str, int]:
    """'path:Qualified.name' → lines, for every library function longer than `max_lines`."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((repo / folder).rglob("*.py")):
            rel = path.relative_to(repo)
            tree = ast.parse(path.read_text(), str(rel))
            if _is_script(tree, rel):
                continue
            for name, fn in _functions(tree):
                lines = fn.end_lineno - fn.lineno + 1
                if lines > max_lines and not _is_triton_kernel(fn):
                    out[f"{rel.as_posix()}:{name}"] = lines
    return out


def test_no_library_function_is_longer_than_50_lines():
    assert long_functions() == {}


def test_the_checker_counts_def_to_last_line(tmp_path):
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
    body = [f"    x{i} = {i}" for i in range(50)]
    (tmp_path / "agentq" / "m.py").write_text("\n".join(
        ["def short():", *body[:49], "", "", "class C:", "    def long(self):", *["    " + b for b in body]]) + "\n")
    assert long_functions(tmp_path) == {"agentq/m.py:C.long": 51}        # short: 50 lines, allowed
