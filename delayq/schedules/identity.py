"""When two declarations of a schedule are the same: definitions compared, not encodings.

A schedule's ``version`` is a digest of its stored definition, and ``schedule_write.lua``
moves the schedule's mark (the last slot fired) to now when the version changes. So the
stored definition must hold nothing that differs between two declarations of the same
schedule: the payload template is stored with a fixed enqueue time (each fire stamps its
own, :func:`~delayq.schedules.spec.restamp`) and its context in key order.

Definitions stored by releases that kept the encode time in the template are recognised
as the same definition (:func:`same_definition`), so the first declaration after an
upgrade does not count as a change either.
"""

from __future__ import annotations

import msgspec

# the template's layout (_Envelope), read as every fire reads it (_opened)
from .spec import ScheduleSpec, _Envelope, _opened, decode_spec

__all__ = ["canonical_template", "same_definition"]

# A template's enqueue time. Fires never carry it (each gets its own), so it holds no
# information; 1, not 0: a template must look like an envelope (spec.check_template).
TEMPLATE_STAMP = 1


def canonical_template(template: bytes) -> bytes:
    """The envelope ``template`` as stored in a definition: the same body and context
    (keys sorted), the fixed :data:`TEMPLATE_STAMP` for its time, the same serializer.
    Two envelopes of the same payload and context give the same bytes."""
    env = _opened(template)
    context = dict(sorted(env.context.items())) if env.context else None
    out = _Envelope(env.body, TEMPLATE_STAMP, context)
    return msgspec.json.encode(out) if template[:1] == b"[" else msgspec.msgpack.encode(out)


def same_definition(stored: bytes, spec: ScheduleSpec) -> bool:
    """Whether the stored definition ``stored`` declares what ``spec`` (built with a
    canonical template) does, whatever time its template was encoded at."""
    try:
        old = decode_spec(stored)
        old = msgspec.structs.replace(old, template=canonical_template(old.template))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return old.with_version().version == spec.version
