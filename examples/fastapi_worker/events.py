"""The event types: shared by the web process (which enqueues) and the workers (which handle).

Pin each wire name with ``event_name=``: it is part of the Redis keys, so the class can be
renamed or moved without orphaning queued events.
"""

from delayq import Event


class PaymentCheck(Event, event_name="payment-check"):
    """Look at an order's payment some time after the order was placed."""

    order_id: int
