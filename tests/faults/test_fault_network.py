"""Network faults and a frozen process between a worker and Redis, with a history check.

One of two worker processes reaches Redis through a :class:`delayq.testing.FaultProxy`
(or is SIGSTOPped) while events flow: a 10 s blackhole (a half-open path: nothing
forwarded, nothing closed) longer than the 1 s lease, 200 ms of latency each way, and a
freeze three leases long. Every enqueue that returned is handled; every extra run belongs
to an event caught in the fault's window; nothing the faulted process sent late (an ack,
a failure record, a renewal) changed a newer delivery (see ``netfaults.check``).
``benchmarks/network_faults.py`` runs the same scenarios longer for docs/RELIABILITY.md.
"""

from __future__ import annotations

import pytest
from netfaults import scenario, verdict

CASES = {
    # name: (fault seconds, visibility timeout)
    "blackhole": (10.0, 1.0),
    "latency": (4.0, 2.0),
    "sigstop": (3.0, 1.0),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_a_faulted_worker_loses_nothing_and_disturbs_no_newer_delivery(
    name, redis_server_factory, pools, rec, prefix, run_id
):
    fault_s, visibility = CASES[name]
    outcome = await scenario(
        name,
        queue=redis_server_factory(),
        rec=rec,
        pools=pools,
        prefix=prefix,
        run=run_id,
        fault_s=fault_s,
        visibility=visibility,
    )
    print(f"{name}: {outcome.as_dict()}")
    assert verdict(outcome) == [], outcome.as_dict()
    assert outcome.enqueued > 100
    if name != "latency":  # the fault caught events in progress there
        assert outcome.in_window > 0
