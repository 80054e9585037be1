"""No two modules of ferrollm import each other, directly or round a longer loop.

A circle works only while every import in it happens to run late enough (inside a function,
under TYPE_CHECKING), and it hides which module is the lower layer. The graph is read from the
source's syntax tree, so lazy and type-only imports count too; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "ferrollm"
#: Packages whose own circles are not this test's business: none (the server's app <-> openapi
#: pair was cut by moving `Route` to server/routing.py).
NOT_CHECKED: tuple[str, ...] = ()


def module_names(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``package``."""
    names = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the ferrollm modules it imports (any import statement anywhere in it)."""
    modules = module_names(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, name, path):
                if target == "ferrollm._core" or target.startswith("ferrollm._core."):
                    continue  # compiled, not in the graph, and it imports nothing back
                # `from ferrollm.platforms import cpu` names a module, `... import Platform`
                # a name in one: the longest module prefix is what gets imported.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _targets(node: ast.AST, module: str, path: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against the importing module's package
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_and_type_only_imports() -> None:
    graph = import_graph(PACKAGE)
    # Imported inside load_model_source / under TYPE_CHECKING respectively.
    assert "ferrollm.executor.loader_hf" in graph["ferrollm.executor.loader"]
    assert "ferrollm.platforms" in graph["ferrollm.config"]
    # The checker itself finds a circle when there is one.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    graph = import_graph(PACKAGE)
    found = [c for c in cycles(graph) if not all(m.startswith(NOT_CHECKED) for m in c)]
    assert not found, f"modules that import each other: {found}"
