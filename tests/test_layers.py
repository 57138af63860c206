"""The package's import graph: no import circles, and no module imports from a layer above it.

The layer order is read from docs/ARCHITECTURE.md (the ```layers block under
"Layers"): one line per layer, lowest first, each naming modules or
subpackages of delayq (a subpackage covers every module in it; ``__init__``
is the package root). Every import counts, including those under
``TYPE_CHECKING`` and inside functions. Pure Python (``ast``), no service.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "delayq"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _exists(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or path.is_dir()


def import_graph() -> dict[str, set[str]]:
    """delayq module -> the delayq modules it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target == "delayq" or target.startswith("delayq."):
                    for alias in node.names:  # "from . import lua" imports a module
                        sub = f"{target}.{alias.name}"
                        deps.add(sub if _exists(sub) else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.split(".")[0] == "delayq")
        deps.discard(name)
        graph[name] = deps
    return graph


def declared_layers() -> list[list[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    match = re.search(r"```layers\n(.*?)```", text, re.S)
    assert match, "docs/ARCHITECTURE.md has no ```layers block"
    return [line.split() for line in match.group(1).splitlines() if line.strip()]


def layer_of(module: str, layers: list[list[str]]) -> int:
    rel = module.split(".")[1:] or ["__init__"]
    for index, names in enumerate(layers):
        for name in names:
            parts = name.split(".")
            if rel[: len(parts)] == parts:
                return index
    raise AssertionError(f"{module} is in no layer of docs/ARCHITECTURE.md")


def test_every_module_has_one_layer() -> None:
    layers = declared_layers()
    names = [n for line in layers for n in line]
    assert len(names) == len(set(names)), "a name appears in two layers"
    for module in import_graph():
        layer_of(module, layers)


def test_no_import_from_a_higher_layer() -> None:
    layers = declared_layers()
    upward = [
        f"{m} (layer {layer_of(m, layers)}) imports {d} (layer {layer_of(d, layers)})"
        for m, deps in sorted(import_graph().items())
        for d in sorted(deps)
        if layer_of(d, layers) > layer_of(m, layers)
    ]
    assert upward == []


def test_no_import_circles() -> None:
    graph = import_graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert circles == []


def test_each_subpackage_is_one_layer() -> None:
    dotted = [name for line in declared_layers() for name in line if "." in name]
    assert dotted == [], "a module placed apart from its subpackage"
