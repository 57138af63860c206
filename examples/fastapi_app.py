"""delayq in a FastAPI app: the service lives in the lifespan, requests enqueue events.

Run it from the repository root (see examples/README.md)::

    REDIS_URL=redis://localhost:6379/0 uvicorn fastapi_app:app --app-dir examples

    curl -X POST 'localhost:8000/orders/42?delay=3' -H 'X-Request-ID: r-1'
    curl localhost:8000/checks      # a few seconds later: the check has run
    curl localhost:8000/stats
"""

import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, status

from delayq import Event, EventService, QueueCounts, current_delivery, event_context

# uvicorn configures only its own loggers; this makes the handler's log lines visible too.
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
log = logging.getLogger("fastapi_app")

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
# Every app (or environment) sharing one Redis gets its own prefix.
PREFIX = os.environ.get("DELAYQ_PREFIX", "shop")


class PaymentCheck(Event):
    """Look at an order's payment some time after the order was placed."""

    order_id: int


# What the handler has done. A real handler would ask the payment provider and update
# the database; an in-memory list keeps the example self-contained.
checks: list[dict[str, Any]] = []


async def check_payment(event: PaymentCheck) -> bool:
    """Record the check; True means done (False or an exception would retry it later)."""
    delivery = current_delivery()
    assert delivery is not None  # always set while a handler runs
    request_id = event_context().get("request_id")
    checks.append(
        {
            "order_id": event.order_id,
            "request_id": request_id,
            "attempt": delivery.attempt,
            "lateness_ms": delivery.lateness_ms,
        }
    )
    log.info("checked payment of order %d (request %s)", event.order_id, request_id)
    return True


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Run the service (scheduler and consumers) for as long as the app runs."""
    # tracing=True: OpenTelemetry spans for enqueues and handler runs when opentelemetry-api
    # is installed (and a no-op when it is not); see docs/OBSERVABILITY.md.
    service = EventService.from_url(REDIS_URL, prefix=PREFIX, tracing=True)
    service.add_handler(PaymentCheck, check_payment, concurrency=8)
    # Leaving the block stops fetching, gives running handlers `shutdown_grace` to finish
    # and closes the Redis connections; events left unfinished come back through their
    # leases, on this process after a restart or on another one.
    async with service:
        app.state.service = service
        yield
    log.info("delayq service closed")


app = FastAPI(title="delayq FastAPI example", lifespan=lifespan)


def get_service(request: Request) -> EventService:
    """The app's EventService, as a dependency."""
    service: EventService = request.app.state.service
    return service


Service = Annotated[EventService, Depends(get_service)]


@app.post("/orders/{order_id}", status_code=status.HTTP_202_ACCEPTED)
async def place_order(
    order_id: int,
    service: Service,
    delay: Annotated[float, Query(ge=0, le=86_400, description="seconds")] = 5.0,
    x_request_id: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    """Schedule a payment check of the order ``delay`` seconds from now."""
    request_id = x_request_id or uuid.uuid4().hex
    # One check per order: the id makes enqueueing idempotent, so a retried POST keeps
    # the check already scheduled (and `scheduled` is False).
    scheduled = await service.enqueue_with_delay(
        PaymentCheck(id=f"order-{order_id}", order_id=order_id),
        delay,
        context={"request_id": request_id},  # handed to the handler via event_context()
    )
    return {"order_id": order_id, "scheduled": scheduled, "delay": delay, "request_id": request_id}


@app.get("/checks")
async def list_checks() -> list[dict[str, Any]]:
    """The payment checks handled by this process so far."""
    return checks


def _four(counts: QueueCounts) -> dict[str, int]:
    """The state counts (QueueCounts also has next_due_at, backlog_age and due)."""
    return {
        "scheduled": counts.scheduled,
        "ready": counts.ready,
        "in_flight": counts.in_flight,
        "dead": counts.dead,
    }


@app.get("/stats")
async def stats(service: Service) -> dict[str, dict[str, int]]:
    """Scheduled, ready, in-flight and dead events per event type under the prefix."""
    return {name: _four(counts) for name, counts in (await service.stats()).items()}
