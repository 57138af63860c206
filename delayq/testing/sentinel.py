"""A private Redis Sentinel set for tests: a master, replicas and sentinels on loopback.

Every process is a :class:`RedisServer` (sentinels run ``redis-server <conf> --sentinel``), so
each can be killed, frozen or restarted like any private server. The sentinels fail over
quickly (``down_after_ms``, default 1 s) so tests of failovers stay short.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .binary import _HOST, free_port
from .lifecycle import Lifecycle
from .resp import _command, _RespError
from .server import RedisServer

__all__ = ["RedisSentinelSet", "SentinelProcess"]

logger = logging.getLogger("delayq.testing")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SentinelProcess(RedisServer):
    """One ``redis-server --sentinel`` process monitoring ``service_name``.

    Sentinel rewrites its configuration file, so one is written into the process's own data
    directory before each start.
    """

    def __init__(
        self,
        service_name: str,
        master: tuple[str, int],
        *,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        binary: str | None = None,
    ) -> None:
        super().__init__(binary=binary)
        self._monitor = (service_name, master, quorum, down_after_ms, failover_timeout_ms)

    def _argv(self) -> list[str]:
        name, (host, port), quorum, down_after, failover = self._monitor
        conf = Path(self.dir) / "sentinel.conf"
        if not conf.exists():  # a restart keeps what sentinel learned and rewrote
            conf.write_text(
                f"sentinel monitor {name} {host} {port} {quorum}\n"
                f"sentinel down-after-milliseconds {name} {down_after}\n"
                f"sentinel failover-timeout {name} {failover}\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
        argv = super()._argv()
        return [argv[0], str(conf), "--sentinel", *argv[1:]]

    def __repr__(self) -> str:
        return f"<SentinelProcess {self.host}:{self.port} pid={self.pid}>"


class RedisSentinelSet(Lifecycle):
    """A master, ``replicas`` replicas and ``sentinels`` sentinels, all on 127.0.0.1.

    Use it as a context manager. :attr:`sentinel_addresses` and :attr:`service_name` are
    what ``EventService.from_sentinel`` takes; :attr:`url` is the same as a
    ``redis+sentinel://`` URL. :meth:`master` tells which data server leads right now
    (according to the sentinels), :meth:`failover` asks for a planned failover, and each
    server in :attr:`servers` can be killed, frozen or restarted.
    """

    def __init__(
        self,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        service_name: str = "delayq-master",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        config: Mapping[str, str] | None = None,
        binary: str | None = None,
        startup_timeout: float = 20.0,
    ) -> None:
        if replicas < 1 or sentinels < 1:
            raise ValueError("a sentinel set needs at least one replica and one sentinel")
        self.service_name = service_name
        data_config = {"repl-diskless-sync": "yes", "repl-diskless-sync-delay": "0"}
        data_config.update(config or {})
        master_port = free_port()
        self.servers: list[RedisServer] = [
            RedisServer(master_port, config=data_config, binary=binary)
        ]
        for _ in range(replicas):
            self.servers.append(
                RedisServer(
                    config={**data_config, "replicaof": f"{_HOST} {master_port}"},
                    binary=binary,
                )
            )
        quorum = sentinels // 2 + 1
        self.sentinels = [
            SentinelProcess(
                service_name,
                (_HOST, master_port),
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                binary=binary,
            )
            for _ in range(sentinels)
        ]
        self._startup_timeout = startup_timeout

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel."""
        return [(s.host, s.port) for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://host:port,host:port/<service_name>``."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service_name}"

    def _ask(self, *args: str) -> Any:
        """Ask the sentinels in turn; the first answer wins."""
        error: Exception | None = None
        for sentinel in self.sentinels:
            if not sentinel.running or sentinel.frozen:
                continue
            try:
                return _command(sentinel.port, *args, timeout=1.0)
            except (OSError, _RespError) as exc:
                error = exc
        raise RuntimeError(f"no sentinel answered {args}: {error!r}")

    def master_address(self) -> tuple[str, int]:
        """The master's address according to the sentinels."""
        host, port = self._ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        return _text(host), int(port)

    def master(self) -> RedisServer:
        """The data server the sentinels name as master."""
        _, port = self.master_address()
        return next(s for s in self.servers if s.port == port)

    def failover(self) -> None:
        """A planned failover (``SENTINEL FAILOVER``): a replica is promoted."""
        self._ask("SENTINEL", "FAILOVER", self.service_name)

    def _replicas_known(self) -> bool:
        for sentinel in self.sentinels:
            try:
                reply = _command(
                    sentinel.port, "SENTINEL", "REPLICAS", self.service_name, timeout=1.0
                )
            except (OSError, _RespError):
                return False
            if len(reply) < len(self.servers) - 1:
                return False
            for fields in reply:
                info = {_text(k): _text(v) for k, v in zip(fields[::2], fields[1::2])}
                if "s_down" in info.get("flags", "") or "disconnected" in info.get("flags", ""):
                    return False
        return True

    def wait_stable(self, timeout: float = 30.0) -> tuple[str, int]:
        """Wait until every sentinel agrees on a master that answers as one and sees every
        replica; return the master's address."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                addresses = {
                    tuple(
                        _text(x)
                        for x in _command(
                            s.port,
                            "SENTINEL",
                            "GET-MASTER-ADDR-BY-NAME",
                            self.service_name,
                            timeout=1.0,
                        )
                    )
                    for s in self.sentinels
                }
                if len(addresses) == 1:
                    host, port = next(iter(addresses))
                    role = _command(int(port), "ROLE", timeout=1.0)
                    if _text(role[0]) == "master" and self._replicas_known():
                        return host, int(port)
            except (OSError, _RespError, TypeError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinel set did not settle on one master in time")
            time.sleep(0.05)

    def start(self) -> RedisSentinelSet:
        """Start the data servers, wait for the replicas to sync, start the sentinels."""
        for server in self.servers:
            server.start()
        deadline = time.monotonic() + self._startup_timeout
        for replica in self.servers[1:]:
            while True:
                info = _command(replica.port, "INFO", "replication", timeout=1.0)
                if "master_link_status:up" in _text(info):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {replica.url} did not sync with the master")
                time.sleep(0.05)
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_stable(self._startup_timeout)
        logger.info(
            "sentinel set ready: master %s, sentinels %s",
            self.servers[0].url,
            [s.port for s in self.sentinels],
        )
        return self

    def close(self) -> None:
        """Stop every process and remove their directories."""
        for process in [*self.sentinels, *self.servers]:
            process.close()
