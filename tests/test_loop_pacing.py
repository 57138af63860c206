"""Background loops sleep between their turns in every state, errors included.

A loop that skips its sleep while a pass sends nothing never gives the event loop back:
the whole process (enqueues, handlers, lease renewals) stops until it does. One did after
two Sentinel failovers in a row (a standby scheduler left with a leader's wake-up: see
test_scheduler.py and docs/RELIABILITY.md); these are the other states a review found.
Each case runs in a child process (tests/pacing_child.py) whose watchdog exits with
code 3 if its event loop stops turning, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from delayq.testing import RedisServer

CHILD = Path(__file__).with_name("pacing_child.py")


def run(case: str, url: str = "-") -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(CHILD), case, url], capture_output=True,
                          text=True, timeout=90)  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("case", ["spread-readonly", "spread-pool", "spread-no-units"])
def test_the_partitions_spread_backs_off_with_a_wakeup_pending(
    private_server: RedisServer, case: str
) -> None:
    """A failing beat (READONLY, or the pool exhausted before any await) with a wake-up
    pending was retried at once, forever (4,794 beats in 1 s; with the pool exhausted the
    event loop never turned again), and a wake-up pending when the last partitioned type
    went kept the loop from ever awaiting. Now: the backoff (0.1 s, doubling)."""
    counts = run(case, private_server.url)
    assert counts.get("scheduler_membership", 0) <= 6, counts


def test_a_failing_leader_with_a_wakeup_pending_backs_off(private_server: RedisServer) -> None:
    """Lock renewals failing (READONLY) with a wake-up pending: retried at once (4,936 in
    1 s, 0.9 s of CPU), now after the backoff."""
    counts = run("scheduler-readonly", private_server.url)
    assert counts.get("take_lock", 0) <= 6, counts
    assert counts["cpu_s"] < 0.5, counts


def test_a_subscription_dropped_at_once_is_made_again_with_a_backoff(
    private_server: RedisServer,
) -> None:
    """The scheduler's wake-up subscription killed as soon as it is made: the backoff started
    over at every SUBSCRIBE's reply, so it was made again every 0.1 s (each time with a sweep
    of every type); now it starts over only after a subscription that held."""
    counts = run("scheduler-resubscribe", private_server.url)
    assert counts.get("wakeups", 0) <= 6, counts


def test_the_schedule_firer_backs_off_while_woken(private_server: RedisServer) -> None:
    """The firer's reads failing at once while wake-ups keep coming (every 10 ms): a retry
    per wake-up (about 100 in 1 s) before; now a wake-up cuts a backoff short only after
    MIN_RETRY (0.1 s), so a subscription back after an outage is still heard at once."""
    counts = run("firer-pool", private_server.url)
    assert counts.get("schedules_due", 0) <= 15, counts


def test_the_supervisor_sleeps_while_its_workers_drain() -> None:
    """``--processes N``: once SIGTERMed, the supervisor's wait returned at once on every
    turn until the children had drained (1.68 s of CPU in a 2 s drain)."""
    result = run("supervisor-drain")
    assert result["code"] == 0 and result["started"] == 2, result
    assert result["cpu_s"] < 0.5 * result["wall_s"], result


def test_a_signal_before_the_supervisor_started_starts_no_worker() -> None:
    """A SIGTERM that came before the event loop ran: workers were started anyway and never
    signalled (they ran until killed, the supervisor spinning). Now none is started."""
    result = run("supervisor-early")
    assert result == {**result, "code": 0, "started": 0}, result
