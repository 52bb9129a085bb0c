"""The layering rule of ARCHITECTURE.md, read from the code's own imports (ast, no import run):
no package imports a higher one, and no two modules import each other, directly or round a
circle. Lazy imports inside functions count too: they hide a dependency, they do not remove it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "accdbg"

# lower numbers are lower layers; a module may import its own layer and the ones below
LAYERS = {
    "errors": 0,
    "core": 0,
    "mapping": 1,
    "frameworks": 1,
    "reports": 1,
    "verifiers": 2,
    "encodings": 2,
    "engines": 3,
    "inspection": 3,
    "algorithms": 4,
    "cli": 5,
}


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _trees() -> dict[str, ast.Module]:
    return {
        _module(p): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))
    }


def _imports() -> dict[str, set[str]]:
    """module -> the accdbg modules it imports (``from accdbg.x import y`` counts ``accdbg.x.y``
    when that is a module, else ``accdbg.x``)."""
    files = _trees()
    out: dict[str, set[str]] = {}
    for name, tree in files.items():
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("accdbg")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if not node.module.startswith("accdbg"):
                    continue
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if sub in files else node.module)
        out[name] = {m for m in found if m in files and m != name}
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_no_package_imports_a_higher_one():
    upward = [
        f"{m} -> {d}"
        for m, deps in _imports().items()
        for d in deps
        if _layer(m) is not None and _layer(d) is not None and _layer(d) > _layer(m)
    ]
    assert upward == []


@pytest.mark.parametrize("lazy", [False, True], ids=["module-level", "with-lazy"])
def test_no_import_circle_between_modules(lazy):
    graph = every = _imports()
    if not lazy:  # module-level imports only: what runs when a module is imported
        graph = {}
        for name, tree in _trees().items():
            found = set()
            for node in tree.body:
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and node.module.startswith("accdbg")
                ):
                    found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
                elif isinstance(node, ast.Import):
                    found |= {a.name for a in node.names}
            graph[name] = {m for m in found if m in every and m != name}
    # a package's __init__ re-exporting its modules is not a circle of the modules themselves
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d) :] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []


MAX_FUNCTION_LINES = 150  # the style guide's bound: a function one reads on a screen or two


def test_no_function_is_longer_than_the_bound():
    """Every function of ``accdbg/``, signature and docstring included, within the bound."""
    long = [
        f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for name, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []
