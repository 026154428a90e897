"""What every answer of the dashboard tells the browser about itself: a Content-Security-
Policy that lets the page run only the package's own script file (no inline script, no
inline event handler, no script of another origin, no eval), load only its own files, and
connect only to itself; no ``Referer`` to another origin (the URL's host name stays with
the page; ``no-referrer`` would make the page's own forms say they come from ``null``); no
framing; no type sniffing."""

from __future__ import annotations

from flow_sdk.client.dashboard.auth import Asgi, Message, Receive, Scope, Send

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
]


class SecurityHeaders:
    """ASGI middleware: adds ``HEADERS`` to every HTTP answer, refusals included."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
