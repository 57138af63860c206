"""The dashboard's event page (``/event``): one event by type and id, with its state per
delivery group, its context and payload, its workflow (parents and children, drawn by
:mod:`.graph`) and links to its batches (a member's own, the ones a callback runs after);
and the id search it falls back to (a type's ids, or every type's, that start with the
text).

It reads through the public :class:`~delayq.EventService` API, one bounded page at a
time; its actions (run now, cancel, requeue, purge) are POSTs to :mod:`.actions`.
Everything shown came from Redis: the templates escape it.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..batches import BATCH_TYPE
from ..context import BATCH_KEY, BATCH_NAME_KEY
from ..views.inspection import EventInfo
from .graph import MAX_SIDE, Node, Workflow
from .view import DashboardView

__all__ = ["MAX_TYPES_SEARCHED", "EventPage"]

MAX_TYPES_SEARCHED = 50
"""An id search without a type looks for ids starting with the text in this many types."""


class EventPage:
    """``GET /event`` of one :class:`~delayq.dashboard.app.Dashboard`."""

    def __init__(self, dash: DashboardView):
        self.dash = dash
        self.service = dash.service

    async def page(self, request: Request) -> Response:
        """One event by type and id; without a type, every type is searched. When no id
        matches exactly, ids that start with the text are listed."""
        dash = self.dash
        event_id = request.query_params.get("id", "").strip()
        type_value = request.query_params.get("type", "").strip()
        names = sorted(await self.service.store.types.known_types())
        if not event_id:
            return dash.render(
                request,
                "search.html",
                names=names,
                found=[],
                event_id="",
                type_name=type_value,
                searched=False,
                prefixed=[],
            )
        if type_value == BATCH_TYPE:  # a batch where an event would be (a callback's parent)
            root = request.scope.get("root_path", "").rstrip("/")
            return RedirectResponse(f"{root}/batch?{urlencode({'id': event_id})}", 303)
        if type_value:
            candidate = await dash.known_type(request, type_value)
            if isinstance(candidate, Response):
                return candidate
            candidates = [candidate]
        else:
            candidates = names
        infos = await asyncio.gather(*(self.service.inspect(n, event_id) for n in candidates))
        found = [i for i in infos if i.state != "absent"]
        if len(found) == 1:
            info = found[0]
            # per group: which actions apply (run now: scheduled; cancel: scheduled, ready
            # or running; requeue/purge: dead)
            states = {info.state, *(g.state for g in info.groups.values())}
            return dash.render(
                request,
                "event.html",
                info=info,
                workflow=await self._workflow(info),
                # a batch's member (its context names the batch), or an event that runs
                # after a batch (a callback: a parent of the batches' type): links to it
                member_of=info.context.get(BATCH_KEY),
                member_of_name=info.context.get(BATCH_NAME_KEY),
                after_batches=[p.id for p in info.parents if p.event_type == BATCH_TYPE],
                batch_type=BATCH_TYPE,
                any_scheduled="scheduled" in states,
                any_pending=bool(states & {"scheduled", "ready", "in_flight"}),
            )
        prefixed: list[tuple[str, Any]] = []
        complete = True
        if not found:
            searched = candidates[:MAX_TYPES_SEARCHED]
            complete = len(searched) == len(candidates)
            results = await asyncio.gather(
                *(self.service.find_ids(n, event_id, limit=dash.page_size) for n in searched)
            )
            for n, result in zip(searched, results, strict=True):
                complete = complete and result.complete
                prefixed.extend((n, m) for m in result.matches)
        return dash.render(
            request,
            "search.html",
            status_code=404 if not found and not prefixed else 200,
            names=names,
            found=found,
            event_id=event_id,
            type_name=type_value,
            searched=True,
            prefixed=prefixed,
            prefix_complete=complete,
            types_searched=min(len(candidates), MAX_TYPES_SEARCHED),
            types_total=len(candidates),
        )

    async def _workflow(self, info: EventInfo) -> Workflow | None:
        """The event's parents and children with their states (None: it has neither):
        its parents' records, the children linked to it, each child inspected."""
        total, kids = await self.service.children(info.type_name, info.id, limit=MAX_SIDE)
        if not info.parents and not total:
            return None
        states = await asyncio.gather(*(self._state(t, i) for t, i in kids))
        return Workflow(
            Node(info.type_name, info.id, info.state),
            [Node(p.event_type, p.id, p.status) for p in info.parents[:MAX_SIDE]],
            max(len(info.parents) - MAX_SIDE, 0),
            [Node(t, i, st) for (t, i), st in zip(kids, states, strict=True)],
            total - len(kids),
        )

    async def _state(self, type_name: str, event_id: str) -> str:
        """A child's state: an event's (``inspect``), or a batch's (a member's child is its
        batch: ``batch_info``, "absent" once removed)."""
        if type_name != BATCH_TYPE:
            return (await self.service.inspect(type_name, event_id)).state
        try:
            return (await self.service.batch_info(event_id, members=0)).state
        except LookupError:
            return "absent"
