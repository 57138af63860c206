"""``private_redis``: a URL for a private Redis (``DELAYQ_TEST_REDIS_URL``, a container, or a
local server).

It never reads ``REDIS_URL``: that is the variable applications and the ``delayq``
command read, so it often names a developer's own Redis, which a test must not touch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shlex
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from .server import RedisServer

logger = logging.getLogger("delayq.testing")

TEST_REDIS_URL_ENV = "DELAYQ_TEST_REDIS_URL"
"""The environment variable naming a disposable Redis for tests instead of private ones."""

# --------------------------------------------------------------------------- private_redis


def docker_available(timeout: float = 3.0) -> bool:
    """Return whether a Docker engine answers and testcontainers is installed.

    Uses the docker SDK (a testcontainers dependency), honouring ``DOCKER_HOST``. Never raises.
    """
    if importlib.util.find_spec("testcontainers") is None:
        return False
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]

        client = docker.from_env(timeout=max(1, int(timeout)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception as exc:
        logger.debug("no usable Docker engine: %r", exc)
        return False


def _container_url(container: Any, password: str | None) -> str:
    host = container.get_container_host_ip()
    port = container.get_exposed_port(6379)
    auth = f":{quote(password, safe='')}@" if password else ""
    return f"redis://{auth}{host}:{port}/0"


@contextlib.contextmanager
def private_redis(*, use_docker: bool | None = None, **config: str) -> Iterator[str]:
    """Context manager yielding the URL of a Redis that only the caller uses.

    Tried in this order:

    1. ``DELAYQ_TEST_REDIS_URL`` environment variable: yielded as is, nothing is started and
       ``config`` is ignored (a warning is logged if any was given). Point it only at a
       disposable database. (``REDIS_URL``, the applications' variable, is never read.)
    2. A testcontainers ``RedisContainer`` (image ``$DELAYQ_REDIS_IMAGE``, default
       ``redis:7-alpine``) if testcontainers is installed and a Docker engine answers. Skipped
       when ``use_docker`` is false or the environment variable ``DELAYQ_USE_DOCKER=0``.
    3. A local :class:`RedisServer` process.

    Config items (``appendonly="yes"``, ``maxmemory="10mb"``, ...) apply to options 2 and 3;
    names may use ``_`` instead of ``-``. The container or process is removed on exit.
    """
    items = {key.replace("_", "-"): str(value) for key, value in config.items()}
    env_url = os.environ.get(TEST_REDIS_URL_ENV)
    if env_url:
        if items:
            logger.warning("%s is set; ignoring redis config items %s", TEST_REDIS_URL_ENV, items)
        logger.info("using %s for a private redis", TEST_REDIS_URL_ENV)
        yield env_url
        return

    if use_docker is None:
        use_docker = os.environ.get("DELAYQ_USE_DOCKER", "1").lower() not in {"0", "false", "no"}
    if use_docker and docker_available():
        from testcontainers.redis import RedisContainer

        image = os.environ.get("DELAYQ_REDIS_IMAGE", "redis:7-alpine")
        argv = ["redis-server", "--save", "", "--appendonly", "no"]
        for name, value in items.items():
            argv += [f"--{name}", value]
        password = items.get("requirepass") or None
        container = RedisContainer(image, password=password).with_command(shlex.join(argv))
        logger.info("starting Redis container from %s", image)
        with container:
            yield _container_url(container, password)
        return

    with RedisServer(config=items) as server:
        yield server.url


#: Alias of :func:`private_redis`.
redis_url_context = private_redis
