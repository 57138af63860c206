"""The default delivery group by its two names: ``None`` inside the library (the store, the
runtime: the type's own keys), ``"default"`` where groups are named (the registry, labels,
the dashboard and the CLI). These functions are the one place that tells them apart.
"""

from __future__ import annotations

__all__ = ["DEFAULT_GROUP", "group_name", "labelled", "stored_group"]

DEFAULT_GROUP = "default"
"""The delivery group of handlers added without a ``group``: it uses the type's own keys."""


def stored_group(group: str | None) -> str | None:
    """A group as the library holds it: None for the default group (``None`` or ``"default"``)."""
    return None if group is None or group == DEFAULT_GROUP else group


def group_name(group: str | None) -> str:
    """A group as it is named: ``"default"`` for the default group (``None`` or ``""``)."""
    return group or DEFAULT_GROUP


def labelled(name: str, group: str | None) -> str:
    """``name`` for the default group, ``name:group`` for a named one (how heartbeats and
    labels without a group name a type's handler; type names hold no ``:``)."""
    return name if stored_group(group) is None else f"{name}:{group}"
