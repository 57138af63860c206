"""The stored-data format version: a worker refuses data that a newer delayq wrote.

delayq's key layout, what each key holds and the Lua scripts that change them make up one
*stored-data format*, numbered. A release that changes it raises :data:`FORMAT` (and its
version: docs/versioning.md, CHANGELOG.md's migration note). The number lives in one key,
``{prefix}:format``, written when a service first starts under a prefix (``SET NX``: the
first writer wins, later ones only read it).

At :meth:`FormatVersions.check_format` (``EventService.start``, never per event) a worker
meets one of three cases:

- the stored format is one it reads (``OLDEST_READ <= stored <= FORMAT``): it runs. So
  workers of several releases that share a format run side by side in a rolling deploy;
- the stored format is newer than :data:`FORMAT`: a newer delayq migrated the data, and
  this worker could misread or damage it, so it refuses to start (:class:`FormatVersionError`
  naming both formats);
- the stored format is older than :data:`OLDEST_READ`: the data needs the migration of the
  release notes first; refused the same way.

A prefix used before the number existed holds format 1 (the layout of 0.1.0); the key is
absent there until a service starts (its name: ``PrefixKeys.format``).
"""

from __future__ import annotations

from .._version import __version__
from ..errors import FormatVersionError, RedisError
from ..keyspace.layout import PrefixKeys
from .base import StoreCore, log

__all__ = ["FORMAT", "OLDEST_READ", "FormatVersions", "format_key"]

#: The stored-data format this delayq writes (and the newest it reads).
FORMAT = 1
#: The oldest stored-data format this delayq reads without a migration.
OLDEST_READ = 1


def format_key(prefix: str) -> str:
    """The key holding the prefix's stored-data format (tag ``{prefix}``, as the type set)."""
    return PrefixKeys(prefix).format


class FormatVersions:
    """The format check a service makes once, when it starts."""

    def __init__(self, core: StoreCore):
        self._core = core

    async def check_format(self) -> int | None:
        """Record this delayq's format under the prefix if none is, and return the stored
        one; raise :class:`FormatVersionError` when this delayq cannot read it.

        None when Redis could not be asked (down, or an ACL without the key): the service
        starts as it always did and its loops report the error; nothing is refused then.
        """
        key = self._core.keys.format
        # SET NX then GET, in that order on one connection: the GET sees our write or the
        # earlier one (SET NX ... GET needs Redis 7; this works on 6.2). No MULTI: the
        # ACL line of docs/RELIABILITY.md allows SET and GET, not MULTI/EXEC
        pipe = self._core.redis.pipeline(transaction=False)
        pipe.set(key, FORMAT, nx=True)
        pipe.get(key)
        try:
            _, raw = await pipe.execute()
        except RedisError as exc:
            log.warning("could not read the stored-data format at %s (%s): not checked", key, exc)
            return None
        try:
            stored = int(raw)
        except (TypeError, ValueError):
            raise FormatVersionError(
                f"the key {key!r} holds {raw!r}, not a stored-data format number: "
                f"something other than delayq wrote it (delayq {__version__} writes format "
                f"{FORMAT})"
            ) from None
        if stored > FORMAT:
            raise FormatVersionError(
                f"the data under prefix {self._core.keys.prefix!r} is in stored-data format "
                f"{stored}, newer than this delayq {__version__} reads (format {FORMAT}): "
                f"a newer delayq wrote it. Upgrade this process to a release that reads "
                f"format {stored} (CHANGELOG.md); until then it is refused, so that it "
                f"never misreads the newer data"
            )
        if stored < OLDEST_READ:
            raise FormatVersionError(
                f"the data under prefix {self._core.keys.prefix!r} is in stored-data format "
                f"{stored}, older than this delayq {__version__} reads (formats "
                f"{OLDEST_READ} to {FORMAT}): run the migration in CHANGELOG.md first"
            )
        return stored
