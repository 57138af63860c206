"""The event types: shared by the web process (which enqueues) and the workers (which handle).

Pin each wire name with ``event_name=``: it is part of the Redis keys, so the class can be
renamed or moved without orphaning queued events. ``results=`` keeps each handler's return
value for that long after its event is done.
"""

from datetime import timedelta

from delayq import Event


class PaymentCheck(Event, event_name="payment-check", results=timedelta(days=1)):
    """Look at an order's payment some time after the order was placed; what the handler
    returns is kept a day after it is done (``service.result()`` reads it)."""

    order_id: int


class ReconcilePayments(Event, event_name="reconcile-payments"):
    """Compare the day's payments with the provider's report (fired by a schedule)."""
