"""CSRF tokens, the auth hook and the security headers of the dashboard.

CSRF: every page sets a random cookie (HttpOnly, SameSite=Strict) and puts
``HMAC(secret, cookie)`` in its forms; a POST must carry both, and its
``Origin`` (when the browser sends one) must be this host. A page on another
site can neither read the cookie nor compute the token.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp

__all__ = ["AuthHook", "Csrf", "SecurityMiddleware"]

AuthHook = Callable[[Request], "bool | Response | Awaitable[bool | Response | None] | None"]
"""Called with every request: True/None lets it through, False answers 403, a Response
is sent as it is (say, a 401 asking for HTTP basic credentials); an ``HTTPException``
it raises becomes its response."""

COOKIE = "delayq_csrf"

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


class Csrf:
    """Issues and checks the CSRF token of one dashboard app."""

    def __init__(self, secret: bytes):
        self._secret = secret

    def _sign(self, value: str) -> str:
        return hmac.new(self._secret, value.encode(), hashlib.sha256).hexdigest()

    def token(self, request: Request) -> tuple[str, str | None]:
        """``(form token, new cookie value or None when the request already has one)``."""
        cookie = request.cookies.get(COOKIE, "")
        if len(cookie) == 43:  # token_urlsafe(32)
            return self._sign(cookie), None
        cookie = secrets.token_urlsafe(32)
        return self._sign(cookie), cookie

    def check(self, request: Request, form: FormData) -> str | None:
        """None when the POST is genuine, else why it is refused."""
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
            return "cross-origin request"
        cookie = request.cookies.get(COOKIE, "")
        sent = form.get("csrf")
        if not cookie or not isinstance(sent, str) or not sent:
            return "missing CSRF token"
        if not hmac.compare_digest(sent, self._sign(cookie)):
            return "wrong CSRF token"
        return None

    @staticmethod
    def set_cookie(request: Request, response: Response, value: str) -> None:
        """Attach a new CSRF cookie scoped to the dashboard's path."""
        path = request.scope.get("root_path", "") or "/"
        response.set_cookie(
            COOKIE,
            value,
            path=path,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )


class SecurityMiddleware(BaseHTTPMiddleware):
    """Runs the auth hook first and adds security headers to every response."""

    def __init__(self, app: ASGIApp, auth: AuthHook | None):
        super().__init__(app)
        self._auth = auth

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """Ask the hook, then serve."""
        if self._auth is not None:
            try:
                verdict: Any = self._auth(request)
                if inspect.isawaitable(verdict):
                    verdict = await verdict
            except HTTPException as exc:
                return PlainTextResponse(
                    str(exc.detail), status_code=exc.status_code, headers=exc.headers
                )
            if isinstance(verdict, Response):
                return verdict
            if verdict is False:
                return PlainTextResponse("forbidden", status_code=403)
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", _CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("X-Frame-Options", "DENY")
        return response
