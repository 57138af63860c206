"""CSRF tokens, the Origin check, the auth hook and the security headers of the dashboard.

CSRF: every page sets a random cookie (HttpOnly, SameSite=Strict) and puts
``HMAC(secret, cookie)`` in its forms; a POST must carry both, and its
``Origin`` (when the browser sends one) must be the dashboard's own origin,
scheme included: the configured ``public_origin``, else the one the trusted
proxy forwarded (``X-Forwarded-Proto``/``X-Forwarded-Host``), else the request's
own scheme and ``Host``. ``Origin: null`` (a sandboxed frame, a redirect from
another site) is refused. A page on another site can neither read the cookie
nor compute the token.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AuthHook", "Csrf", "SecurityMiddleware", "normalise_origin"]

log = logging.getLogger("delayq.dashboard")

AuthHook = Callable[[Request], "bool | Response | Awaitable[bool | Response | None] | None"]
"""Called with every request: True/None lets it through, False answers 403, a Response
is sent as it is (say, a 401 asking for HTTP basic credentials); an ``HTTPException``
it raises becomes its response."""

COOKIE = "delayq_csrf"

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
# sent with every response, the auth hook's refusals and errors included
HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise_origin(value: str) -> str | None:
    """``scheme://host[:port]`` in lower case without a default port, or None when ``value``
    is not an http(s) origin (``"null"`` included)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.username or parts.password or parts.query or parts.fragment:
        return None
    host = parts.hostname.lower()
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


class Csrf:
    """Issues and checks the CSRF token of one dashboard app, and its Origin check."""

    def __init__(
        self, secret: bytes, *, public_origin: str | None = None, trust_forwarded: bool = False
    ):
        self._secret = secret
        self.public_origin = public_origin
        self.trust_forwarded = trust_forwarded

    def _sign(self, value: str) -> str:
        return hmac.new(self._secret, value.encode(), hashlib.sha256).hexdigest()

    def token(self, request: Request) -> tuple[str, str | None]:
        """``(form token, new cookie value or None when the request already has one)``."""
        cookie = request.cookies.get(COOKIE, "")
        if len(cookie) == 43:  # token_urlsafe(32)
            return self._sign(cookie), None
        cookie = secrets.token_urlsafe(32)
        return self._sign(cookie), cookie

    def own_origin(self, request: Request) -> str | None:
        """The origin the browser shows for this dashboard (see the module's docstring)."""
        if self.public_origin is not None:
            return self.public_origin
        scheme, host = request.url.scheme, request.headers.get("host", "")
        if self.trust_forwarded:
            # the first value: the one the proxy next to the browser set
            proto = request.headers.get("x-forwarded-proto", "").split(",")[0].strip()
            fwd_host = request.headers.get("x-forwarded-host", "").split(",")[0].strip()
            scheme, host = proto or scheme, fwd_host or host
        return normalise_origin(f"{scheme}://{host}") if host else None

    def check(self, request: Request, form: FormData) -> str | None:
        """None when the POST is genuine, else why it is refused."""
        origin = request.headers.get("origin")
        if origin is not None:
            sent = normalise_origin(origin)
            if sent is None or sent != self.own_origin(request):
                return "cross-origin request"
        elif request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            return "cross-origin request"
        cookie = request.cookies.get(COOKIE, "")
        token = form.get("csrf")
        if not cookie or not isinstance(token, str) or not token:
            return "missing CSRF token"
        if not hmac.compare_digest(token, self._sign(cookie)):
            return "wrong CSRF token"
        return None

    def set_cookie(self, request: Request, response: Response, value: str) -> None:
        """Attach a new CSRF cookie scoped to the dashboard's path (Secure over https)."""
        path = request.scope.get("root_path", "") or "/"
        own = self.own_origin(request) or ""
        response.set_cookie(
            COOKIE,
            value,
            path=path,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https" or own.startswith("https:"),
        )


class SecurityMiddleware:
    """Runs the auth hook first and adds the security headers to every response.

    A plain ASGI middleware, so the headers also go on what the auth hook sends
    (a 401 challenge, a 403) and on the 500 of an unexpected error.
    """

    def __init__(self, app: ASGIApp, auth: AuthHook | None):
        self.app = app
        self._auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Ask the hook, then serve; every response gets :data:`HEADERS`."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        try:
            refusal = await self._ask(Request(scope, receive))
            if refusal is not None:
                await refusal(scope, receive, send_with_headers)
                return
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if started:
                raise
            log.exception("dashboard request failed: %s %s", scope.get("method"), scope.get("path"))
            error = PlainTextResponse("internal error", status_code=500)
            await error(scope, receive, send_with_headers)

    async def _ask(self, request: Request) -> Response | None:
        if self._auth is None:
            return None
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
        return None
