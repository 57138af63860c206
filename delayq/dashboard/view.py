"""What the dashboard's page and action handlers use of it: :class:`DashboardView`,
which :class:`delayq.dashboard.app.Dashboard` implements (so ``pages`` and ``actions``
do not import ``app``, which imports them)."""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..service import EventService
from .security import Csrf

__all__ = ["DashboardView"]


class DashboardView(Protocol):
    """What the actions use of the dashboard (:class:`delayq.dashboard.app.Dashboard`)."""

    service: EventService
    read_only: bool
    csrf: Csrf
    page_size: int

    @property
    def max_fields(self) -> int:
        """The most form fields a POST may have."""

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        """Render a template with the common context."""

    def message(
        self, request: Request, status_code: int, heading: str, message: str, **context: Any
    ) -> HTMLResponse:
        """A page that says one thing (a refusal, a result, a missing type)."""

    def type_name(self, value: str | None) -> str:
        """An event type's wire name from a query or form."""

    async def known_type(self, request: Request, value: str | None) -> str | HTMLResponse:
        """The type's name when the prefix has it, else a 404 page."""

    def group_name(self, value: object) -> str:
        """A delivery group name from a query or form."""

    def group_arg(self, group: str) -> str | None:
        """The ``group=`` argument of the service's dead-letter calls."""

    def offset(self, request: Request, name: str, *, merged: bool = False) -> int:
        """A list offset from the query (400 beyond the bound)."""
