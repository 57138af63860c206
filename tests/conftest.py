"""Shared pytest fixtures: private Redis servers, clients, unique key prefixes, waiting.

Tests never touch the machine's own Redis on 6379: unless ``DELAYQ_TEST_REDIS_URL`` is set,
everything runs against ``redis-server`` processes started (and removed) by
:mod:`delayq.testing`. ``REDIS_URL``, the applications' variable, is never read.

This file is deliberately generic: it imports nothing from ``delayq`` except
:mod:`delayq.testing` (and its cluster module).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Protocol

import pytest
import redis.asyncio as aioredis

from delayq import events
from delayq.testing import SERVER_ENV, RedisServer, find_redis_server_binary, wait_for
from delayq.testing.cluster import RedisClusterServer

# --------------------------------------------------------------------------- server choice


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--server NAME``: the server every private server of the run is (see DELAYQ_SERVER);
    ``--lane K/N``: run only this lane's share of the selected tests (see ``Lanes``)."""
    parser.addoption(
        "--server",
        default=None,
        help="server binary for the private servers: redis, redis6.2, valkey, valkey8, "
        "valkey9 or a path (sets DELAYQ_SERVER, so subprocesses use it too)",
    )
    parser.addoption(
        "--lane",
        default=None,
        metavar="K/N",
        help="run only lane K of N: whole test files, balanced by their usual duration "
        "(scripts/test.sh runs the N lanes at once)",
    )
    parser.addoption(
        "--lane-preload",
        default="",
        metavar="S1,S2,...",
        help="with --lane: seconds of other work lanes 1, 2, ... also do (scripts/test.sh: the "
        "Valkey subset runs), so that they get fewer tests here",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Apply ``--server`` before any fixture looks for a binary; register ``--lane``."""
    choice = config.getoption("--server")
    if choice:
        os.environ[SERVER_ENV] = choice
    lane = config.getoption("--lane")
    if lane:
        preload = config.getoption("--lane-preload")
        config.pluginmanager.register(Lanes.parse(lane, preload), "delayq-lanes")


def pytest_report_header(config: pytest.Config) -> str:
    """Say which server binary the private servers run."""
    if os.environ.get("DELAYQ_TEST_REDIS_URL"):
        return "server: DELAYQ_TEST_REDIS_URL"
    try:
        return (
            f"server: {find_redis_server_binary()} ({SERVER_ENV}={os.environ.get(SERVER_ENV, '')})"
        )
    except RuntimeError as exc:
        return f"server: none found ({exc})"


# The `servers` subset: what runs again on Valkey 8 and 9 in CI (scripts/test.sh runs the whole
# suite once on the default server, then `-m servers` with DELAYQ_SERVER=valkey8 and valkey9).
# Everything that talks to the server in a way servers could differ in: core delivery, groups,
# partitions, a 3-master cluster, Sentinel failover, the CLI and the dashboard on a live server,
# error codes, managed-service restrictions. Listed here (a file, or a test node id) so one
# place says what runs where (docs/SERVERS.md shows it); tests may also mark themselves.
SERVERS_SUBSET = (
    "tests/test_delivery.py",
    "tests/test_enqueue.py",
    "tests/test_retries_dead.py",
    "tests/test_scheduler.py",
    "tests/test_groups.py",
    # Not the SIGKILL-a-scheduler-process test (process death, not a server difference), nor
    # the resize test: it asserts exactly-once, but an event claimed while it is migrated runs
    # again by design (migrate_out.lua), which the slower loaded runs hit (twice in three
    # Valkey 9 subset runs here; never alone) - a timing flake, not a server difference.
    "tests/test_partitions.py::test_a_type_with_six_partitions_has_keys_on_every_master",
    "tests/test_partitions.py::test_every_event_is_delivered_once_across_partitions_and_services",
    "tests/test_partitions.py::test_cancel_replace_and_dead_letters_by_id",
    "tests/test_cluster.py",
    "tests/test_groups_cluster.py",
    "tests/test_sentinel.py::test_from_sentinel_enqueues_and_handles",
    "tests/test_sentinel.py::test_min_replicas_refuses_an_unreplicated_enqueue",
    "tests/test_sentinel.py::test_failover_under_load_loses_nothing_with_min_replicas[kill]",
    "tests/test_sentinel.py::test_workers_follow_a_planned_failover",
    "tests/test_cli_ops.py::test_operations",
    "tests/test_cli_ops.py::test_requeue_all_with_progress",
    "tests/test_cli_ops.py::test_delivery_groups",
    "tests/test_cli_worker.py::test_factory_and_check[cli_app:make_service]",
    "tests/test_dashboard.py",
    "tests/test_server_errors.py",
    "tests/test_managed.py",
    "tests/test_idle_timeout.py",  # (the server's idle `timeout` and CONFIG under an ACL)
    "tests/test_security.py::test_acl_user_confined_to_its_prefix_runs_everything[redis-path]",
    "tests/faults/test_fault_memory_full.py::test_enqueue_fails_cleanly_and_handling_goes_on[redis-path]",
)


def _in_subset(nodeid: str) -> bool:
    return any(
        nodeid == entry or nodeid.startswith((entry + "::", entry + "["))
        for entry in SERVERS_SUBSET
    )


# --------------------------------------------------------------------------- lanes

# CI (scripts/test.sh) runs the suite as N pytest processes at once ("lanes", `--lane K/N`):
# most tests wait (for due times, leases, subprocesses, failovers), so on 2 cores N lanes take
# about half the time of one. A lane takes whole files (module- and session-scoped fixtures stay
# in one process), balanced by the seconds each file takes in a lanes run on 2 cores (files
# not listed count half a second per test, their average; list a file over ~10 s). The Spark
# files count more than they take alone: their JVMs need the CPU the other lanes share.
# Every lane computes the same split from the same collection, so the lanes never overlap.
LANE_SECONDS = {
    "tests/test_spark.py": 165.0,
    "tests/test_spark_stream.py": 170.0,  # two starts of a local cluster
    "tests/test_cli_worker.py": 95.0,
    "tests/test_schedules_processes.py": 95.0,
    "tests/faults/test_fault_schedule_restarts.py": 90.0,
    "tests/test_sentinel.py": 90.0,
    "tests/test_cluster_failover.py": 95.0,  # three clusters (or a Sentinel set) failed over
    "tests/test_dashboard_browser.py": 75.0,
    "tests/test_benchmarks_smoke.py": 70.0,
    "tests/test_schedules.py": 50.0,
    "tests/test_docs_site.py": 45.0,  # mkdocs build --strict
    "tests/test_wheel.py": 35.0,  # python -m build, a fresh venv, the demo
    "tests/test_failover_benchmark.py": 45.0,
    "tests/faults/test_fault_network.py": 60.0,  # a 10 s blackhole, latency, a freeze
    "tests/faults/test_fault_soak_short.py": 35.0,
    "tests/test_properties.py": 32.0,
    "tests/test_dashboard_phone.py": 25.0,
    "tests/test_cli_usage.py": 25.0,
    "tests/test_flow.py": 22.0,
    "tests/faults/test_fault_scheduler_contention.py": 20.0,
    "tests/faults/test_fault_slow_handlers.py": 20.0,
    "tests/test_graceful_drain.py": 20.0,
    "tests/faults/test_fault_killed_workers.py": 20.0,
    "tests/postgres/test_cli_outbox.py": 18.0,
    "tests/faults/test_fault_leader_failover.py": 18.0,
    "tests/test_schedules_benchmark_smoke.py": 18.0,
    "tests/test_examples.py": 16.0,
    "tests/test_partitions_join.py": 16.0,
    "tests/test_dashboard_hardening.py": 15.0,
    "tests/test_fault_proxy.py": 12.0,
    "tests/faults/test_fault_frozen_worker.py": 10.0,
    "tests/faults/test_fault_dropped_connections.py": 14.0,
    "tests/test_resilience.py": 14.0,
    "tests/test_cli_ops.py": 14.0,
}


class Lanes:
    """``--lane K/N``: keep lane K's share of the selected tests, deselect the rest.

    Runs after ``-m``/``-k`` selection (trylast), so a lane of ``-m servers`` is balanced on
    that subset: a file's seconds count in proportion to its tests that were selected.
    """

    def __init__(self, lane: int, lanes: int, preload: list[float]) -> None:
        self.lane, self.lanes = lane, lanes
        self.preload = (preload + [0.0] * lanes)[:lanes]

    @classmethod
    def parse(cls, text: str, preload: str = "") -> Lanes:
        try:
            lane, lanes = (int(part) for part in text.split("/"))
            seconds = [float(part) for part in preload.split(",") if part.strip()]
        except ValueError:
            raise pytest.UsageError(
                f"--lane wants K/N (e.g. 1/3), --lane-preload seconds (e.g. 75,75): "
                f"not {text!r}, {preload!r}"
            ) from None
        if not 1 <= lane <= lanes:
            raise pytest.UsageError(f"--lane {text}: K must be between 1 and N")
        return cls(lane - 1, lanes, seconds)

    @staticmethod
    def unit(item: pytest.Item) -> str:
        """What a lane takes whole: the item's file."""
        return item.nodeid.split("::", 1)[0]

    def split(self, collected: dict[str, int], selected: list[pytest.Item]) -> dict[str, int]:
        """Each unit's lane (0-based): heaviest first onto the least loaded lane."""
        chosen: dict[str, int] = {}
        for item in selected:
            chosen[self.unit(item)] = chosen.get(self.unit(item), 0) + 1
        weight = {
            unit: LANE_SECONDS.get(unit, 0.5 * collected[unit]) * n / collected[unit]
            for unit, n in chosen.items()
        }
        loads = list(self.preload)
        lane_of: dict[str, int] = {}
        for unit in sorted(weight, key=lambda u: (-weight[u], u)):
            lane = min(range(self.lanes), key=lambda i: (loads[i], i))
            lane_of[unit] = lane
            loads[lane] += weight[unit]
        return lane_of

    def count(self, items: list[pytest.Item]) -> None:
        """Note each unit's number of tests before ``-m``/``-k`` deselect any."""
        self.collected: dict[str, int] = {}
        for item in items:
            self.collected[self.unit(item)] = self.collected.get(self.unit(item), 0) + 1

    @pytest.hookimpl(trylast=True)  # after `-m`/`-k` selection
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Deselect the tests of the other lanes."""
        lane_of = self.split(self.collected, items)
        keep = [item for item in items if lane_of[self.unit(item)] == self.lane]
        if len(keep) < len(items):
            others = [item for item in items if lane_of[self.unit(item)] != self.lane]
            config.hook.pytest_deselected(items=others)
            items[:] = keep


# --------------------------------------------------------------------------- spark marker


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return True
    return shutil.which("java") is not None


@pytest.hookimpl(tryfirst=True)  # before `-m servers` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the ``servers`` subset; skip ``@pytest.mark.spark`` tests when Java or pyspark is
    missing; let ``--lane`` count the collected tests."""
    lanes = config.pluginmanager.get_plugin("delayq-lanes")
    if lanes is not None:
        lanes.count(items)
    for item in items:
        if _in_subset(item.nodeid):
            item.add_marker(pytest.mark.servers)
    spark_items = [item for item in items if item.get_closest_marker("spark")]
    if not spark_items:
        return
    missing = []
    if not _java_available():
        missing.append("Java (no `java` on PATH or in $JAVA_HOME)")
    if importlib.util.find_spec("pyspark") is None:
        missing.append("pyspark (pip install -e '.[spark]')")
    if missing:
        skip = pytest.mark.skip(reason="spark test needs " + " and ".join(missing))
        for item in spark_items:
            item.add_marker(skip)
        return
    # Every JVM of the Spark tests (the session's, spark-submit's launcher, drivers, executors)
    # is short-lived: the client compiler alone and the serial collector use about a fifth
    # less CPU for them on 2 cores (speed only: no behaviour changes). Users' own settings win.
    os.environ.setdefault("JAVA_TOOL_OPTIONS", SPARK_TEST_JVM_OPTIONS)


SPARK_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# --------------------------------------------------------------------------- redis servers


def _binary_or_skip() -> None:
    """Skip (when DELAYQ_TEST_REDIS_URL is set) or fail clearly if no redis-server is found."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        if os.environ.get("DELAYQ_TEST_REDIS_URL"):
            pytest.skip(f"needs its own redis-server process but none is available: {exc}")
        raise


@pytest.fixture(autouse=True)
def _event_type_names() -> Iterator[None]:
    """Event classes a test defines (README blocks, examples loaded in this process, the
    Spark demo) take wire names in the process-wide registry: hand them back after the
    test, so that two tests may each define their own ``PaymentCheck``."""
    saved = dict(events._registry)
    yield
    events._registry.clear()
    events._registry.update(saved)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private ``redis-server`` process shared by the whole session.

    Tests must isolate their keys with the ``prefix`` fixture and must not kill, freeze or
    reconfigure this server (use ``private_server`` for that). Most tests should depend on
    ``redis_url`` instead, which also honours ``DELAYQ_TEST_REDIS_URL``.
    """
    _binary_or_skip()
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def cluster() -> Iterator[RedisClusterServer]:
    """A private 3-master Redis Cluster shared by the session's cluster tests.

    Like ``redis_server``: isolate keys with ``prefix``; never kill or reconfigure its nodes.
    Skipped when no redis-server binary is found.
    """
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    with RedisClusterServer(3) as c:
        yield c


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """URL of the Redis shared by the session.

    ``DELAYQ_TEST_REDIS_URL`` if set (point it only at a disposable database), otherwise
    the URL of the session's ``redis_server``.
    """
    env_url = os.environ.get("DELAYQ_TEST_REDIS_URL")
    if env_url:
        return env_url
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def prefix() -> str:
    """A unique key prefix/namespace such as ``t-1a2b3c4d`` so tests never collide."""
    return f"t-{uuid.uuid4().hex[:8]}"


class RedisServerFactory(Protocol):
    """Signature of the ``redis_server_factory`` fixture."""

    def __call__(
        self, config: dict[str, str] | None = None, *, start: bool = True, **kwargs: Any
    ) -> RedisServer:
        """Create (and by default start) a RedisServer that is closed after the test."""
        ...


@pytest.fixture
def redis_server_factory() -> Iterator[RedisServerFactory]:
    """Factory for extra private servers, all closed when the test ends.

    ``redis_server_factory({"appendonly": "yes"})`` returns a started :class:`RedisServer`;
    pass ``start=False`` to get it unstarted, and any other :class:`RedisServer` keyword.
    """
    _binary_or_skip()
    servers: list[RedisServer] = []

    def make(
        config: dict[str, str] | None = None, *, start: bool = True, **kwargs: Any
    ) -> RedisServer:
        server = RedisServer(config=config, **kwargs)
        servers.append(server)
        if start:
            server.start()
        return server

    try:
        yield make
    finally:
        for server in reversed(servers):
            server.close()


@pytest.fixture
def private_server(
    request: pytest.FixtureRequest, redis_server_factory: RedisServerFactory
) -> RedisServer:
    """A fresh, started ``redis-server`` for this test only: kill, restart, freeze at will.

    Config items come from ``@pytest.mark.redis_config(appendonly="yes", ...)`` on the test
    (underscores in names become dashes). Skipped when ``DELAYQ_TEST_REDIS_URL`` is set and no
    ``redis-server`` binary is available.
    """
    marker = request.node.get_closest_marker("redis_config")
    config = {}
    if marker is not None:
        config = {key.replace("_", "-"): str(value) for key, value in marker.kwargs.items()}
    return redis_server_factory(config)


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """An async ``redis.asyncio.Redis`` (RESP2) on ``redis_url``, closed after the test."""
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    try:
        yield client
    finally:
        await client.aclose()


WaitFor = Callable[..., Awaitable[Any]]


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> WaitFor:
    """``await wait_for(predicate, timeout=10, interval=0.01, message=None)``.

    Polls a plain or async ``predicate`` until it returns something truthy and returns it;
    raises ``delayq.testing.WaitTimeout`` (an ``AssertionError``) after ``timeout`` seconds.
    Use it instead of fixed sleeps. Same as :func:`delayq.testing.wait_for`.
    """
    return wait_for
