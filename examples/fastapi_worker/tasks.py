"""The handlers, run by worker processes apart from the web app::

    delayq worker tasks:service --processes 2      # from this directory

``delayq worker`` imports this module (handlers are registered at import), starts the
service, and on SIGTERM drains it: fetching stops, running handlers get ``shutdown_grace``.
"""

import json
import logging
import os

from events import PaymentCheck

from delayq import EventService, current_delivery, event_context

log = logging.getLogger("tasks")

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
PREFIX = os.environ.get("DELAYQ_PREFIX", "shop")  # the same as the web app's

service = EventService.from_url(REDIS_URL, prefix=PREFIX)


async def check_payment(event: PaymentCheck) -> None:
    """Check the order's payment; returning (or True) means done, raising means retry later."""
    delivery = current_delivery()
    assert delivery is not None  # always set while a handler runs
    request_id = event_context().get("request_id")
    # A real handler would ask the payment provider and update the database; this one
    # records what it did in Redis, where the web app's GET /orders/{id}/check finds it.
    record = {"request_id": request_id, "attempt": delivery.attempt, "pid": os.getpid()}
    await service.store.redis.hset(f"{PREFIX}-checks", str(event.order_id), json.dumps(record))
    log.info("checked payment of order %d (request %s)", event.order_id, request_id)


service.add_handler(PaymentCheck, check_payment, concurrency=8)
