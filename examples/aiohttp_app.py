"""delayq in an aiohttp app: ``cleanup_ctx`` runs the service, requests enqueue events.

Run it from the repository root (see examples/README.md)::

    REDIS_URL=redis://localhost:6379/0 python examples/aiohttp_app.py
    # or: REDIS_URL=... python -m aiohttp.web -H localhost -P 8080 aiohttp_app:create_app
    #     (with examples/ on PYTHONPATH)

    curl -X POST 'localhost:8080/orders/42?delay=3' -H 'X-Request-ID: r-1'
    curl localhost:8080/checks      # a few seconds later: the check has run
    curl localhost:8080/stats
"""

import logging
import math
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from delayq import Event, EventService, QueueCounts, current_delivery, event_context

log = logging.getLogger("aiohttp_app")


class PaymentCheck(Event):
    """Look at an order's payment some time after the order was placed."""

    order_id: int


service_key = web.AppKey("service", EventService)
# What the handler has done. A real handler would ask the payment provider and update
# the database; an in-memory list keeps the example self-contained.
checks_key = web.AppKey("checks", list[dict[str, Any]])


async def delayq_service(app: web.Application) -> AsyncIterator[None]:
    """Cleanup context: run the service (scheduler and consumers) while the app runs."""
    checks = app[checks_key]

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

    service = EventService.from_url(
        os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
        # Every app (or environment) sharing one Redis gets its own prefix.
        prefix=os.environ.get("DELAYQ_PREFIX", "shop"),
    )
    service.add_handler(PaymentCheck, check_payment, concurrency=8)
    # Leaving the block (at app cleanup) stops fetching, gives running handlers
    # `shutdown_grace` to finish and closes the Redis connections; events left unfinished
    # come back through their leases, on this process after a restart or on another one.
    async with service:
        app[service_key] = service
        yield
    log.info("delayq service closed")


routes = web.RouteTableDef()


@routes.post("/orders/{order_id:\\d+}")
async def place_order(request: web.Request) -> web.Response:
    """Schedule a payment check of the order ``?delay=`` seconds (default 5) from now."""
    order_id = int(request.match_info["order_id"])
    try:
        delay = float(request.query.get("delay", "5"))
    except ValueError:
        delay = math.nan
    if not 0 <= delay <= 86_400:  # also false for NaN
        raise web.HTTPBadRequest(text="delay must be a number of seconds from 0 to 86400")
    request_id = request.headers.get("X-Request-ID") or uuid.uuid4().hex
    # One check per order: the id makes enqueueing idempotent, so a retried POST keeps
    # the check already scheduled (and `scheduled` is False).
    scheduled = await request.app[service_key].enqueue_with_delay(
        PaymentCheck(id=f"order-{order_id}", order_id=order_id),
        delay,
        context={"request_id": request_id},  # handed to the handler via event_context()
    )
    body = {"order_id": order_id, "scheduled": scheduled, "delay": delay, "request_id": request_id}
    return web.json_response(body, status=202)


@routes.get("/checks")
async def list_checks(request: web.Request) -> web.Response:
    """The payment checks handled by this process so far."""
    return web.json_response(request.app[checks_key])


def _four(counts: QueueCounts) -> dict[str, int]:
    """The state counts (QueueCounts also has next_due_at, backlog_age and due)."""
    return {
        "scheduled": counts.scheduled,
        "ready": counts.ready,
        "in_flight": counts.in_flight,
        "dead": counts.dead,
    }


@routes.get("/stats")
async def stats(request: web.Request) -> web.Response:
    """Scheduled, ready, in-flight and dead events per event type under the prefix."""
    counts = await request.app[service_key].stats()
    return web.json_response({name: _four(c) for name, c in counts.items()})


def create_app(argv: list[str] | None = None) -> web.Application:
    """Build the app; the signature ``python -m aiohttp.web`` expects of an entry point."""
    app = web.Application()
    app[checks_key] = []
    app.cleanup_ctx.append(delayq_service)
    app.add_routes(routes)
    return app


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    web.run_app(
        create_app(),
        host=os.environ.get("HOST", "localhost"),
        port=int(os.environ.get("PORT", "8080")),
    )
