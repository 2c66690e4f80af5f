"""The code's shape, as issue 31 measures it: files over 900 lines, functions over 150, and import
cycles among Frenzy's own modules (a cycle through a package's ``__init__`` counts: a module that
imports its own package's names, ``from marp import X``, while that ``__init__`` imports it).

    .venv/bin/python scripts/structure.py          # JSON: long files, long functions, cycles

Pure static reading (ast), nothing is imported. An import inside a function or under
``if TYPE_CHECKING:`` is not an edge: it runs later or never, so it cannot make a cycle at
import time. tests/unit/test_structure.py holds the line: nothing new over the limits, and the
known offenders (listed there) never grow.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Source root -> import name (pyproject's package-dir).
ROOTS = {"libs/marp": "marp", "libs/has": "has", "services": "frenzy"}
MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 150
SKIP = ("services/v1/",)  # generated protobuf code


def modules() -> dict[str, Path]:
    """Import name -> file, for every module of the three roots."""
    found = {}
    for root, name in ROOTS.items():
        base = ROOT / root
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(rel.startswith(s) for s in SKIP) or "__pycache__" in rel or "/build/" in rel:
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([name, *parts])] = path
    return found


def long_files() -> dict[str, int]:
    out = {}
    for path in modules().values():
        n = len(path.read_text().splitlines())
        if n > MAX_FILE_LINES:
            out[path.relative_to(ROOT).as_posix()] = n
    return dict(sorted(out.items()))


def long_functions() -> dict[str, int]:
    out = {}
    for path in modules().values():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = n
    return dict(sorted(out.items()))


def _top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """Import statements that run when the module is imported: at module level, not under
    ``if TYPE_CHECKING:``, including those in a module-level try/if."""
    found: list[ast.stmt] = []

    def walk(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                found.append(stmt)
            elif isinstance(stmt, ast.If):
                test = stmt.test
                if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                    walk(stmt.orelse)
                    continue
                walk(stmt.body)
                walk(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                walk(stmt.body)
                for handler in stmt.handlers:
                    walk(handler.body)
                walk(stmt.orelse)
                walk(stmt.finalbody)

    walk(tree.body)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        for stmt in _top_level_imports(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - stmt.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in stmt.names]
            for target in targets:
                # The module named, not its parent packages: importing a.b.c from inside package a
                # finds a half-initialised in sys.modules and goes on, whereas `from a import x`
                # (or `import a` then a.x at import time) needs a's __init__ to have run that far.
                if target in mods and target != name:
                    graph[name].add(target)
    return graph


def cycles() -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def main() -> None:
    print(json.dumps({"max_file_lines": MAX_FILE_LINES, "max_function_lines": MAX_FUNCTION_LINES,
                      "long_files": long_files(), "long_functions": long_functions(), "import_cycles": cycles()},
                     indent=1))


if __name__ == "__main__":
    main()
