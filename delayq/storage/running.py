"""Running handlers: their progress, and the signal that cancels one wherever it runs."""

from __future__ import annotations

from collections.abc import Sequence

from ..keyspace.groups import stored_group
from .base import StoreCore

__all__ = ["RunControl", "cancel_message", "parse_cancel_message"]


def cancel_message(shard: str, group: str | None, raw_id: bytes, token: bytes) -> bytes:
    """What ``cancel`` publishes for one running delivery: ``shard NUL group NUL id NUL token``
    (the group empty for the default group)."""
    return b"\0".join((shard.encode(), (group or "").encode(), raw_id, token))


def parse_cancel_message(data: bytes) -> tuple[str, str | None, bytes, bytes] | None:
    """``(shard, group, id, token)`` of a :func:`cancel_message`, or None for anything else."""
    parts = data.split(b"\0")
    if len(parts) != 4:
        return None
    shard, group, raw_id, token = parts
    try:
        return shard.decode(), group.decode() or None, raw_id, token
    except UnicodeDecodeError:
        return None


class RunControl:
    """Progress of running deliveries and the lease tokens a cancel signals."""

    def __init__(self, core: StoreCore):
        self._core = core

    def _progress_keys(self, shard: str, group: str | None) -> tuple[str, ...]:
        return self._core.script_keys("progress", shard, group)

    async def write_progress(
        self, shard: str, group: str | None, items: Sequence[tuple[bytes, bytes, bytes]]
    ) -> None:
        """Store ``(id, token, value)`` progress of deliveries that still hold their leases."""
        keys = self._progress_keys(shard, group)
        await self._core.calls("progress", [(keys, ["set", i, t, v]) for i, t, v in items])

    async def clear_progress(
        self, shard: str, group: str | None, raw_id: bytes, token: bytes
    ) -> None:
        """Remove the progress of the delivery ``token`` (a newer run's stays)."""
        await self._core.scripts["progress"](
            keys=self._progress_keys(shard, group), args=["clear", raw_id, token]
        )

    async def read_progress(self, shard: str, group: str | None, event_id: str) -> bytes | None:
        """The progress value of the delivery that holds ``event_id``'s lease now, if it
        reported any."""
        leases, progress = self._progress_keys(shard, group)
        async with self._core.redis.pipeline(transaction=False) as pipe:
            pipe.hget(leases, event_id)
            pipe.hget(progress, event_id)
            token, stored = await pipe.execute()
        if token is None or stored is None or not stored.startswith(token + b"\0"):
            return None
        return bytes(stored[len(token) + 1 :])

    async def progress_many(
        self, shard: str, group: str | None, ids: Sequence[bytes]
    ) -> dict[bytes, bytes]:
        """id -> progress value of those of ``ids`` whose current run reported some."""
        if not ids:
            return {}
        leases, progress = self._progress_keys(shard, group)
        async with self._core.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(leases, list(ids))
            pipe.hmget(progress, list(ids))
            tokens, stored = await pipe.execute()
        return {
            i: bytes(v[len(t) + 1 :])
            for i, t, v in zip(ids, tokens, stored, strict=True)
            if t is not None and v is not None and v.startswith(t + b"\0")
        }

    async def running_tokens(self, shard: str, event_id: str) -> list[tuple[str | None, bytes]]:
        """``(group, claim token)`` of every lease held on ``event_id`` now (None: the
        default group)."""
        named = await self._core.redis.hkeys(self._core.view(shard).groups)
        names = [g.decode() if isinstance(g, bytes) else g for g in named]
        groups: list[str | None] = [stored_group(g) for g in names] or [None]
        async with self._core.redis.pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.hget(self._core.view(shard, group).leases, event_id)
            tokens = await pipe.execute()
        return [(g, t) for g, t in zip(groups, tokens, strict=True) if t is not None]

    async def signal_cancel(self, messages: Sequence[bytes]) -> int:
        """Publish cancel messages (:func:`cancel_message`); how many processes heard them."""
        heard = 0
        for message in messages:
            heard += int(await self._core.redis.publish(self._core.keys.cancel_channel, message))
        return heard
