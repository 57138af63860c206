"""A web dashboard for delayq queues (the ``delayq[dashboard]`` extra).

    from delayq.dashboard import create_app
    app = create_app("redis://localhost:6379/0", prefix="delayq")

Mount it in FastAPI (``app.mount("/delayq", create_app(service))``) or run it
alone with ``python -m delayq.dashboard --redis-url ... --port 8080``. See
docs/DASHBOARD.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app
    from .security import AuthHook

__all__ = ["AuthHook", "create_app"]


def __getattr__(name: str) -> Any:
    # imported on first use, so that `python -m delayq.dashboard` (and `delayq dashboard`)
    # can say which extra is missing instead of failing on `import jinja2` here
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "AuthHook":
        from .security import AuthHook

        return AuthHook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
