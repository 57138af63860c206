"""delayq: delayed events for asyncio services, on the Redis they already run.

    await service.enqueue_with_delay(PaymentCheck(id="order-42", order_id=42), timedelta(hours=3))

The documentation (docs/, built with MkDocs) has the guides and every option.
"""

from ._version import __version__ as __version__
from .batches import BATCH_TYPE, Batch, BatchCounts, BatchInfo, BatchMember, BatchState
from .codec import Serializer
from .context import Delivery, Parent, current_delivery, event_context
from .errors import (
    BatchClosedError,
    DecodeError,
    DelayqError,
    EventFailed,
    FormatVersionError,
    NotReplicatedError,
    QueueFullError,
)
from .events import Event, event_name
from .flow.keys import KeyBacklog, KeyBacklogs
from .flow.limits import FlowLimits, Rate
from .metrics import InMemoryMetrics, Metrics, NoopMetrics
from .operations.dependencies import ParentFailurePolicy
from .operations.enqueueing import CancelResult
from .options import Options
from .results import Outcome, Result
from .retry import Backoff, exponential, fixed
from .runtime.health import ServiceHealth
from .runtime.heartbeat import WorkerInfo
from .runtime.history import HistoryPoint
from .schedules.api import ScheduleInfo
from .service import EventService
from .storage.store import QueueCounts
from .views.inspection import (
    DeadLetter,
    EventInfo,
    EventState,
    EventTypeRef,
    GroupState,
    RunProgress,
    ScheduledEvent,
)
from .views.searching import DeadLetterSearch, IdMatch, IdSearch, ReadyEvent

__all__ = [
    "BATCH_TYPE",
    "Backoff",
    "Batch",
    "BatchClosedError",
    "BatchCounts",
    "BatchInfo",
    "BatchMember",
    "BatchState",
    "CancelResult",
    "DeadLetter",
    "DeadLetterSearch",
    "DecodeError",
    "DelayqError",
    "Delivery",
    "Event",
    "EventFailed",
    "EventInfo",
    "EventService",
    "EventState",
    "EventTypeRef",
    "FlowLimits",
    "FormatVersionError",
    "GroupState",
    "HistoryPoint",
    "IdMatch",
    "IdSearch",
    "InMemoryMetrics",
    "KeyBacklog",
    "KeyBacklogs",
    "Metrics",
    "NoopMetrics",
    "NotReplicatedError",
    "Options",
    "Outcome",
    "Parent",
    "ParentFailurePolicy",
    "QueueCounts",
    "QueueFullError",
    "Rate",
    "ReadyEvent",
    "Result",
    "RunProgress",
    "ScheduleInfo",
    "ScheduledEvent",
    "Serializer",
    "ServiceHealth",
    "WorkerInfo",
    "current_delivery",
    "event_context",
    "event_name",
    "exponential",
    "fixed",
]
