"""Exceptions raised by delayq."""

from __future__ import annotations

from redis.exceptions import OutOfMemoryError
from redis.exceptions import ResponseError as RedisResponseError

__all__ = [
    "DecodeError",
    "DelayqError",
    "NotReplicatedError",
    "QueueFullError",
    "RedisResponseError",
]

# RedisResponseError: redis-py's ResponseError (an error reply, e.g. from a script), for
# the modules that must recognise one without importing redis themselves (spread.py)


class DelayqError(Exception):
    """Base class of delayq's own exceptions."""


class DecodeError(DelayqError):
    """A stored envelope could not be decoded into its event type."""


class QueueFullError(DelayqError, OutOfMemoryError):
    """Redis refused an enqueue because it reached ``maxmemory`` (policy ``noeviction``).

    Nothing of the refused events was written. It is also a
    ``redis.exceptions.OutOfMemoryError`` (and so a ``ResponseError``).
    """


class NotReplicatedError(DelayqError):
    """Fewer replicas than ``min_replicas`` confirmed an enqueue within ``replica_timeout``.

    The events were written on the master, but a failover before the replicas
    catch up could lose them. Enqueueing the same events again is safe: an id
    that is already stored is kept (the call then reports it as not added).
    """
