"""The stored envelope of an event, to and from bytes.

An envelope is a short array ``[body, enqueued_at_ms]`` (or ``[body,
enqueued_at_ms, context]`` when there is a context), in MessagePack (the
default) or msgspec JSON. ``body`` is the event's own encoding *without* its
``id`` field: the id is already the envelope's hash field in Redis, so storing
it twice would cost its length again on every event. Decoding puts it back.

An event type whose encoding does not end with its ``id`` (say, an
``array_like`` Struct) keeps the earlier layout ``[payload, context,
enqueued_at_ms]`` with the whole payload, which is also how envelopes written
before 2026-11-21 look; both decode. Attempts, errors and due times live in their
own Redis structures, so the envelope never changes after enqueue and the Lua
scripts never decode it. Decoding detects the format from the first byte, so a
fleet can switch serializers without draining its queues.

One exception: a replace of a child waiting for its parents (``after=[...]``) is stored
behind the byte 0xC1 (never a MessagePack start, nor JSON's), which ``enqueue.lua`` puts
there so that the replacing envelope, whatever its context, decodes with the mark that
makes its consumer read the parents (``context.AFTER_KEY``). Only the rare branches that
find no known first byte look for it: a plain envelope costs nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from .context import AFTER_KEY
from .errors import DecodeError
from .events import Event

__all__ = ["Codec", "OpenedEnvelope", "Serializer", "open_envelope"]

Serializer = Literal["json", "msgpack"]
"""The stored envelope's encoding (the ``serializer`` option): ``"msgpack"`` or ``"json"``."""


class _Envelope(msgspec.Struct, array_like=True):
    """``[body without the id, enqueued_at_ms, context?]``."""

    body: msgspec.Raw
    enqueued_at: int
    context: dict[str, str] | None = None


class _BareEnvelope(msgspec.Struct, array_like=True):
    """``[body without the id, enqueued_at_ms]``: no context, one field shorter."""

    body: msgspec.Raw
    enqueued_at: int


class _WholeEnvelope(msgspec.Struct, array_like=True):
    """``[payload with the id, context, enqueued_at_ms]`` (the earlier layout; types not stripped)."""

    payload: msgspec.Raw
    context: dict[str, str] | None = None
    enqueued_at: int = 0


# fixarray of 1..3 elements, array16, array32
_MSGPACK_STARTS = frozenset({0x91, 0x92, 0x93, 0xDC, 0xDD})
_Decoders = tuple[
    "msgspec.json.Decoder[_Envelope] | msgspec.msgpack.Decoder[_Envelope]",
    "msgspec.json.Decoder[_WholeEnvelope] | msgspec.msgpack.Decoder[_WholeEnvelope]",
]
_DECODERS: dict[str, _Decoders] = {
    "json": (msgspec.json.Decoder(_Envelope), msgspec.json.Decoder(_WholeEnvelope)),
    "msgpack": (msgspec.msgpack.Decoder(_Envelope), msgspec.msgpack.Decoder(_WholeEnvelope)),
}
# a waiting child's replacing envelope, stored behind this byte (see the module's docstring)
_CHILD_PREFIX = b"\xc1"
_CHILD_MARK = {AFTER_KEY: "1"}
_ID_KEY = {"json": b'"id":', "msgpack": b"\xa2id"}
_ENCODE_STR = {"json": msgspec.json.encode, "msgpack": msgspec.msgpack.encode}


@dataclass(frozen=True, slots=True)
class OpenedEnvelope:
    """What an envelope holds, with the event's payload whole again."""

    payload: bytes
    """The event as encoded, id included, in ``serializer``."""
    serializer: Serializer
    context: dict[str, str]
    enqueued_at_ms: int


def open_envelope(data: bytes, event_id: str | bytes) -> OpenedEnvelope:
    """Split envelope bytes stored under ``event_id``; raise :class:`DecodeError` on garbage."""
    return OpenedEnvelope(*_open(data, event_id))


