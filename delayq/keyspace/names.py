"""Names that become part of Redis keys: prefixes, event type names, sink and schedule names.

Every such name sits inside a hash tag (``{prefix:type}``) or after one, so what it may
hold is part of the key layout.
"""

from __future__ import annotations

__all__ = ["validate_name"]

_MAX_NAME_LENGTH = 200


def validate_name(name: object, what: str = "event type name") -> str:
    """Return ``name`` if it can be used inside a Redis hash tag, else raise ``ValueError``.

    Braces would break the ``{prefix:type}`` hash tag that keeps a type's keys in
    one cluster slot, so they are refused, as are empty and very long names.
    Event type names may not contain ``:`` either (prefixes may): type ``b:c``
    under prefix ``a`` would share every key with type ``c`` under prefix ``a:b``.
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    if not name or len(name) > _MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be 1 to {_MAX_NAME_LENGTH} characters long: {name!r}")
    if "{" in name or "}" in name or any(ch.isspace() or not ch.isprintable() for ch in name):
        raise ValueError(
            f"{what} may not contain braces, whitespace or control characters: {name!r}"
        )
    if what != "prefix" and ":" in name:
        raise ValueError(
            f"{what} may not contain ':' (it would share keys with another prefix's type): {name!r}"
        )
    if what == "event type name" and "#" in name:
        raise ValueError(
            f"{what} may not contain '#' (it names the partitions of a type): {name!r}"
        )
    return name
