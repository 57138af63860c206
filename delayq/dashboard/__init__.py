"""A web dashboard for delayq queues (the ``delayq[dashboard]`` extra).

    from delayq.dashboard import create_app
    app = create_app("redis://localhost:6379/0", prefix="delayq")

Mount it in FastAPI (``app.mount("/delayq", create_app(service))``) or run it
alone with ``python -m delayq.dashboard --redis-url ... --port 8080``. See
docs/DASHBOARD.md.
"""

from .app import create_app
from .security import AuthHook

__all__ = ["AuthHook", "create_app"]
