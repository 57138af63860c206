"""The dashboard's Schedules page (``/schedules``) and its POST action.

The page lists every recurring schedule: expression, time zone, next and last
fire, lag, state and counts. The action pauses, resumes, triggers or removes
one; like every action it needs a CSRF token and is refused in read-only
mode, and it goes through the public :class:`~delayq.EventService` API.
Everything shown came from Redis: the templates escape it (autoescape).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .actions import checked_form
from .view import DashboardView

__all__ = ["SchedulesPage"]

_ACTIONS = ("pause", "resume", "trigger", "remove")


class SchedulesPage:
    """``GET /schedules`` and ``POST /actions/schedule`` of one dashboard."""

    def __init__(self, dash: DashboardView):
        self.dash = dash

    async def page(self, request: Request) -> Response:
        """Every schedule, by name."""
        schedules = await self.dash.service.schedules()
        done = request.query_params.get("done", "")
        return self.dash.render(request, "schedules.html", schedules=schedules, done=done)

    async def action(self, request: Request) -> Response:
        """Pause, resume, trigger or remove one schedule."""
        dash = self.dash
        form, refused = await checked_form(dash, request)
        if refused is not None:
            return refused
        action, name = str(form.get("action", "")), str(form.get("name", ""))
        if action not in _ACTIONS or not name:
            return dash.message(request, 400, "Bad request", "Unknown action or schedule.")
        service = dash.service
        result: bool | str | None
        if action == "pause":
            result = await service.pause_schedule(name)
        elif action == "resume":
            result = await service.resume_schedule(name)
        elif action == "trigger":
            result = await service.trigger_schedule(name)
        else:
            result = await service.unschedule(name)
        if not result:
            return dash.message(request, 404, "Not found", f"No schedule named {name!r}.")
        root = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{root}/schedules?done={action}", status_code=303)
