"""``flow ui`` as a user runs it: a real subprocess that listens on loopback only, under a
host name of its own, refuses every request without its token (or with a wrong one, or that
names another host, or that changes something from another origin), sends its security
headers on every answer, and on Ctrl-C exits leaving no process behind. Without the web
packages it says in one line how to get them."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dashboard_testing import (FLOW, Answer, Ui, alive, children_of, listening_addresses,
                               request, start_ui)

from flow_sdk.client.dashboard.auth import (COOKIE, cookie_warning, expected_host,
                                            host_warning, is_loopback, page_host)
from flow_sdk.volumes.api import create_volume


def _get(ui: Ui, path: str, headers: dict[str, str] | None = None, method: str = "GET",
         body: str | None = None, host: str | None = None) -> Answer:
    return request(ui, path, headers, method, body, host)


def _has_the_security_headers(answer: Answer) -> None:
    csp = answer.header("content-security-policy") or ""
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'" and directives["script-src"] == "'self'", csp
    assert directives["style-src"] == "'self'" and directives["connect-src"] == "'self'", csp
    assert "unsafe" not in csp and directives["frame-ancestors"] == "'none'", csp
    assert answer.header("referrer-policy") == "same-origin"
    assert answer.header("x-content-type-options") == "nosniff"


def test_token_loopback_and_ctrl_c_leave_nothing(flow_home: Path) -> None:
    create_volume("scratch", 1)
    ui = start_ui(flow_home)
    try:
        pid = ui.proc.pid
        # a host name of this run's own under localhost, on a port of 127.0.0.1
        name = urlsplit(ui.url).hostname or ""
        assert re.fullmatch(r"flow-[0-9a-f]{16}\.localhost", name), ui.url
        # listens on loopback only: every listening socket of the process is 127.0.0.1
        listening = listening_addresses(pid)
        assert listening == [f"127.0.0.1:{ui.port}"], listening

        # no token, a wrong token (in the URL or the cookie): refused, whatever the path
        for path in ("/", "/pools", "/volumes", "/events/tasks", "/static/dashboard.js",
                     "/tasks/x"):
            assert _get(ui, path).status == 403, path
        assert _get(ui, "/?token=wrong").status == 403
        assert _get(ui, "/", {"Cookie": f"{COOKIE}=wrong"}).status == 403
        assert _get(ui, f"/?token={ui.token[:-1]}").status == 403

        # the right token: the cookie is set (host-only: no Domain; HttpOnly,
        # SameSite=Strict), a page of the server's own moves the browser on to the address
        # without the token, and the cookie alone lets the next requests in
        first = _get(ui, f"/?token={ui.token}&status=RUNNING")
        assert first.status == 200 and first.header("cache-control") == "no-store"
        assert '<meta http-equiv="refresh" content="0;url=/?status=RUNNING">' in first.body
        assert ui.token not in first.body
        # it moves the browser on to a path of this server only, never to another host
        elsewhere = _get(ui, f"//evil.example/x?token={ui.token}")
        assert 'content="0;url=/evil.example/x"' in elsewhere.body, elsewhere.body
        cookie = first.header("set-cookie") or ""
        assert cookie.startswith(f"{COOKIE}={ui.token};") and "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie and "domain" not in cookie.lower(), cookie
        with_cookie = {"Cookie": f"{COOKIE}={ui.token}"}
        tasks = _get(ui, "/", with_cookie)
        assert tasks.status == 200
        pools = _get(ui, "/pools", with_cookie)
        assert pools.status == 200 and "no pools" in pools.body
        volumes = _get(ui, "/volumes", with_cookie)  # what `flow volumes list` lists
        assert volumes.status == 200 and 'data-volume="scratch"' in volumes.body
        assert _get(ui, "/volumes?provider=nope", with_cookie).body.count(
            "provider: no task of this machine used &#39;nope&#39;") == 1
        assert _get(ui, "/tasks/no-such-task", with_cookie).status == 404

        # every answer, refusals included, carries the security headers
        for answer in (first, tasks, pools, _get(ui, "/"), _get(ui, "/static/dashboard.js",
                                                                 with_cookie)):
            _has_the_security_headers(answer)

        # the token and the cookie are no good under any other name of this server: its
        # address, localhost, another name under localhost (a DNS-rebound name too); the
        # refusal does not tell the name
        for other in (f"127.0.0.1:{ui.port}", f"localhost:{ui.port}",
                      f"flow-0123456789abcdef.localhost:{ui.port}", f"evil.example:{ui.port}",
                      name, f"{name}:{ui.port + 1}"):
            for path, headers in (("/", with_cookie), (f"/?token={ui.token}", {})):
                refused = _get(ui, path, headers, host=other)
                assert refused.status == 403 and name not in refused.body, (other, path)
                assert refused.header("set-cookie") is None, (other, path)

        # a form that changes something needs the token in its body too, not the cookie only
        form = {**with_cookie, "Content-Type": "application/x-www-form-urlencoded"}
        assert _get(ui, "/tasks/x/cancel", form, "POST", "token=wrong").status == 403
        assert _get(ui, "/tasks/x/cancel", form, "POST", "").status == 403
        assert _get(ui, "/tasks/no-such-task/cancel", form, "POST",
                    f"token={ui.token}").status == 404
        # ... and, when it says where it comes from, it comes from the page's own origin
        for origin in (f"http://127.0.0.1:{ui.port}", "http://evil.example", "null"):
            assert _get(ui, "/tasks/no-such-task/cancel", {**form, "Origin": origin}, "POST",
                        f"token={ui.token}").status == 403, origin
        assert _get(ui, "/tasks/no-such-task/cancel", {**form, "Origin": f"http://{ui.host}"},
                    "POST", f"token={ui.token}").status == 404

        children = children_of(pid)
    finally:
        code = ui.stop()
    # Ctrl-C: the exit code of the table (130) and no process left, by PID
    assert code == 130, ui.proc.stderr.read() if ui.proc.stderr else code
    assert not alive(pid)
    assert [c for c in children if alive(c)] == []


def test_only_loopback_hosts_pass_without_a_warning() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(host) and host_warning(host) is None, host
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.org"):
        warning = host_warning(host)
        assert warning is not None and host in warning and "token" in warning, host


def test_each_run_on_127_0_0_1_gets_a_host_name_of_its_own() -> None:
    names = {page_host("127.0.0.1") for _ in range(50)}
    assert len(names) == 50
    assert all(re.fullmatch(r"flow-[0-9a-f]{16}\.localhost", n) for n in names), names
    assert all(cookie_warning("127.0.0.1", n) is None for n in names)
    # another loopback address keeps its own name, and a warning says its cookie is shared
    for address, shown in (("127.0.0.2", "127.0.0.2"), ("::1", "[::1]")):
        assert page_host(address) == shown
        warning = cookie_warning(address, shown)
        assert warning is not None and "every server" in warning and "--host" in warning
    assert cookie_warning("192.168.1.4", "192.168.1.4") is None  # host_warning says more
    # the Host header every request must carry; none for a server on every address
    assert expected_host("127.0.0.1", "flow-ab.localhost", 80) == "flow-ab.localhost:80"
    assert expected_host("::1", "[::1]", 80) == "[::1]:80"
    assert expected_host("0.0.0.0", "0.0.0.0", 80) is None
    assert expected_host("::", "[::]", 80) is None


def test_without_the_web_packages_one_line_says_how_to_get_them() -> None:
    code = ("import sys; sys.modules['sse_starlette'] = None; "
            "from flow_sdk.cli import main; main(['ui'])")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert ran.stderr.splitlines() == [
        "flow: flow ui needs starlette, uvicorn, sse-starlette, jinja2: pip install starlette "
        "uvicorn sse-starlette jinja2"], ran.stderr
    assert ran.returncode == 1 and ran.stdout == ""


def _flow_ui_line(*args: str) -> tuple[int, str]:
    ran = subprocess.run([FLOW, "ui", *args], capture_output=True, text=True, timeout=60,
                         check=False, stdin=subprocess.DEVNULL)
    [line] = ran.stderr.splitlines()
    return ran.returncode, line


def test_bad_host_or_port_is_one_line_naming_the_flag() -> None:
    code, line = _flow_ui_line("--port", "70000")
    assert code == 2 and line.startswith("flow: --port: "), line
    code, line = _flow_ui_line("--host", "no-such-host.invalid")
    assert code == 2 and line.startswith("flow: --host: "), line
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        code, line = _flow_ui_line("--port", str(taken.getsockname()[1]))
    assert code == 2 and line.startswith("flow: --port: cannot listen on 127.0.0.1:"), line
    assert "choose another --port" in line


def test_the_install_line_names_every_web_package_the_check_looks_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from flow_sdk.client.dashboard import deps

    assert deps.missing_packages() == []
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert deps.missing_packages() == ["uvicorn"]
    with pytest.raises(deps.DashboardUnavailableError) as refused:
        deps.require_web_packages()
    assert str(refused.value).endswith("pip install " + " ".join(deps.WEB_PACKAGES.values()))
