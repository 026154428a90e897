"""The dashboard's one secret, a random token in the URL ``flow ui`` prints, and the host
name that URL gives.

The URL's host is a random name of this run's own under ``localhost``
(``flow-<hex>.localhost``: browsers resolve every ``*.localhost`` name to loopback; the
server listens on 127.0.0.1). A browser sends a cookie to every port of the host name it
was set for, so a cookie of ``127.0.0.1`` or ``localhost`` would reach any server another
user of this machine runs on another port; a cookie of this name reaches only servers asked
for by this name, which nobody else knows. Every request must name it in its ``Host``
header (no other page can reach the server under a name of its own, DNS rebinding
included), and a request that changes something must come from the page's own origin.

The first visit carries the token as ``?token=...``; the answer sets it as a host-only
cookie (no ``Domain``; HttpOnly, SameSite=Strict) and is a page (``landing``) that moves
the browser on to the same URL without it, so it leaves the address bar. A page, not a
redirect: the move then starts on the dashboard's own site, so the browser sends the Strict
cookie with it even when the first visit came from elsewhere (``--open``'s file, a link on
another site), where a redirect would carry on a cross-site navigation without it. Every
later request carries the cookie. A request with neither, or with a wrong token, is refused
with 403. A form that changes something (cancel, stacks) also carries the token in its
body, checked on the server.
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
# The page of the first visit: moves the browser on to LOCATION (a path on this server).
Landing = Callable[[str], bytes]

REFUSED = (b"flow ui: this page needs the token that `flow ui` printed with its URL; open "
           b"that URL (or start `flow ui` again for a new one)\n")
# Names no host: the name is what keeps the cookie from other servers of this machine.
WRONG_HOST = (b"flow ui: this server answers only at the address of the URL that `flow ui` "
              b"printed; open that URL\n")
CROSS_ORIGIN = b"flow ui: a change must come from the dashboard's own page\n"
SAFE_METHODS = frozenset({"GET", "HEAD"})


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


def page_host(address: str) -> str:
    """The host name of the URL for a server bound to ``address``: a random name of this
    run's own under ``localhost`` for 127.0.0.1; else the address itself."""
    if address == "127.0.0.1":
        return f"flow-{secrets.token_hex(8)}.localhost"
    return f"[{address}]" if ":" in address else address


def expected_host(address: str, name: str, port: int) -> str | None:
    """The ``Host`` header every request must carry (``NAME:PORT``, as the URL gives it);
    ``None`` for a server bound to every address (0.0.0.0, ::), which other machines reach
    by names it cannot know. ``address`` is the one the socket is bound to."""
    return None if ipaddress.ip_address(address).is_unspecified else f"{name}:{port}"


def cookie_warning(address: str, name: str) -> str | None:
    """The warning for a loopback address that gets no host name of its own (``--host
    127.0.0.2``, ``--host ::1``): its cookie reaches every port of that address."""
    if not is_loopback(address) or name.endswith(".localhost"):
        return None
    return (f"the page's cookie goes to every server on {name}, whatever its port, so "
            "another user's server on this machine can get it; leave --host out for a host "
            "name of this run's own")


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


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return value.decode("latin-1")
    return None


class TokenGate:
    """ASGI middleware: lets a request through only when it names ``host`` (``NAME:PORT``;
    ``None``: any) and carries the token (query or cookie); a request that changes
    something must also come from ``http://NAME:PORT`` when it says where it comes from."""

    def __init__(self, app: Asgi, token: str, host: str | None, landing: Landing) -> None:
        self.app, self.token, self.host, self.landing = app, token, host, landing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.host is not None:
            if (_header(scope, b"host") or "").lower() != self.host:
                await _respond(send, 403, WRONG_HOST)
                return
            origin = _header(scope, b"origin")
            if (scope["method"] not in SAFE_METHODS and origin is not None
                    and origin.lower() != f"http://{self.host}"):
                await _respond(send, 403, CROSS_ORIGIN)
                return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
        given = next((v for k, v in query if k == QUERY), None)
        if given is not None:
            if not same_token(given, self.token):
                await _respond(send, 403, REFUSED)
                return
            rest = urlencode([(k, v) for k, v in query if k != QUERY])
            # one leading slash: a path on this server, never ``//another.host``
            location = "/" + scope["path"].lstrip("/") + (f"?{rest}" if rest else "")
            await _land_with_cookie(send, self.landing(location), self.token)
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


async def _land_with_cookie(send: Send, page: bytes, token: str) -> None:
    cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/html; charset=utf-8"),
                            (b"set-cookie", cookie.encode("latin-1")),
                            (b"cache-control", b"no-store"),
                            (b"content-length", str(len(page)).encode())]})
    await send({"type": "http.response.body", "body": page})
