"""The stored envelope of an event, to and from bytes.

An envelope is a short array ``[payload, context, enqueued_at_ms]`` in msgspec
JSON (the default) or MessagePack. Attempts, errors and due times live in
their own Redis structures, so the envelope never changes after enqueue and
the Lua scripts never decode it. Decoding detects the format from the first
byte, so a fleet can switch serializers without draining its queues.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from .errors import DecodeError
from .events import Event

__all__ = ["Codec", "Serializer"]

Serializer = Literal["json", "msgpack"]


class _Envelope(msgspec.Struct, array_like=True):
    payload: msgspec.Raw
    context: dict[str, str] | None = None
    enqueued_at: int = 0


_JSON_START = ord("[")
# fixarray of 1..3 elements, array16, array32
_MSGPACK_STARTS = frozenset({0x91, 0x92, 0x93, 0xDC, 0xDD})


class Codec:
    """Encodes events into envelopes and decodes them back, enforcing the size limit."""

    def __init__(self, serializer: Serializer = "json", max_payload_bytes: int = 512 * 1024):
        if serializer == "json":
            self._encode = msgspec.json.Encoder().encode
        elif serializer == "msgpack":
            self._encode = msgspec.msgpack.Encoder().encode
        else:
            raise ValueError(f"serializer must be 'json' or 'msgpack', not {serializer!r}")
        self.serializer = serializer
        self.max_payload_bytes = max_payload_bytes
        self._json_envelope = msgspec.json.Decoder(_Envelope)
        self._msgpack_envelope = msgspec.msgpack.Decoder(_Envelope)
        self._json_payload: dict[type, msgspec.json.Decoder[Any]] = {}
        self._msgpack_payload: dict[type, msgspec.msgpack.Decoder[Any]] = {}

    def encode(self, event: Event, context: Mapping[str, str] | None = None) -> bytes:
        """Return the envelope bytes for ``event``; raise ``ValueError`` when too large."""
        payload = self._encode(event)
        if len(payload) > self.max_payload_bytes:
            raise ValueError(
                f"{type(event).__name__} {event.id!r} encodes to {len(payload)} bytes, over "
                f"max_payload_bytes={self.max_payload_bytes}"
            )
        ctx = check_context(context)
        return self._encode(_Envelope(msgspec.Raw(payload), ctx, time.time_ns() // 1_000_000))

    def decode(self, data: bytes, event_type: type[Event]) -> tuple[Event, dict[str, str]]:
        """Return ``(event, context)`` from envelope bytes, or raise :class:`DecodeError`."""
        try:
            if data[:1] == b"[":
                env = self._json_envelope.decode(data)
                decoder: Any = self._json_payload.get(event_type)
                if decoder is None:
                    decoder = self._json_payload[event_type] = msgspec.json.Decoder(event_type)
            elif data[:1] and data[0] in _MSGPACK_STARTS:
                env = self._msgpack_envelope.decode(data)
                decoder = self._msgpack_payload.get(event_type)
                if decoder is None:
                    decoder = self._msgpack_payload[event_type] = msgspec.msgpack.Decoder(
                        event_type
                    )
            else:
                raise DecodeError(f"not a delayq envelope (starts with {data[:8]!r})")
            return decoder.decode(env.payload), env.context or {}
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
    if not isinstance(context, Mapping):
        raise TypeError(f"context must be a mapping of str to str, not {type(context).__name__}")
    for key, value in context.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"context must map str to str; got {key!r}: {value!r}")
    return dict(context) if context else None
