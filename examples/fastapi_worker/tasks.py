"""The handlers, run by worker processes apart from the web app::

    delayq worker tasks:create_service --factory --processes 2      # from this directory

``delayq worker`` imports this module (handlers are registered at import), calls
``create_service()`` in each worker process, starts the service it returns and, on SIGTERM,
drains it: fetching stops, running handlers get ``shutdown_grace``.

``create_service`` is where a worker awaits something before it starts: here it declares
the schedules. ``schedule()`` is an upsert by name, meant to be called at every start, and
it needs ``await``, which a module-level ``tasks:service`` has no place for. (Without
schedules, ``delayq worker tasks:service`` runs the same handlers.)
"""

import logging
import os
from typing import Any

from events import PaymentCheck, ReconcilePayments

from delayq import EventService, current_delivery, event_context

log = logging.getLogger("tasks")

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
PREFIX = os.environ.get("DELAYQ_PREFIX", "shop")  # the same as the web app's

service = EventService.from_url(REDIS_URL, prefix=PREFIX)


async def check_payment(event: PaymentCheck) -> dict[str, Any]:
    """Check the order's payment; the value returned is kept as the event's result (the
    type has ``results=``), raising means retry later."""
    delivery = current_delivery()
    assert delivery is not None  # always set while a handler runs
    request_id = event_context().get("request_id")
    # A real handler would ask the payment provider; this one returns what it did, which
    # the web app's GET /orders/{id}/check reads with service.result()
    log.info("checked payment of order %d (request %s)", event.order_id, request_id)
    return {"request_id": request_id, "attempt": delivery.attempt, "pid": os.getpid()}


async def reconcile(event: ReconcilePayments) -> None:
    """Fired by the "nightly-reconcile" schedule, once per slot whatever the worker count."""
    delivery = current_delivery()
    log.info("reconciling the payments of slot %s", delivery.slot if delivery else None)


service.add_handler(PaymentCheck, check_payment, concurrency=8)
service.add_handler(ReconcilePayments, reconcile)


async def create_service() -> EventService:
    """The service, once its schedules are declared (``--factory`` calls this)."""
    await service.schedule(
        "nightly-reconcile", ReconcilePayments, cron="0 3 * * *", timezone="Europe/Berlin"
    )
    return service
