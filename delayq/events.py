"""The ``Event`` base class and the names event types have on the wire.

An event type's wire name is part of every Redis key of that type, so it must
stay stable across deploys. It defaults to the class's ``__qualname__`` and can
be pinned with a class keyword (``class PaymentCheck(Event, event_name="payment-check")``)
or a class variable (``event_name = "payment-check"``), so a class can be renamed
or moved without orphaning the events already queued under the old name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import msgspec

from .durations import delay_ms, seconds_to_ms
from .flow.priorities import check_priority
from .keyspace.names import validate_name
from .keyspace.shards import check_partitions

__all__ = [
    "Event",
    "EventMeta",
    "EventTypes",
    "Item",
    "check_event",
    "check_event_type",
    "event_name",
    "find_event_type",
    "item_due",
    "validate_name",
]

log = logging.getLogger("delayq.events")


# wire name -> class; guards against two different classes sharing a name.
_registry: dict[str, type[Event]] = {}


class EventMeta(msgspec.StructMeta):
    """Metaclass of :class:`Event`: resolves each subclass's wire name and registers it."""

    def __new__(
        mcls, clsname: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> EventMeta:
        explicit = kwargs.pop("event_name", None)
        # a keyword only (no class variable): an event may have a field named "partitions"
        partitions = kwargs.pop("partitions", 1)
        flow_key = kwargs.pop("flow_key", None)  # the field that supplies the flow key
        results = kwargs.pop("results", None)  # how long a finished event's result is kept
        priority = kwargs.pop("priority", 0)  # the level its events are enqueued at
        if explicit is None:
            # Only this class's own namespace counts: a subclass must not inherit
            # its parent's explicit name, or the two would share one queue.
            explicit = namespace.pop("event_name", None)
        cls = super().__new__(mcls, clsname, bases, namespace, **kwargs)
        is_base = not any(isinstance(b, EventMeta) for b in bases)
        name = validate_name(explicit if explicit is not None else cls.__qualname__)
        type.__setattr__(cls, "event_name", name)
        # like the name, the count is not inherited: a subclass is another queue
        type.__setattr__(cls, "event_partitions", check_partitions(partitions))
        if flow_key is not None and flow_key not in getattr(cls, "__struct_fields__", ()):
            raise TypeError(f"flow_key={flow_key!r}: {clsname} has no such field")
        type.__setattr__(cls, "event_flow_key", flow_key)
        type.__setattr__(cls, "event_results_ms", _results_ms(clsname, results))
        try:
            type.__setattr__(cls, "event_priority", check_priority(priority))
        except ValueError as exc:
            raise ValueError(f"{clsname}: {exc}") from None
        if not is_base:
            _register(name, cls)  # type: ignore[arg-type]
        return cls


def _results_ms(clsname: str, results: object) -> int | None:
    """The ``results=`` class keyword in whole ms (None: the type keeps no results)."""
    if results is None:
        return None
    if not isinstance(results, timedelta):
        raise TypeError(
            f"{clsname}: results= must be a timedelta (how long a result is kept), not {results!r}"
        )
    if results <= timedelta(0):
        raise ValueError(f"{clsname}: results= must be a positive timedelta, not {results!r}")
    return seconds_to_ms(results.total_seconds())


def _register(name: str, cls: type[Event]) -> None:
    existing = _registry.get(name)
    if existing is not None and existing is not cls:
        same_place = (existing.__module__, existing.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if not same_place:
            raise TypeError(
                f"event type name {name!r} of {cls.__module__}.{cls.__qualname__} is already "
                f"used by {existing.__module__}.{existing.__qualname__}; give one of them an "
                f"explicit name with `event_name=...`"
            )
        # The same class defined again (a module reload, a test run twice): the
        # newer definition takes over the name.
        log.debug("event type %r redefined in %s", name, cls.__module__)
    _registry[name] = cls


class Event(msgspec.Struct, kw_only=True, metaclass=EventMeta):
    """Base class of every delayq event: a msgspec Struct with an ``id``.

    ``(type, id)`` identifies an event: enqueueing the same id again while the
    first is still pending keeps the first (or replaces it with ``replace=True``).
    Subclasses add typed fields::

        class PaymentCheck(Event, event_name="payment-check"):
            order_id: int

    A hot type can be spread over ``partitions`` key spaces (and so over the
    nodes of a Redis Cluster)::

        class PaymentCheck(Event, event_name="payment-check", partitions=16):
            order_id: int

    Events served in fair turns per tenant take their flow key from a field::

        class Report(Event, event_name="report", flow_key="tenant"):
            tenant: str

    Background work marked down: its events, unless an enqueue gives ``priority=``, wait
    behind more urgent ones of the type (0, the default, is the most urgent;
    docs/guides/priorities.md)::

        class Report(Event, priority=5):
            tenant: str

    A type whose handlers' return values are kept, for ``service.result()``, an hour
    after each event is done::

        class Thumbnail(Event, results=timedelta(hours=1)):
            path: str
    """

    id: str
    event_name: ClassVar[str]
    event_partitions: ClassVar[int]
    """How many partitions the type's events are spread over (``partitions=N``
    class keyword; default 1). See docs/guides/scaling.md, "Partitions for hot types"."""
    event_flow_key: ClassVar[str | None]
    """The field whose value is an event's flow key (``flow_key="tenant"`` class
    keyword; default None: only ``enqueue_*(..., key=...)`` gives one). See
    docs/FLOW.md, "Flow keys"."""
    event_priority: ClassVar[int]
    """The priority level its events are enqueued at unless a call gives one
    (``priority=5`` class keyword; default 0, the most urgent). See
    docs/guides/priorities.md."""
    event_results_ms: ClassVar[int | None]
    """How long (ms) a finished event's result is kept (``results=timedelta(...)`` class
    keyword; default None: no results are kept). See docs/WORKFLOWS.md, "Results"."""


def check_event_type(event_type: object) -> type[Event]:
    """Return ``event_type`` if it is a subclass of :class:`Event` (not Event itself), else raise."""
    if not (isinstance(event_type, type) and issubclass(event_type, Event)) or event_type is Event:
        raise TypeError(f"expected a subclass of delayq.Event, got {event_type!r}")
    return event_type


def check_event(event: object) -> Event:
    """Return ``event`` if it is an :class:`Event` with a non-empty str id, else raise."""
    if not isinstance(event, Event):
        raise TypeError(f"expected an instance of a delayq.Event subclass, got {event!r}")
    if not isinstance(event.id, str):
        raise TypeError(f"event id must be a str, not {type(event.id).__name__}")
    if not event.id:
        raise ValueError(f"event id must not be empty: {event!r}")
    return event


Item = Event | tuple[Event, float | timedelta]
"""An item of ``enqueue_many`` (the service's, a batch's, the outbox's): an event, or
``(event, delay)``."""


def item_due(item: Item, default_ms: int) -> tuple[Event, int]:
    """``(event, delay in ms)`` of an ``enqueue_many`` item (not yet checked as an event):
    an event is due after ``default_ms``; a tuple must be a pair whose delay is seconds or
    a ``timedelta``, finite and >= 0 (else ``TypeError``/``ValueError``). The one parser
    of those items, so that every ``enqueue_many`` refuses the same items the same way."""
    if isinstance(item, tuple):
        if len(item) != 2:
            raise TypeError(f"enqueue_many items are events or (event, delay): {item!r}")
        event, item_delay = item
        return event, delay_ms(item_delay)
    return item, default_ms


def event_name(event_type: type[Event] | Event) -> str:
    """Return the wire name of an event class or instance."""
    cls = event_type if isinstance(event_type, type) else type(event_type)
    return check_event_type(cls).event_name


def find_event_type(name: str) -> type[Event] | None:
    """The Event class with wire name ``name`` among the classes defined in this process, or None."""
    return _registry.get(name)


class EventTypes(dict[str, type[Event]]):
    """The event types one service has met: wire name -> class, one class per name.

    ``on_new(name, partitions)`` runs when a type is met for the first time (the
    service declares the type's partition layout to its store).
    """

    def __init__(self, on_new: Callable[[str, int], None]):
        super().__init__()
        self._on_new = on_new

    def register(self, event_type: Any) -> str:
        """The wire name of the class ``event_type``, noted here; ``ValueError`` if another
        class has that name."""
        name = check_event_type(event_type).event_name
        known = self.get(name)
        if known is None:
            self[name] = event_type
            self._on_new(name, event_type.event_partitions)
        elif known is not event_type:
            raise ValueError(
                f"event type name {name!r} is used by both {known.__module__}."
                f"{known.__qualname__} and {event_type.__module__}.{event_type.__qualname__}"
            )
        return name

    def name(self, event_type: type[Event] | str) -> str:
        """The wire name of a class (registering it) or of a name given as a str."""
        if isinstance(event_type, str):
            return validate_name(event_type)
        return self.register(event_type)

    def cls_of(self, name: str) -> type[Event] | None:
        """The class of a wire name: one met here, else one defined in this process, or None."""
        return self.get(name) or find_event_type(name)
