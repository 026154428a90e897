"""The dashboard's routes (Starlette) and ``serve``: bind a loopback address, print the URL
(a host name of this run's own, and the token), answer until Ctrl-C.

Imported only once ``deps.require_web_packages`` passed: it imports the web packages."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl

import uvicorn
from anyio import to_thread
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from flow_sdk import wire
from flow_sdk.client.dashboard import auth, opener, pages, policy, streams, views
from flow_sdk.client.dashboard.taskpage import task_page
from flow_sdk.client.stacks import Stacks
from flow_sdk.client.tasklogs import LOG_SOURCES
from flow_sdk.errors import FieldProblem, FlowError, TaskNotFoundError, ValidationError

STATIC = Path(__file__).resolve().parent / "static"
LOG_TAIL = 5000
STACKS_TIMEOUT_S = 10.0


def _int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name, "")
    if raw == "":
        return None
    number = wire.key_number(raw.removeprefix("-"))
    if number is None:
        raise ValidationError([FieldProblem(name, f"{raw!r} is not a whole number")])
    return -number if raw.startswith("-") else number


def _refusal(exc: FlowError) -> Response:
    """A typed error as a page: 404 for an unknown task, 400 for bad input, else 502."""
    status = 404 if isinstance(exc, TaskNotFoundError) else (
        400 if isinstance(exc, ValidationError) else 502)
    text = "; ".join(f"{p.field}: {p.message}" for p in exc.problems) if isinstance(
        exc, ValidationError) else views.describe(exc)
    return HTMLResponse(pages.message_page("flow ui", text), status_code=status)


async def _form_token(request: Request) -> str | None:
    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body)).get(auth.FORM_FIELD)


class Dashboard:
    """The routes; ``token`` is the one the URL carries, ``host`` the ``Host`` header every
    request must carry (``None``: any)."""

    def __init__(self, token: str, host: str | None) -> None:
        self.token, self.host = token, host

    async def tasks(self, request: Request) -> Response:
        app = request.query_params.get("app") or None
        status = request.query_params.get("status") or None
        rows = views.TaskRows()
        found = await to_thread.run_sync(rows.rows, app, status)
        apps = await to_thread.run_sync(rows.apps)
        return HTMLResponse(pages.tasks_page(found, apps, app, status))

    async def task(self, request: Request, stacks: Stacks | None = None) -> Response:
        task_id = request.path_params["task_id"]
        try:
            task = await to_thread.run_sync(views.open_task, task_id)
            state = await to_thread.run_sync(views.task_state, task)
            svg, key = await to_thread.run_sync(streams.timeline_html, task, state)
            layout = await to_thread.run_sync(views.log_layout, task)
        except FlowError as exc:
            return _refusal(exc)
        return HTMLResponse(task_page(task_id, self.token, state, svg, key, layout, stacks))

    async def cancel(self, request: Request) -> Response:
        if not auth.same_token(await _form_token(request), self.token):
            return Response(auth.REFUSED, status_code=403, media_type="text/plain")
        task_id = request.path_params["task_id"]
        try:
            task = await to_thread.run_sync(views.open_task, task_id)
            await to_thread.run_sync(task.cancel)
        except FlowError as exc:
            return _refusal(exc)
        return RedirectResponse(f"/tasks/{task_id}", status_code=303)

    async def stacks(self, request: Request) -> Response:
        if not auth.same_token(await _form_token(request), self.token):
            return Response(auth.REFUSED, status_code=403, media_type="text/plain")
        try:
            task = await to_thread.run_sync(views.open_task, request.path_params["task_id"])
            taken = await to_thread.run_sync(views.take_stacks, task, STACKS_TIMEOUT_S)
        except FlowError as exc:
            return _refusal(exc)
        return await self.task(request, taken)

    async def pools(self, _request: Request) -> Response:
        return HTMLResponse(pages.pools_page(await to_thread.run_sync(views.pools)))

    async def volumes(self, request: Request) -> Response:
        providers = await to_thread.run_sync(views.volume_providers)
        provider = request.query_params.get("provider") or "local"
        found, error = None, None
        if provider not in providers:
            error = (f"provider: no task of this machine used {provider!r}; choose one of "
                     f"{', '.join(providers)}")
        else:
            try:
                found = await to_thread.run_sync(views.volumes, provider)
            except FlowError as exc:
                error = views.describe(exc)
        return HTMLResponse(pages.volumes_page(provider, list(providers), found, error))

    async def tasks_events(self, request: Request) -> Response:
        return EventSourceResponse(streams.tasks_events(
            request.query_params.get("app") or None, request.query_params.get("status") or None))

    async def task_events(self, request: Request) -> Response:
        try:
            task = await to_thread.run_sync(views.open_task, request.path_params["task_id"])
        except FlowError as exc:
            return _refusal(exc)
        return EventSourceResponse(streams.task_events(task))

    async def log_events(self, request: Request) -> Response:
        source = request.query_params.get("source") or "workers"
        try:
            if source not in LOG_SOURCES:
                raise ValidationError([FieldProblem("source", (
                    f"{source!r} is not one of {', '.join(LOG_SOURCES)}"))])
            node, rank = _int_param(request, "node"), _int_param(request, "rank")
            task = await to_thread.run_sync(views.open_task, request.path_params["task_id"])
            entries = await to_thread.run_sync(
                lambda: task.log_entries(node=node, rank=rank, tail=LOG_TAIL, follow=True,
                                         source=source))  # type: ignore[arg-type]
        except FlowError as exc:
            return _refusal(exc)
        return EventSourceResponse(streams.log_events(entries))

    def app(self) -> Starlette:
        routes = [
            Route("/", self.tasks), Route("/tasks/{task_id}", self.task),
            Route("/tasks/{task_id}/cancel", self.cancel, methods=["POST"]),
            Route("/tasks/{task_id}/stacks", self.stacks, methods=["POST"]),
            Route("/pools", self.pools), Route("/volumes", self.volumes),
            Route("/events/tasks", self.tasks_events),
            Route("/events/task/{task_id}", self.task_events),
            Route("/events/logs/{task_id}", self.log_events),
            Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        ]
        return Starlette(routes=routes, middleware=[
            Middleware(policy.SecurityHeaders),
            Middleware(auth.TokenGate, token=self.token, host=self.host,
                       landing=lambda location: pages.landing_page(location).encode())])


def build_app(token: str, host: str | None) -> Starlette:
    return Dashboard(token, host).app()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port); ``ValidationError``
    naming ``host`` or ``port`` when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValidationError([FieldProblem("host", (
            f"{host!r} is not an address of this machine ({exc.strerror}); leave it out for "
            "127.0.0.1"))]) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        field = "port" if port else "host"
        raise ValidationError([FieldProblem(field, (
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --{field}"
            + (" or leave it out for a free one" if field == "port" else "")))]) from None
    sock.listen(128)
    return sock


def url_of(name: str, port: int, token: str) -> str:
    return f"http://{name}:{port}/?{auth.QUERY}={token}"


def serve(host: str, port: int, open_browser: bool, say: Callable[[str], None],
          warn: Callable[[str], None]) -> None:
    """Serve the dashboard until SIGINT or SIGTERM (uvicorn re-raises the signal after its
    graceful shutdown, so Ctrl-C ends in ``KeyboardInterrupt`` as everywhere else)."""
    sock = bind(host, port)
    address, bound_port = sock.getsockname()[:2]
    name = auth.page_host(address)
    for warning in (auth.host_warning(host), auth.cookie_warning(address, name)):
        if warning is not None:
            warn(warning)
    token = auth.new_token()
    url = url_of(name, bound_port, token)
    say(f"flow ui: serving on {url}")
    say("flow ui: open that URL (it holds the token); Ctrl-C stops the server")
    redirect = None
    try:
        if open_browser:
            redirect = opener.write_redirect(url)
            if not opener.open_page(redirect):
                warn("found no browser to open; open the URL above")
        config = uvicorn.Config(build_app(token, auth.expected_host(address, name, bound_port)),
                                log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        if redirect is not None:
            redirect.unlink(missing_ok=True)

