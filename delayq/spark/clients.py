"""Synchronous Redis clients for Spark executors (one per process and URL), and the enqueue script.

Executors have no event loop, so they use ``redis.Redis`` or
``redis.cluster.RedisCluster``; every key of one event type shares one hash
tag, so each script call goes to one cluster node.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from .. import lua
from ..errors import QueueFullError, error_code

__all__ = [
    "is_cluster",
    "new_client",
    "resolve_cluster",
    "run_enqueue",
    "shared_client",
]

# --------------------------------------------------------------------------- redis clients

_clients: dict[tuple[str, bool], Any] = {}
_clients_lock = threading.Lock()


def new_client(url: str, cluster: bool) -> Any:
    """A new synchronous client (``RedisCluster`` when ``cluster``) with retries on connection errors."""
    common: dict[str, Any] = {
        "protocol": 2,
        "decode_responses": False,
        "socket_timeout": 30.0,
        "socket_connect_timeout": 10.0,
        "socket_keepalive": True,
    }
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, **common)
    return redis.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionResetError],
        **common,
    )


def shared_client(url: str, cluster: bool) -> Any:
    """A synchronous client for ``url``, cached per process (Spark reuses Python workers)."""
    key = (url, cluster)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = new_client(url, cluster)
        return client


def is_cluster(url: str) -> bool:
    """Whether the Redis at ``url`` runs in cluster mode (``INFO cluster``)."""
    client = redis.Redis.from_url(url, protocol=2, socket_connect_timeout=10, socket_timeout=30)
    try:
        info = client.info("cluster")
    finally:
        client.close()
    return bool(int(info.get("cluster_enabled", 0) or 0))


def resolve_cluster(url: str, cluster: bool | None) -> bool:
    """``cluster`` as given, or detected from the server when None."""
    if cluster is None:
        return is_cluster(url)
    if not isinstance(cluster, bool):
        raise TypeError(f"cluster must be True, False or None (detect), not {cluster!r}")
    return cluster


# --------------------------------------------------------------------------- the enqueue scripts


@functools.cache
def _script(name: str) -> tuple[str, str]:
    source = lua.source(name)
    return source, hashlib.sha1(source.encode("utf-8")).hexdigest()


def run_enqueue(
    client: Any, keys: Sequence[str], calls: Sequence[list[Any]], script: str = "enqueue"
) -> list[list[int]]:
    """Run the enqueue script (or ``sink_enqueue``) once per argument list, all in one pipeline.

    Loads the script (on every primary of a cluster) and runs the calls again
    when Redis does not know it. Running a call twice is safe: its call id and
    chunk number tell the script it is a retry (and the sink's ledger skips
    what it already wrote).
    """
    source, sha = _script(script)
    results: list[list[int] | None] = [None] * len(calls)
    pending = list(range(len(calls)))
    for _ in range(3):
        pipe = client.pipeline(transaction=False)
        for i in pending:
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *calls[i])
        replies = pipe.execute(raise_on_error=False)
        missing = []
        for i, reply in zip(pending, replies):
            if isinstance(reply, NoScriptError):
                missing.append(i)
            elif isinstance(reply, ResponseError) and error_code(reply) == "OOM":
                raise QueueFullError(
                    f"Redis is out of memory (used memory > maxmemory, policy noeviction): "
                    f"the Spark task stopped; the events it wrote so far stay ({reply})"
                ) from reply
            elif isinstance(reply, Exception):
                raise reply
            else:
                results[i] = [int(code) for code in reply]
        if not missing:
            return [r if r is not None else [] for r in results]
        client.script_load(source)
        pending = missing
    raise RuntimeError(f"Redis keeps forgetting the {script} script (SCRIPT FLUSH loop?)")