def _open(data: bytes, event_id: str | bytes) -> tuple[bytes, Serializer, dict[str, str], int]:
    """:func:`open_envelope` as a tuple (a consumer opens one per event: no object to build)."""
    # _format_of inline: one call fewer per delivered event
    if data[:1] == b"[":
        fmt: Serializer = "json"
    elif data[:1] and data[0] in _MSGPACK_STARTS:
        fmt = "msgpack"
    elif data[:1] == _CHILD_PREFIX:
        payload, fmt, context, enqueued_ms = _open(data[1:], event_id)
        return payload, fmt, {**context, **_CHILD_MARK}, enqueued_ms
    else:
        raise DecodeError(f"not a delayq envelope (starts with {data[:8]!r})")
    stripped, whole = _DECODERS[fmt]
    try:
        try:
            env = stripped.decode(data)
        except msgspec.ValidationError:
            # the second element is a context, not a time: the whole-payload layout
            old = whole.decode(data)
            return bytes(old.payload), fmt, old.context or {}, old.enqueued_at
        if isinstance(event_id, bytes):
            event_id = event_id.decode("utf-8")
        payload = _with_id(bytes(env.body), fmt, _ENCODE_STR[fmt](event_id))
        return payload, fmt, env.context or {}, env.enqueued_at
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise DecodeError(f"cannot decode envelope: {exc}") from exc


def _format_of(data: bytes) -> Serializer:
    """An envelope's encoding, from its first byte; :class:`DecodeError` for anything else."""
    if data[:1] == b"[":
        return "json"
    if data[:1] and data[0] in _MSGPACK_STARTS:
        return "msgpack"
    raise DecodeError(f"not a delayq envelope (starts with {data[:8]!r})")


def add_to_context(data: bytes, extra: Mapping[str, str]) -> bytes:
    """Envelope ``data`` with ``extra`` merged into its context (payload and enqueue time as
    they were); raise :class:`DecodeError` when ``data`` is not an envelope."""
    if data[:1] == _CHILD_PREFIX:  # the mark goes into the context: no prefix needed now
        data, extra = data[1:], {**_CHILD_MARK, **extra}
    fmt = _format_of(data)
    stripped, whole = _DECODERS[fmt]
    encode = _ENCODE_STR[fmt]
    try:
        try:
            env = stripped.decode(data)
        except msgspec.ValidationError:
            old = whole.decode(data)
            context = {**(old.context or {}), **extra}
            return encode(_WholeEnvelope(old.payload, context, old.enqueued_at))
        return encode(_Envelope(env.body, env.enqueued_at, {**(env.context or {}), **extra}))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"cannot decode envelope: {exc}") from exc


def _without_id(payload: bytes, fmt: Serializer, encoded_id: bytes) -> bytes | None:
    """``payload`` (a map whose last entry is ``id``) without that entry, or None."""
    suffix = _ID_KEY[fmt] + encoded_id
    if not payload.endswith(suffix if fmt == "msgpack" else suffix + b"}"):
        return None
    if fmt == "json":
        rest = payload[: -len(suffix) - 1]  # "{...," or "{"
        if rest == b"{":
            return b"{}"
        return rest[:-1] + b"}" if rest.endswith(b",") else None
    head, rest = payload[0], payload[: -len(suffix)]
    if 0x81 <= head <= 0x8F:  # fixmap
        return bytes([head - 1]) + rest[1:]
    if head in (0xDE, 0xDF):  # map16, map32: recount (kept in the same width)
        width = 2 if head == 0xDE else 4
        n = int.from_bytes(rest[1 : 1 + width], "big")
        return bytes([head]) + (n - 1).to_bytes(width, "big") + rest[1 + width :]
    return None


def _with_id(body: bytes, fmt: Serializer, encoded_id: bytes) -> bytes:
    """Undo :func:`_without_id`: append the ``id`` entry to the map ``body``."""
    entry = _ID_KEY[fmt] + encoded_id
    if fmt == "json":
        if body[:1] != b"{" or body[-1:] != b"}":
            raise DecodeError(f"an envelope's body is not a JSON object: {body[:16]!r}")
        return b"{" + entry + b"}" if body == b"{}" else body[:-1] + b"," + entry + b"}"
    head = body[0] if body else -1
    if 0x80 <= head <= 0x8E:
        return bytes([head + 1]) + body[1:] + entry
    if head == 0x8F:  # 15 entries: a 16th needs a map16 header
        return b"\xde\x00\x10" + body[1:] + entry
    if head in (0xDE, 0xDF):
        width = 2 if head == 0xDE else 4
        n = int.from_bytes(body[1 : 1 + width], "big") + 1
        if n >= 1 << (8 * width):
            raise DecodeError("an envelope's body has too many fields")
        return bytes([head]) + n.to_bytes(width, "big") + body[1 + width :] + entry
    raise DecodeError(f"an envelope's body is not a MessagePack map: {body[:16]!r}")


