"""``python -m delayq.dashboard --redis-url redis://... --port 8080``: serve the dashboard alone
(only the ``dashboard`` extra needed). ``REDIS_URL`` and ``DELAYQ_PREFIX`` give the defaults."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["REQUIRED_MODULES", "app_for", "main", "missing_modules"]

REQUIRED_MODULES = ("starlette", "jinja2", "uvicorn", "multipart")
"""What the dashboard extra installs (``multipart``: python-multipart, for the forms)."""


def missing_modules() -> list[str]:
    """The modules of the dashboard extra that cannot be imported here."""
    missing = []
    for module in REQUIRED_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken install, or one blocked in sys.modules
            found = False
        if not found:
            missing.append(module)
    return missing


def app_for(redis_url: str, prefix: str, cluster: bool, options: dict[str, Any]) -> Starlette:
    """The dashboard app of ``python -m delayq.dashboard`` and ``delayq dashboard``: on a
    cluster, over a service of its own that runs no loop (no scheduler, no heartbeat, no
    history); ``options`` go to :func:`~delayq.dashboard.create_app`."""
    from ..service import EventService
    from .app import create_app

    if not cluster:
        return create_app(redis_url, prefix, **options)
    service = EventService.from_url(
        redis_url,
        cluster=True,
        prefix=prefix,
        enable_scheduling=False,
        heartbeat_interval=0,
        history_interval=0,
    )
    return create_app(service, **options)


def _error(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    """Parse options and serve the dashboard with uvicorn; bad input or a missing extra is a
    one-line error with exit code 2."""
    parser = argparse.ArgumentParser(prog="python -m delayq.dashboard", description=__doc__)
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    )
    parser.add_argument("--prefix", default=os.environ.get("DELAYQ_PREFIX", "delayq"))
    parser.add_argument("--cluster", action="store_true", help="the URL names a Redis Cluster node")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--read-only", action="store_true")
    parser.add_argument("--refresh", type=float, default=5.0, help="live refresh seconds (0: off)")
    parser.add_argument("--page-size", type=int, default=25, help="rows per list page (1..1000)")
    parser.add_argument("--root-path", default="", help="URL prefix when behind a proxy")
    parser.add_argument(
        "--public-origin",
        default=None,
        help="the origin browsers use behind a proxy, e.g. https://ops.example.com",
    )
    parser.add_argument(
        "--trust-forwarded",
        action="store_true",
        help="take the origin from the proxy's X-Forwarded-Proto/-Host headers",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        return _error(f"--port must be from 0 to 65535, not {args.port}")

    missing = missing_modules()
    if missing:
        return _error(
            "the dashboard needs the dashboard extra: pip install 'delayq[dashboard]' "
            f"(missing: {', '.join(missing)})"
        )
    import uvicorn

    options: dict[str, Any] = {
        "read_only": args.read_only,
        "refresh_seconds": args.refresh,
        "page_size": args.page_size,
        "public_origin": args.public_origin,
        "trust_forwarded": args.trust_forwarded,
    }
    try:
        app = app_for(args.redis_url, args.prefix, args.cluster, options)
    except (TypeError, ValueError) as exc:
        return _error(f"bad dashboard settings: {exc}")
    sys.stderr.write(
        f"delayq dashboard for prefix {args.prefix!r} on http://{args.host}:{args.port}{args.root_path}/\n"
    )
    uvicorn.run(app, host=args.host, port=args.port, root_path=args.root_path, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
