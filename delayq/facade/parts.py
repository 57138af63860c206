"""The parts every mixin of :class:`~delayq.EventService` delegates to.

Declared for the type checker only: at run time ``ServiceParts`` is an empty
base, so ``help(EventService)`` lists no ``__annotations__``.
``EventService``'s construction (:func:`delayq.wiring.wire`) sets the parts on
each instance. They are the only state the mixins share: no mixin sets an attribute
(``tests/test_seams.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["ServiceParts"]

if TYPE_CHECKING:
    from ..events import EventTypes
    from ..operations.batches import Batches
    from ..operations.dependencies import Dependencies
    from ..operations.enqueueing import Enqueuer
    from ..operations.flow_control import FlowControl
    from ..operations.groups import Groups
    from ..operations.results import ResultReader
    from ..options import Options
    from ..partitions.routing import Router
    from ..runtime.runtime import Runtime
    from ..runtime.scheduler import Scheduler
    from ..schedules.api import Schedules
    from ..storage.store import Store
    from ..views.browsing import Browser
    from ..views.inspection import Inspector
    from ..views.searching import Finder

    class ServiceParts:
        """The attributes an ``EventService`` is built with, shared by its mixins."""

        _options: Options
        _store: Store
        _router: Router
        _types: EventTypes
        _groups: Groups
        _inspector: Inspector
        _browser: Browser
        _enqueuer: Enqueuer
        _finder: Finder
        _runtime: Runtime
        _flow: FlowControl
        _scheduler: Scheduler | None
        _schedules: Schedules
        _results: ResultReader
        _dependencies: Dependencies
        _batches: Batches

else:

    class ServiceParts:
        """The attributes an ``EventService`` is built with, shared by its mixins."""
