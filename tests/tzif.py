"""Private time zones for tests: write a TZif file (RFC 8536) whose offset changes when the
test wants, and make :mod:`zoneinfo` find it by name.

Imported by the ``test_*`` modules as ``tzif`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import struct
import uuid
import zoneinfo
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def tzif_bytes(initial: tuple[int, str], changes: Sequence[tuple[int, int, str]]) -> bytes:
    """A version 2 TZif file: UTC offset ``initial[0]`` (seconds, named ``initial[1]``)
    until the first change, then each ``(unix second, offset, name)`` from its second on.

    No footer rule: the last offset holds for ever after.
    """
    types: list[tuple[int, str]] = [initial]
    indexes: list[int] = []
    for _, offset, name in changes:
        if (offset, name) not in types:
            types.append((offset, name))
        indexes.append(types.index((offset, name)))
    names = b""
    where: dict[str, int] = {}
    for _, name in types:
        if name not in where:
            where[name] = len(names)
            names += name.encode() + b"\0"

    def block(time_format: str) -> bytes:
        counts = (0, 0, 0, len(changes), len(types), len(names))  # isut, isstd, leap, ...
        out = b"TZif2" + b"\0" * 15 + struct.pack(">6l", *counts)
        out += b"".join(struct.pack(f">{time_format}", at) for at, _, _ in changes)
        out += bytes(indexes)
        # isdst: the first offset is standard time, a larger one is daylight time
        out += b"".join(
            struct.pack(">lbb", offset, int(offset > initial[0]), where[name])
            for offset, name in types
        )
        return out + names

    return block("l") + block("q") + b"\n\n"


@contextmanager
def private_zone(
    directory: Path, initial: tuple[int, str], changes: Sequence[tuple[int, int, str]]
) -> Iterator[str]:
    """Write a zone under ``directory``, put it first on zoneinfo's search path, and yield
    its IANA-style name (unique, so no cache of an earlier test's zone is ever hit)."""
    key = f"Delayq/Test{uuid.uuid4().hex[:8]}"
    path = directory / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tzif_bytes(initial, changes))
    saved = zoneinfo.TZPATH
    zoneinfo.reset_tzpath(to=[str(directory), *saved])
    try:
        yield key
    finally:
        zoneinfo.reset_tzpath(to=saved)
