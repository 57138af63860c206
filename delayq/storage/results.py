"""Reading kept outcomes of types that keep results (``results=``), and their wake-ups."""

from __future__ import annotations

from collections.abc import Sequence

from .base import StoreCore

__all__ = ["OutcomeReads"]


class OutcomeReads:
    """The kept outcomes of one shard, read in one atomic step (result_get.lua)."""

    def __init__(self, core: StoreCore):
        self._core = core

    async def outcomes(self, shard: str, ids: Sequence[str]) -> list[tuple[str, bytes]]:
        """Per id ``(state, data)``: ``"o"``/``"f"`` with the kept record, ``"d"`` with a
        dead letter's error, ``"p"`` pending, ``"m"`` missing (see result_get.lua)."""
        if not ids:
            return []
        reply = await self._core.run("result_get", shard, list(ids))
        out = []
        for state, data in reply:
            st = state.decode() if isinstance(state, bytes) else str(state)
            out.append((st, data if isinstance(data, bytes) else str(data).encode()))
        return out
