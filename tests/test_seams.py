"""The store's parts and the service's facade share no hidden state (issue 32).

A class in ``delayq/storage/`` reads only what it defines itself (its methods, and the
attributes its own code sets: what it is given goes in through ``__init__``), so no part
leans on an attribute that another file declares. The facade's mixins (``delayq/facade/``)
read only the parts ``ServiceParts`` declares (set once by ``EventService._setup``) and
their own helpers, and set nothing. Pure Python (``ast``), no service.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "delayq"


def _classes(folder: str) -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted((ROOT / folder).glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [(path.name, n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    return found


def _self_attributes(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """The ``self.X`` names a class reads, and those it sets."""
    read, written = set(), set()
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            (written if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    return read, written


def _defined(cls: ast.ClassDef) -> set[str]:
    """Names the class body defines: methods, properties, class attributes."""
    names = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_every_store_part_reads_only_what_it_defines() -> None:
    checked = []
    for file, cls in _classes("storage"):
        if cls.bases:  # subclasses of redis-py's classes, exceptions, enums: not parts
            continue
        read, written = _self_attributes(cls)
        foreign = read - written - _defined(cls)
        assert not foreign, f"storage/{file}: {cls.name} reads {sorted(foreign)} it does not set"
        checked.append(cls.name)
    assert {"Store", "StoreCore", "Deliveries", "Enqueueing", "Layouts"} <= set(checked)


def test_facade_mixins_share_only_the_parts() -> None:
    parts = next(
        cls for _, cls in _classes("facade") if cls.name == "ServiceParts" and cls.body[1:]
    )
    declared = _defined(parts)
    mixins = [(f, c) for f, c in _classes("facade") if c.name.endswith("Mixin")]
    assert len(mixins) == 8
    for file, cls in mixins:
        assert [b.id for b in cls.bases if isinstance(b, ast.Name)] == ["ServiceParts"]
        read, written = _self_attributes(cls)
        assert not written, f"facade/{file}: {cls.name} sets {sorted(written)}"
        own = _defined(cls)
        foreign = read - declared - own
        assert not foreign, f"facade/{file}: {cls.name} reads {sorted(foreign)}"
        # a mixin's own helpers are private and used by that mixin alone
        assert all(n.startswith("_") or n in own for n in read - declared)
