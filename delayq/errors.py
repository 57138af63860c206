"""Exceptions raised by delayq."""

from __future__ import annotations

import re

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    ExecAbortError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ResponseError as RedisResponseError

__all__ = [
    "TRANSIENT_CODES",
    "BatchClosedError",
    "DecodeError",
    "DelayqError",
    "EventFailed",
    "FormatVersionError",
    "NotReplicatedError",
    "QueueFullError",
    "RedisError",
    "RedisResponseError",
    "error_code",
    "is_transient",
]

# RedisResponseError: redis-py's ResponseError (an error reply, e.g. from a script), and
# RedisError, the base of every redis-py error, for the modules that must recognise one
# without importing redis themselves (the loops, partitions/spread.py, the CLI)


class DelayqError(Exception):
    """Base class of delayq's own exceptions."""


class DecodeError(DelayqError):
    """A stored envelope could not be decoded into its event type."""


class QueueFullError(DelayqError, OutOfMemoryError):
    """Redis refused an enqueue because it reached ``maxmemory`` (policy ``noeviction``).

    Nothing of the refused events was written. It is also a
    ``redis.exceptions.OutOfMemoryError`` (and so a ``ResponseError``).
    """


class FormatVersionError(DelayqError):
    """A service refused to start: the data under its prefix is in a stored-data format this
    delayq does not read (written by a newer delayq, or older than it reads without a
    migration). The message names both formats; docs/versioning.md has the rule."""


class BatchClosedError(DelayqError):
    """A member was added to a batch that takes no more: it is done, or closed and the
    adder is not one of its pending members (only a running member may add to a closed
    batch; docs/WORKFLOWS.md, "Batches")."""


class EventFailed(DelayqError):
    """The event whose result was asked for (``EventService.result``) became a dead letter.

    ``error`` is the dead letter's error (``"Type: message"``, as ``dead_letters()`` shows it).
    """

    def __init__(self, event_type: str, event_id: str, error: str):
        super().__init__(f"{event_type} {event_id!r} failed: {error}")
        self.event_type = event_type
        """The event's type (wire name)."""
        self.event_id = event_id
        """The event's id."""
        self.error = error
        """The dead letter's error, ``"Type: message"``."""


class NotReplicatedError(DelayqError):
    """Fewer replicas than ``min_replicas`` confirmed an enqueue within ``replica_timeout``.

    The events were written on the master, but a failover before the replicas
    catch up could lose them. Enqueueing the same events again is safe: an id
    that is already stored is kept (the call then reports it as not added).
    """


# --------------------------------------------------------------------------- server error codes
#
# A server error reply starts with its code, one upper-case word ("NOSCRIPT No matching
# script..."). The rest is prose that servers reword (Valkey 8 shortened NOSCRIPT's, Valkey 9.1
# dropped the script's sha from errors raised in scripts), so delayq decides on the code only.

#: Codes of a server that cannot serve this command right now, whatever the command:
#: failing over (READONLY, MASTERDOWN, and UNBLOCKED for a blocking command it ended),
#: short of replicas (NOREPLICAS) or of a working disk (MISCONF), starting (LOADING), stuck
#: in a script (BUSY), or a cluster resharding or electing (MOVED, ASK, TRYAGAIN,
#: CLUSTERDOWN). Retrying later helps.
TRANSIENT_CODES = frozenset(
    {
        "READONLY",
        "MASTERDOWN",
        "UNBLOCKED",
        "NOREPLICAS",
        "MISCONF",
        "LOADING",
        "BUSY",
        "MOVED",
        "ASK",
        "TRYAGAIN",
        "CLUSTERDOWN",
    }
)

# redis-py strips the code from the message of the classes it maps (and only 8.x keeps it
# in ``status_code``): the class tells the code then. Most specific classes first.
_CLASS_CODES: tuple[tuple[type[RedisError], str], ...] = (
    (MovedError, "MOVED"),
    (AskError, "ASK"),
    (MasterDownError, "MASTERDOWN"),
    (ClusterDownError, "CLUSTERDOWN"),
    (TryAgainError, "TRYAGAIN"),
    (ClusterCrossSlotError, "CROSSSLOT"),
    (NoScriptError, "NOSCRIPT"),
    (ReadOnlyError, "READONLY"),
    (OutOfMemoryError, "OOM"),
    (BusyLoadingError, "LOADING"),
    (ExecAbortError, "EXECABORT"),
    (NoPermissionError, "NOPERM"),
)
_CODE = re.compile(r"[A-Z][A-Z0-9_]*\Z")
# redis-py puts "Command # 2 (EVALSHA ...) of pipeline caused error: " (and, in 8.x, the
# repr of the original arguments) before a reply that failed in a pipeline.
_PIPELINE = re.compile(r"Command # \d+ \(.*\) of pipeline caused error: (?:\(['\"])?", re.S)
# Redis < 7 reports an error raised by redis.call inside a script as ERR, with the
# original reply after the script's position: "ERR Error running script (call to
# f_<sha>): @user_script:3: @user_script: 3: -OOM command not allowed...". The wrapped
# reply's code is the error's code. (Redis 7+ and Valkey pass the original code on.)
_WRAPPED = re.compile(r"\(call to f_[0-9a-f]{40}\): (?:@user_script: ?\d+: )+-?([A-Z][A-Z0-9_]*) ")


def error_code(exc: BaseException) -> str | None:
    """The code of a server error reply: its first word (``"NOSCRIPT"``, ``"OOM"``, ...).

    ``None`` when ``exc`` is not an error reply from the server (a lost connection, a
    timeout, a Python error). For a plain ``ERR`` reply the code is ``"ERR"``. An error
    raised inside a Lua script has the code of the command that failed in the script
    (Redis 7+, Valkey; unwrapped from Redis 6.2's ``ERR Error running script`` too).
    """
    if not isinstance(exc, RedisError):
        return None
    for cls, code in _CLASS_CODES:
        if isinstance(exc, cls):
            return code
    if not isinstance(exc, RedisResponseError):
        return None
    message = str(exc)
    annotated = _PIPELINE.match(message)
    if annotated:
        message = message[annotated.end() :]
    status = getattr(exc, "status_code", None)  # redis-py 8: the code it stripped
    if isinstance(status, str) and status:
        code = status
    else:
        first = message.split(" ", 1)[0]
        # redis-py < 8 strips "ERR " and keeps no code: whatever starts otherwise is ERR
        code = first if _CODE.match(first) and message != first else "ERR"
        if code != "ERR":
            return code
    if code == "ERR":
        wrapped = _WRAPPED.search(message)
        if wrapped:
            return wrapped.group(1)
    return code


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a server error reply that says "not now" (see :data:`TRANSIENT_CODES`).

    Such an error is about the server, not about the command or its keys: a loop backs off
    and tries everything again, rather than setting one event type aside.
    """
    return error_code(exc) in TRANSIENT_CODES
