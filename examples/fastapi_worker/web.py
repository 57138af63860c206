"""The web process: it only enqueues. The handlers run in workers (see tasks.py)::

uvicorn web:app --port 8000                     # from this directory
"""

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from events import PaymentCheck
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, status

from delayq import EventFailed, EventService

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
PREFIX = os.environ.get("DELAYQ_PREFIX", "shop")  # the same as the workers'


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Never started: enqueueing needs no start(), and no handler or scheduler runs here
    # (enable_scheduling=False keeps it so even if someone starts it).
    service = EventService.from_url(REDIS_URL, prefix=PREFIX, enable_scheduling=False)
    app.state.delayq = service
    try:
        yield
    finally:
        await service.aclose()  # closes the Redis connections


app = FastAPI(title="delayq: a web process that enqueues", lifespan=lifespan)


def get_service(request: Request) -> EventService:
    """The app's EventService, as a dependency."""
    service: EventService = request.app.state.delayq
    return service


Service = Annotated[EventService, Depends(get_service)]


@app.post("/orders/{order_id}", status_code=status.HTTP_202_ACCEPTED)
async def place_order(
    order_id: int,
    service: Service,
    delay: Annotated[float, Query(ge=0, le=86_400, description="seconds")] = 5.0,
    x_request_id: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    """Schedule the order's payment check ``delay`` seconds from now (once per order)."""
    request_id = x_request_id or uuid.uuid4().hex
    scheduled = await service.enqueue_with_delay(
        PaymentCheck(id=f"order-{order_id}", order_id=order_id),
        delay,
        context={"request_id": request_id},  # the handler reads it with event_context()
    )
    return {"order_id": order_id, "scheduled": scheduled, "request_id": request_id}


@app.get("/orders/{order_id}/check")
async def check_status(
    order_id: int,
    service: Service,
    wait: Annotated[float, Query(ge=0, le=30, description="seconds")] = 0.0,
) -> dict[str, Any]:
    """Where the order's check is (scheduled, ready, in_flight, dead, absent) and its result;
    with ``wait``, wait that long for the result first."""
    event_id = f"order-{order_id}"
    if wait:
        try:  # waits for the worker's ack (a pub/sub wake-up, no polling)
            await service.result(PaymentCheck, event_id, timeout=wait)
        except LookupError:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "no such order check") from None
        except (TimeoutError, EventFailed):
            pass  # reported below
    info = await service.inspect(PaymentCheck, event_id)
    outcome = (await service.results(PaymentCheck, [event_id]))[event_id]
    return {"state": info.state, "result": outcome.value, "error": outcome.error}
