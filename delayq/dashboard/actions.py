"""The dashboard's actions: POSTs that requeue, purge, cancel or run events now, and
pause or resume a type (or group).

Each is checked for a CSRF token and refused in read-only mode before it does
anything; everything it changes goes through the public
:class:`~delayq.EventService` API.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..keys import DEFAULT_GROUP
from ..service import EventService
from .security import Csrf

__all__ = ["Actions", "Pages"]


class Pages(Protocol):
    """What the actions use of the dashboard (:class:`delayq.dashboard.app.Dashboard`)."""

    service: EventService
    read_only: bool
    csrf: Csrf

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        """Render a template with the common context."""

    def type_name(self, request: Request, value: str | None) -> str:
        """An event type's wire name from a query or form."""

    def group_name(self, value: object) -> str:
        """A delivery group name from a query or form."""

    def group_arg(self, group: str) -> str | None:
        """The ``group=`` argument of the service's dead-letter calls."""

class Actions:
    """The POST handlers of one dashboard."""

    def __init__(self, dash: Pages):
        self.dash = dash

    async def _checked_form(self, request: Request) -> tuple[Any, Response | None]:
        dash = self.dash
        form = await request.form()
        if dash.read_only:
            return form, dash.render(
                request, "message.html", status_code=403, heading="Read-only",
                message="This dashboard is read-only: actions are switched off.",
            )  # fmt: skip
        problem = dash.csrf.check(request, form)
        if problem is not None:
            return form, dash.render(
                request, "message.html", status_code=403, heading="Refused",
                message=f"The action was refused ({problem}). Reload the page and try again.",
            )  # fmt: skip
        return form, None

    async def dead(self, request: Request) -> Response:
        """Requeue or purge dead letters: one, the selected ones, or all."""
        dash = self.dash
        form, refused = await self._checked_form(request)
        if refused is not None:
            return refused
        name = dash.type_name(request, str(form.get("type", "")))
        group = dash.group_name(form.get("group"))
        group_arg = dash.group_arg(group)
        action = form.get("action")
        if action not in ("requeue", "purge"):
            return dash.render(request, "message.html", status_code=400, heading="Bad request",
                               message="Unknown action.")  # fmt: skip
        every = form.get("scope") == "all"
        ids = [str(i) for i in form.getlist("id") if str(i)]
        if not every and not ids:
            return dash.render(request, "message.html", status_code=400, heading="Nothing selected",
                               message="Select dead letters first.", back=name,
                               back_group=group_arg)  # fmt: skip
        if (every or len(ids) > 1) and form.get("confirm") != "yes":
            if group_arg is None:
                total = (await dash.service.stats_for(name)).dead
            else:
                per_group = await dash.service.group_stats(name)
                total = per_group[group].dead if group in per_group else 0
            return dash.render(
                request, "confirm.html", name=name, action=action, every=every, ids=ids,
                total=total, group=group, group_param=group_arg,
            )  # fmt: skip
        if action == "requeue":
            done = await dash.service.requeue_dead_letters(
                name, None if every else ids, group=group_arg
            )
            verb = "Requeued"
        else:
            done = await dash.service.purge_dead_letters(
                name, None if every else ids, group=group_arg
            )
            verb = "Purged"
        what = "all dead letters" if every else f"{len(ids)} selected dead letter(s)"
        where = name if group_arg is None else f"{name}, group {group}"
        return dash.render(
            request, "message.html", heading=f"{verb} {done} dead letter(s)",
            message=f"{verb} {done} of {what} of {where}.",
            ids=[] if every else ids[:100], back=name, back_group=group_arg,
        )  # fmt: skip

    async def event(self, request: Request) -> Response:
        """Cancel a scheduled event (in every delivery group), or run it now (in every
        group, or in the one named by the form's ``group``)."""
        dash = self.dash
        form, refused = await self._checked_form(request)
        if refused is not None:
            return refused
        name = dash.type_name(request, str(form.get("type", "")))
        event_id = str(form.get("id", ""))
        # absent: every group (and a type without groups); else one group
        group = None if not form.get("group") else dash.group_name(form.get("group"))
        action = form.get("action")
        if not event_id or action not in ("cancel", "run_now"):
            return dash.render(request, "message.html", status_code=400, heading="Bad request",
                               message="Unknown action or missing id.")  # fmt: skip
        if action == "cancel":
            ok = await dash.service.cancel(name, event_id)
            heading = "Cancelled" if ok else "Nothing to cancel"
            message = (
                f"{name} {event_id!r} was removed." if ok
                else f"{name} {event_id!r} is not pending (already handled, cancelled, or a dead letter)."
            )  # fmt: skip
        else:
            ok = await dash.service.run_now(name, event_id, group=group)
            heading = "Running now" if ok else "Not scheduled"
            where = "" if group is None else f" of group {group}"
            message = (
                f"{name} {event_id!r} was handed to the consumers{where}." if ok
                else f"{name} {event_id!r} is not scheduled{where} (it may be running or gone "
                "already)."
            )  # fmt: skip
        return dash.render(request, "message.html", heading=heading, message=message,
                           back=name, back_group=dash.group_arg(group or DEFAULT_GROUP),
                           event=(name, event_id))  # fmt: skip

    async def flow(self, request: Request) -> Response:
        """Pause or resume a type (or the form's delivery group) fleet-wide."""
        dash = self.dash
        form, refused = await self._checked_form(request)
        if refused is not None:
            return refused
        name = dash.type_name(request, str(form.get("type", "")))
        group = dash.group_name(form.get("group"))
        group_arg = dash.group_arg(group)
        action = form.get("action")
        if action not in ("pause", "resume"):
            return dash.render(request, "message.html", status_code=400, heading="Bad request",
                               message="Unknown action.")  # fmt: skip
        where = name if group_arg is None else f"{name}, group {group}"
        try:
            if action == "pause":
                await dash.service.pause(name, group=group_arg)
            else:
                await dash.service.resume(name, group=group_arg)
        except ValueError as exc:  # a partitioned type
            return dash.render(request, "message.html", status_code=400, heading="Refused",
                               message=str(exc), back=name, back_group=group_arg)  # fmt: skip
        heading = "Paused" if action == "pause" else "Resumed"
        message = (
            f"{where}: no new handler starts in any process; events are still accepted."
            if action == "pause"
            else f"{where}: waiting workers start handling again."
        )
        return dash.render(request, "message.html", heading=heading, message=message,
                           back=name, back_group=group_arg)  # fmt: skip
