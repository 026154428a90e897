"""``flow ui`` as a user runs it: a real subprocess that listens on loopback only, refuses
every request without its token (or with a wrong one), and on Ctrl-C exits leaving no process
behind. Without the web packages it says in one line how to get them."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dashboard_testing import FLOW, alive, children_of, listening_addresses, start_ui

from flow_sdk.client.dashboard.auth import COOKIE, host_warning, is_loopback
from flow_sdk.volumes.api import create_volume


class _Answer:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.body = response.read().decode()
        self.getheader = response.getheader


def _get(base: str, path: str, headers: dict[str, str] | None = None,
         method: str = "GET", body: str | None = None) -> _Answer:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    answer = _Answer(conn.getresponse())
    conn.close()
    return answer


def test_token_loopback_and_ctrl_c_leave_nothing(flow_home: Path) -> None:
    create_volume("scratch", 1)
    ui = start_ui(flow_home)
    try:
        pid = ui.proc.pid
        assert urlsplit(ui.url).hostname == "127.0.0.1"
        # listens on loopback only: every listening socket of the process is 127.0.0.1
        listening = listening_addresses(pid)
        assert listening == [f"127.0.0.1:{urlsplit(ui.url).port}"], listening

        # no token, a wrong token (in the URL or the cookie): refused, whatever the path
        for path in ("/", "/pools", "/volumes", "/events/tasks", "/static/dashboard.js",
                     "/tasks/x"):
            assert _get(ui.base, path).status == 403, path
        assert _get(ui.base, "/?token=wrong").status == 403
        assert _get(ui.base, "/", {"Cookie": f"{COOKIE}=wrong"}).status == 403
        assert _get(ui.base, f"/?token={ui.token[:-1]}").status == 403

        # the right token: the cookie is set (HttpOnly, SameSite=Strict), the token leaves
        # the address, and the cookie alone lets the next requests in
        first = _get(ui.base, f"/?token={ui.token}&status=RUNNING")
        assert first.status == 303 and first.getheader("location") == "/?status=RUNNING"
        cookie = first.getheader("set-cookie") or ""
        assert cookie.startswith(f"{COOKIE}={ui.token};") and "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        with_cookie = {"Cookie": f"{COOKIE}={ui.token}"}
        assert _get(ui.base, "/", with_cookie).status == 200
        pools = _get(ui.base, "/pools", with_cookie)
        assert pools.status == 200 and "no pools" in pools.body
        volumes = _get(ui.base, "/volumes", with_cookie)  # what `flow volumes list` lists
        assert volumes.status == 200 and 'data-volume="scratch"' in volumes.body
        assert _get(ui.base, "/volumes?provider=nope", with_cookie).body.count(
            "provider: no task of this machine used &#x27;nope&#x27;") == 1
        assert _get(ui.base, "/tasks/no-such-task", with_cookie).status == 404

        # a form that changes something needs the token in its body too, not the cookie only
        form = {**with_cookie, "Content-Type": "application/x-www-form-urlencoded"}
        assert _get(ui.base, "/tasks/x/cancel", form, "POST", "token=wrong").status == 403
        assert _get(ui.base, "/tasks/x/cancel", form, "POST", "").status == 403
        assert _get(ui.base, "/tasks/no-such-task/cancel", form, "POST",
                    f"token={ui.token}").status == 404

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


def test_without_the_web_packages_one_line_says_how_to_get_them() -> None:
    code = ("import sys; sys.modules['sse_starlette'] = None; "
            "from flow_sdk.cli import main; main(['ui'])")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert ran.stderr.splitlines() == [
        "flow: flow ui needs starlette, uvicorn, sse-starlette: pip install starlette uvicorn "
        "sse-starlette"], ran.stderr
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
