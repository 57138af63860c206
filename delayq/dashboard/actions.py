"""The dashboard's actions: POSTs that requeue, purge, cancel or run events now, and
pause or resume a type (or group).

Each is checked for a CSRF token and refused in read-only mode before it does
anything; everything it changes goes through the public
:class:`~delayq.EventService` API. What cannot be undone (purging, cancelling,
and anything on more than one event) asks first on a confirmation page that
names it; the result page says what was done, and when it differs from what
was confirmed (new dead letters since), by how much and why.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..keyspace.groups import group_name
from ..operations.enqueueing import CancelResult
from .view import DashboardView

__all__ = ["Actions", "checked_form"]


def _count_note(done: int, expected: int) -> str:
    """Why an "all" action touched another number than the one confirmed."""
    if done > expected:
        return (
            f" {expected:,} were there when you confirmed; {done - expected:,} more failed "
            "since and were included."
        )
    if done < expected:
        return (
            f" {expected:,} were there when you confirmed; {expected - done:,} had left "
            "the dead letters since (requeued, purged or removed by someone else)."
        )
    return ""


async def checked_form(dash: DashboardView, request: Request) -> tuple[Any, Response | None]:
    """The form of an action POST and, when the action is refused (read-only mode, or its
    CSRF token or origin is wrong), the page that says so; every action checks first."""
    # a whole page of selected ids (page_size) and a few more fields; bounded
    form = await request.form(max_fields=dash.max_fields, max_files=0)
    if dash.read_only:
        return form, dash.message(
            request, 403, "Read-only", "This dashboard is read-only: actions are switched off."
        )
    problem = dash.csrf.check(request, form)
    if problem is not None:
        return form, dash.message(
            request,
            403,
            "Refused",
            f"The action was refused ({problem}). Reload the page and try again.",
        )
    return form, None


class Actions:
    """The POST handlers of one dashboard."""

    def __init__(self, dash: DashboardView):
        self.dash = dash

    async def _type_form(
        self, request: Request, actions: tuple[str, str]
    ) -> tuple[Any, str, str, str | None, str] | Response:
        """A checked action on a type (or group), as ``(form, type, group, the group's
        argument to the service, action)``; or the page that refuses it."""
        dash = self.dash
        form, refused = await checked_form(dash, request)
        if refused is not None:
            return refused
        name = dash.type_name(str(form.get("type", "")))
        group = dash.group_name(form.get("group"))
        action = form.get("action")
        if action not in actions:
            return dash.message(request, 400, "Bad request", "Unknown action.")
        return form, name, group, dash.group_arg(group), str(action)

    async def dead(self, request: Request) -> Response:
        """Requeue or purge dead letters: one, the selected ones, or all."""
        dash = self.dash
        checked = await self._type_form(request, ("requeue", "purge"))
        if isinstance(checked, Response):
            return checked
        form, name, group, group_arg, action = checked
        every = form.get("scope") == "all"
        ids = [str(i) for i in form.getlist("id") if str(i)]
        if not every and not ids:
            return dash.message(
                request,
                400,
                "Nothing selected",
                "Select dead letters first.",
                back=name,
                back_group=group_arg,
            )
        # purging is for good: even one asks first; so does acting on more than one
        if (every or len(ids) > 1 or action == "purge") and form.get("confirm") != "yes":
            if group_arg is None:
                total = (await dash.service.stats_for(name)).dead
            else:
                per_group = await dash.service.group_stats(name)
                total = per_group[group].dead if group in per_group else 0
            return dash.render(
                request,
                "confirm.html",
                name=name,
                action=action,
                every=every,
                ids=ids,
                total=total,
                group=group,
                group_param=group_arg,
            )
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
        note = ""
        if every:
            try:
                note = _count_note(done, int(str(form.get("expected", ""))))
            except ValueError:
                note = ""
        elif done < len(ids):
            note = (
                f" {len(ids) - done:,} of them were no longer dead letters (requeued, purged "
                "or removed by someone else since the page was shown)."
            )
        return dash.message(
            request,
            200,
            f"{verb} {done} dead letter(s)",
            f"{verb} {done} of {what} of {where}.{note}",
            ids=[] if every else ids[:100],
            back=name,
            back_group=group_arg,
        )

    async def event(self, request: Request) -> Response:
        """Cancel a pending or running event (after a confirmation), or run a scheduled one
        now: in every delivery group, or in the one named by the form's ``group``."""
        dash = self.dash
        form, refused = await checked_form(dash, request)
        if refused is not None:
            return refused
        name = dash.type_name(str(form.get("type", "")))
        event_id = str(form.get("id", ""))
        # absent: every group (and a type without groups); else one group
        group = None if not form.get("group") else dash.group_name(form.get("group"))
        back_group = dash.group_arg(group_name(group))
        action = form.get("action")
        if not event_id or action not in ("cancel", "run_now"):
            return dash.message(request, 400, "Bad request", "Unknown action or missing id.")
        if action == "cancel" and form.get("confirm") != "yes":
            info = await dash.service.inspect(name, event_id)
            return dash.render(
                request,
                "confirm_event.html",
                name=name,
                event_id=event_id,
                info=info,
                group=group,
                group_param=back_group,
            )
        where = "" if group is None else f" for group {group}"
        if action == "cancel":
            result = await dash.service.cancel(name, event_id, group=group)
            ok = bool(result)
            heading = "Cancelled" if ok else "Nothing to cancel"
            message = (
                f"{name} {event_id!r} was removed{where}."
                if result is CancelResult.REMOVED
                else f"{name} {event_id!r} was running{where}: it was removed and its handler "
                "was told to stop."
                if result is CancelResult.SIGNALLED
                else f"{name} {event_id!r} is not pending{where} (already handled, cancelled, "
                "or a dead letter)."
            )
        else:
            ok = await dash.service.run_now(name, event_id, group=group)
            heading = "Running now" if ok else "Not scheduled"
            where = "" if group is None else f" of group {group}"
            message = (
                f"{name} {event_id!r} was handed to the consumers{where}."
                if ok
                else f"{name} {event_id!r} is not scheduled{where} (it may be running or gone "
                "already)."
            )
        return dash.message(
            request, 200, heading, message, back=name, back_group=back_group, event=(name, event_id)
        )

    async def flow(self, request: Request) -> Response:
        """Pause or resume a type (or the form's delivery group) fleet-wide."""
        dash = self.dash
        checked = await self._type_form(request, ("pause", "resume"))
        if isinstance(checked, Response):
            return checked
        _, name, group, group_arg, action = checked
        where = name if group_arg is None else f"{name}, group {group}"
        try:
            if action == "pause":
                await dash.service.pause(name, group=group_arg)
            else:
                await dash.service.resume(name, group=group_arg)
        except ValueError as exc:  # refused (an unknown group name...)
            return dash.message(request, 400, "Refused", str(exc), back=name, back_group=group_arg)
        heading = "Paused" if action == "pause" else "Resumed"
        message = (
            f"{where}: no new handler starts in any process; events are still accepted."
            if action == "pause"
            else f"{where}: waiting workers start handling again."
        )
        return dash.message(request, 200, heading, message, back=name, back_group=group_arg)
