"""The dashboard's batch pages (docs/WORKFLOWS.md, "Batches"): ``/batches`` (the newest
batches, by state) and ``/batch?id=B`` (one batch: its progress, state, times, callbacks,
parent batch, failed members and those it waits on; refreshed live until it is done).

Read-only: they read ``service.batches()`` and ``service.batch_info()`` (the public API)
and change nothing, so they carry no form and need no CSRF token. Everything shown came
from Redis: the templates escape it, and :func:`progress_bar` escapes what it writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from markupsafe import Markup, escape
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..batches import BATCH_TYPE, BatchInfo, BatchState
from .view import DashboardView

__all__ = ["BATCHES_SHOWN", "STATES", "BatchesPage", "member_url", "progress_bar"]

BATCHES_SHOWN = 100
"""The most batches ``/batches`` lists (the newest; the state filter shows others)."""
STATES: tuple[BatchState, ...] = ("open", "waiting", "done", "stuck")
"""The states the list filters on (those of ``service.batches(state=...)``)."""
MEMBERS_SHOWN = 50
"""The most members the batch page lists of those it waits for, and of the failed ones."""


def progress_bar(info: BatchInfo, *, small: bool = False) -> Markup:
    """Succeeded, failed and pending members of the total as one stacked bar (inline SVG:
    the stylesheet colours it; the page's security policy allows no inline style)."""
    width, height = (120, 8) if small else (1000, 18)
    total = max(info.total, info.succeeded + info.failed + info.pending)
    label = (
        f"{info.succeeded:,} succeeded, {info.failed:,} failed, {info.pending:,} pending "
        f"of {info.total:,}"
    )
    out = [
        f'<svg class="progress{" small" if small else ""}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" preserveAspectRatio="none" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<rect class="track" x="0" y="0" width="{width}" height="{height}"/>'
    ]
    x = 0.0
    for css, count, what in (
        ("ok", info.succeeded, "succeeded"),
        ("bad", info.failed, "failed"),
        ("pending", info.pending, "pending"),
    ):
        if total <= 0 or count <= 0:
            continue
        w = width * count / total
        out.append(
            f'<rect class="{css}" data-count="{count}" x="{x:.2f}" y="0" width="{w:.2f}" '
            f'height="{height}"><title>{count:,} {what}</title></rect>'
        )
        x += w
    out.append("</svg>")
    return Markup("".join(out))


def member_url(url: Callable[..., str], kind: str, member_id: str) -> str:
    """The page of a member (or a callback): its event page, or a nested batch's page;
    ``url(path, **params)`` is the templates' (it knows the root path)."""
    if kind == BATCH_TYPE:
        return url("/batch", id=member_id)
    return url("/event", type=kind, id=member_id)


class BatchesPage:
    """``GET /batches``, ``GET /batch`` and ``GET /live/batch`` of one dashboard."""

    def __init__(self, dash: DashboardView):
        self.dash = dash

    async def list_page(self, request: Request) -> Response:
        """The newest batches, all or those in one state."""
        dash = self.dash
        raw = request.query_params.get("state", "")
        if raw and raw not in STATES:
            raise HTTPException(400, f"state must be one of {', '.join(STATES)}")
        state: BatchState | None = next((s for s in STATES if s == raw), None)
        infos = await dash.service.batches(state, limit=BATCHES_SHOWN)
        return dash.render(
            request,
            "batches.html",
            batches=infos,
            state=state,
            states=STATES,
            shown=BATCHES_SHOWN,
            progress_bar=progress_bar,
        )

    async def _read(self, request: Request) -> BatchInfo | Response:
        """The batch named by ``?id=``: 400 for a malformed id, a 404 page for none."""
        dash = self.dash
        batch_id = request.query_params.get("id", "").strip()
        if not batch_id:
            raise HTTPException(400, "a batch id is needed: /batch?id=...")
        try:
            return await dash.service.batch_info(batch_id, members=MEMBERS_SHOWN)
        except LookupError:
            return dash.message(
                request,
                404,
                "No such batch",
                f"No batch {batch_id!r} under the prefix {dash.service.options.prefix!r}: "
                "it was never opened, or it was removed a day after it was done.",
                missing_batch=True,
            )
        except (TypeError, ValueError) as exc:
            raise HTTPException(400, f"bad batch id: {exc}") from exc

    def _context(self, info: BatchInfo) -> dict[str, Any]:
        return {
            "info": info,
            "progress_bar": progress_bar,
            "member_url": member_url,
            "batch_type": BATCH_TYPE,
            "members_shown": MEMBERS_SHOWN,
        }

    async def batch_page(self, request: Request) -> Response:
        """One batch."""
        info = await self._read(request)
        if isinstance(info, Response):
            return info
        return self.dash.render(request, "batch.html", **self._context(info))

    async def batch_live(self, request: Request) -> Response:
        """The batch page's body, for live refresh."""
        info = await self._read(request)
        if isinstance(info, Response):
            return info
        return self.dash.render(request, "_batch_live.html", **self._context(info))