def _id_is_last(event_type: type[Event]) -> bool:
    """True when ``event_type`` encodes as a map whose last key is ``id``."""
    config = event_type.__struct_config__
    fields = event_type.__struct_encode_fields__
    return not config.array_like and bool(fields) and fields[-1] == "id"


class Codec:
    """Encodes events into envelopes and decodes them back, enforcing the size limit."""

    def __init__(self, serializer: Serializer = "msgpack", max_payload_bytes: int = 512 * 1024):
        if serializer == "json":
            self._encode = msgspec.json.Encoder().encode
        elif serializer == "msgpack":
            self._encode = msgspec.msgpack.Encoder().encode
        else:
            raise ValueError(f"serializer must be 'json' or 'msgpack', not {serializer!r}")
        self.serializer: Serializer = serializer
        self.max_payload_bytes = max_payload_bytes
        self._json_payload: dict[type, msgspec.json.Decoder[Any]] = {}
        self._msgpack_payload: dict[type, msgspec.msgpack.Decoder[Any]] = {}
        self._strippable: dict[type, bool] = {}

    def encode(
        self, event: Event, context: Mapping[str, str] | None = None, *, checked: bool = False
    ) -> bytes:
        """Return the envelope bytes for ``event``; raise ``ValueError`` when too large.

        ``checked``: ``context`` is a dict of str to str made by delayq itself (a trace's
        carrier), stored without :func:`check_context`'s look at every item."""
        payload = self._encode(event)
        if len(payload) > self.max_payload_bytes:
            raise ValueError(
                f"{type(event).__name__} {event.id!r} encodes to {len(payload)} bytes, over "
                f"max_payload_bytes={self.max_payload_bytes}"
            )
        ctx: dict[str, str] | None
        if context is None:
            ctx = None
        elif checked:
            ctx = context or None  # type: ignore[assignment]  # a dict (see above)
        else:
            ctx = check_context(context)
        now_ms = time.time_ns() // 1_000_000
        cls = type(event)
        strippable = self._strippable.get(cls)
        if strippable is None:
            strippable = self._strippable[cls] = _id_is_last(cls)
        body = _without_id(payload, self.serializer, self._encode(event.id)) if strippable else None
        if body is None:
            return self._encode(_WholeEnvelope(msgspec.Raw(payload), ctx, now_ms))
        if ctx is None:
            return self._encode(_BareEnvelope(msgspec.Raw(body), now_ms))
        return self._encode(_Envelope(msgspec.Raw(body), now_ms, ctx))

    def decode(
        self, data: bytes, event_type: type[Event], event_id: str | bytes
    ) -> tuple[Event, dict[str, str]]:
        """Return ``(event, context)`` from the envelope stored under ``event_id``.

        Raises :class:`DecodeError` when the bytes are not an envelope of ``event_type``.
        """
        event, context, _ = self.decode_timed(data, event_type, event_id)
        return event, context

    def decode_timed(
        self, data: bytes, event_type: type[Event], event_id: str | bytes
    ) -> tuple[Event, dict[str, str], int]:
        """Like :meth:`decode`, plus the enqueue time in ms (0 when the envelope has none)."""
        try:
            payload, serializer, context, enqueued_ms = _open(data, event_id)
            if serializer == "json":
                decoder: Any = self._json_payload.get(event_type)
                if decoder is None:
                    decoder = self._json_payload[event_type] = msgspec.json.Decoder(event_type)
            else:
                decoder = self._msgpack_payload.get(event_type)
                if decoder is None:
                    decoder = self._msgpack_payload[event_type] = msgspec.msgpack.Decoder(
                        event_type
                    )
            return decoder.decode(payload), context, enqueued_ms
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(f"cannot decode {event_type.__name__}: {exc}") from exc
        except DecodeError:
            raise
        except Exception as exc:
            # UnicodeDecodeError (invalid UTF-8 inside a JSON string), whatever a
            # user's __post_init__ raises...: a dead letter, never a crashed consumer.
            raise DecodeError(
                f"cannot decode {event_type.__name__}: {type(exc).__name__}: {exc}"
            ) from exc


def check_context(context: Mapping[str, str] | None) -> dict[str, str] | None:
    """Validate an event context: a mapping of str to str (or None)."""
    if context is None:
        return None
    if type(context) is not dict and not isinstance(context, Mapping):  # dict: no ABC check
        raise TypeError(f"context must be a mapping of str to str, not {type(context).__name__}")
    for key, value in context.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"context must map str to str; got {key!r}: {value!r}")
    return dict(context) if context else None
