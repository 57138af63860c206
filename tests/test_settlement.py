"""Settlement's bookkeeping across runs of a consumer (a crashed run the service restarts)."""

from __future__ import annotations

from delayq.metrics import NoopMetrics
from delayq.retry import fixed
from delayq.runtime.settlement import Settlement


async def test_a_new_run_drops_the_leases_of_handlers_that_ended_unfinished() -> None:
    settlement = Settlement(
        store=None,  # type: ignore[arg-type]  # nothing here talks to Redis
        metrics=NoopMetrics(),
        type_name="t",
        label="t",
        group=None,
        visibility_ms=30_000,
        retry_backoff=fixed(1),
        shutdown_grace=0,
    )
    leased = settlement.leased
    cancelled = ("t", b"cancelled", b"token-1")  # its handler was cancelled with the run
    finished = ("t", b"finished", b"token-2")  # succeeded; the ack never reached Redis
    leased.update({cancelled, finished})
    settlement.acks.append(finished)
    settlement.open()
    # the cancelled delivery's lease is no longer renewed (its event comes back when the
    # lease expires); the unsent ack stays, with the lease that keeps it valid
    assert settlement.leased is leased
    assert leased == {finished}
    assert settlement.acks == [finished]
