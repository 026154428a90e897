"""The dashboard's one secret: a random token in the URL ``flow ui`` prints.

The first visit carries it as ``?token=...``; the answer sets it as a cookie (HttpOnly,
SameSite=Strict, so no other site's page can send it) and redirects to the same URL without
it, so it leaves the address bar. Every later request carries the cookie. A request with
neither, or with a wrong token, is refused with 403. A form that changes something (cancel)
also carries the token in its body, checked on the server.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

COOKIE = "flow_ui_token"
QUERY = "token"
FORM_FIELD = "token"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

REFUSED = (b"flow ui: this page needs the token that `flow ui` printed with its URL; open "
           b"that URL (or start `flow ui` again for a new one)\n")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def same_token(given: str | None, token: str) -> bool:
    """Whether ``given`` is the token, compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_warning(host: str) -> str | None:
    """The warning ``flow ui --host`` prints for an address other machines can reach."""
    if is_loopback(host):
        return None
    return (f"listening on {host}, not only on this machine: anyone who can reach it and "
            "holds the token sees your tasks and their logs, and can cancel them")


def _cookie_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:  # a malformed Cookie header is no cookie
                return None
            morsel = jar.get(COOKIE)
            return morsel.value if morsel is not None else None
    return None


class TokenGate:
    """ASGI middleware: lets a request through only with the token (query or cookie)."""

    def __init__(self, app: Asgi, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
        given = next((v for k, v in query if k == QUERY), None)
        if given is not None:
            if not same_token(given, self.token):
                await _respond(send, 403, REFUSED)
                return
            rest = urlencode([(k, v) for k, v in query if k != QUERY])
            await _redirect_with_cookie(send, scope["path"] + (f"?{rest}" if rest else ""),
                                        self.token)
            return
        if not same_token(_cookie_token(scope), self.token):
            await _respond(send, 403, REFUSED)
            return
        await self.app(scope, receive, send)


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _redirect_with_cookie(send: Send, location: str, token: str) -> None:
    cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1")),
                            (b"set-cookie", cookie.encode("latin-1")),
                            (b"cache-control", b"no-store"),
                            (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
