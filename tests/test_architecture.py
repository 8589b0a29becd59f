"""The package's shape, computed from its source: imports point down only, and no module
imports another that (directly or not) imports it back — function-level imports included.

docs/architecture.md draws the same picture in words; this test is what keeps it true.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ccm_guard

PACKAGE = Path(ccm_guard.__file__).resolve().parent

# Higher imports lower, never the other way; two packages on one rank never import each other.
RANK = {
    "cli": 9,
    "run": 8, "gc": 8,
    "worktree": 7, "copy": 7,
    "prevent": 6,
    "detect": 5,
    "pool": 4, "policy": 4,
    "state": 3,
    "git": 2, "pathrules": 2,
    "agent": 1, "warm": 1,
}
LEAVES = {"errors", "text", "failpoints", "clone", "files", "later", "progress", "digest", "caller"}  # anyone may use them; they use only each other
ENTRY_POINTS = {"__main__", "hookrun"}  # thin doors from outside: `python -m`, installed hooks


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> set[str]:
    """Every ccm_guard module this file imports, at the top or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ccm_guard."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("ccm_guard"):
                continue
            found.add(source)
            found.update(f"{source}.{a.name}" for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = {t for t in imports_of(path, name) if t in files and t != "ccm_guard"}
        # `from ccm_guard.git import refs` runs the package's __init__ too (unless it is the
        # importer's own package, which is already running).
        parents = {t.rsplit(".", 1)[0] for t in targets if t.count(".") > 1}
        edges[name] = (targets | {p for p in parents if not name.startswith(p + ".")}) - {name}
    return edges


def area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ccm_guard"


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "ccm_guard.git" in edges["ccm_guard.run.exec"], "the reader lost the imports it must see"


def test_imports_point_down() -> None:
    wrong = []
    for source, targets in graph().items():
        here = area(source)
        if here in ENTRY_POINTS or here == "ccm_guard":
            continue
        for target in targets:
            there = area(target)
            if there == here or there in LEAVES:
                continue
            if here in LEAVES or there not in RANK or RANK[there] >= RANK[here]:
                wrong.append(f"{source} -> {target}")
    assert not wrong, "imports that do not point down:\n" + "\n".join(sorted(wrong))


def test_no_import_circles() -> None:
    edges = graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)
