"""``python -m delayq.dashboard --redis-url redis://... --port 8080``: serve the dashboard alone."""

from __future__ import annotations

import argparse
import os

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Parse options and serve the dashboard with uvicorn."""
    parser = argparse.ArgumentParser(prog="python -m delayq.dashboard", description=__doc__)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    parser.add_argument("--prefix", default="delayq")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--read-only", action="store_true")
    parser.add_argument("--refresh", type=float, default=5.0, help="live refresh seconds (0: off)")
    parser.add_argument("--root-path", default="", help="URL prefix when behind a proxy")
    parser.add_argument("--public-origin", default=None,
                        help="the origin browsers use behind a proxy, e.g. https://ops.example.com")
    parser.add_argument("--trust-forwarded", action="store_true",
                        help="take the origin from the proxy's X-Forwarded-Proto/-Host headers")
    args = parser.parse_args(argv)

    import uvicorn

    from .app import create_app

    app = create_app(
        args.redis_url, args.prefix, read_only=args.read_only, refresh_seconds=args.refresh,
        public_origin=args.public_origin, trust_forwarded=args.trust_forwarded,
    )  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port, root_path=args.root_path, log_level="info")


if __name__ == "__main__":
    main()
