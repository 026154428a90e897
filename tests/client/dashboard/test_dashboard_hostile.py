"""The dashboard against hostile input and hostile neighbours, in a real headless Chromium
while a real task runs on the local provider:

- a task's store holds a timeline object whose KEY is markup (``<img src=x onerror=...>``):
  the page shows the key as text, on page load and over the live stream, and no script runs;
- the Content-Security-Policy stops an inline script and inline event handlers injected into
  the page;
- another server on this machine (another port of 127.0.0.1), to which the dashboard's page
  sends the browser, gets no credential: no cookie, no token;
- ``flow ui --open`` gives the browser a 0600 redirect file, and no process's command line
  holds the token.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from dashboard_testing import (FLOW, Recorder, Ui, command_lines_holding, start_ui)
from flow_testing import wait_until

from flow_sdk import Task, TaskStatus
from flow_sdk.client.dashboard.auth import COOKIE
from flow_sdk.wire.timeline import NodeTimeline, timeline_prefix

pytestmark = pytest.mark.slow

HOLD = "import time\nprint('held', flush=True)\ntime.sleep(300)\n"
# What the key's markup would do if the page ran it: mark the page.
PAYLOAD = "<img src=x onerror=document.documentElement.dataset.xss=1>"
RAN = "() => document.documentElement.dataset.xss || null"
# Every Content-Security-Policy violation the page reports, from before its first script.
VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
                          (event) => window.__violations.push(event.violatedDirective));
"""


@dataclass
class World:
    home: Path
    task_id: str
    ui: Ui

    @property
    def task_url(self) -> str:
        return self.ui.url.replace("/?", f"/tasks/{self.task_id}?")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A 1-node task held running and a ``flow ui`` over its FLOW_HOME; both stopped after."""
    home = tmp_path_factory.mktemp("hostile-home")
    script = home / "hold.py"
    script.write_text(HOLD)
    env = {**os.environ, "FLOW_HOME": str(home)}
    ran = subprocess.run([FLOW, "run", "-d", "-N", "1", str(script)], capture_output=True,
                         text=True, timeout=120, env=env, stdin=subprocess.DEVNULL, check=True)
    task_id = ran.stdout.strip()
    ui = start_ui(home)
    try:
        yield World(home, task_id, ui)
    finally:
        code = ui.stop()
        subprocess.run([FLOW, "cancel", task_id], capture_output=True, timeout=120, env=env,
                       stdin=subprocess.DEVNULL, check=False)
        assert code == 130, code


def _task_page(browser: object, world: World) -> object:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.add_init_script(VIOLATIONS)
    answer = page.goto(world.task_url)
    assert answer is not None and answer.ok, answer
    page.wait_for_selector("#state-body #nodes", timeout=30_000)
    return page


def test_a_markup_key_is_text_on_page_load_and_over_the_stream_and_runs_nothing(
        world: World, browser: object, monkeypatch: pytest.MonkeyPatch) -> None:
    page = _task_page(browser, world)
    page.wait_for_selector("#timeline svg.timeline", timeout=30_000)  # type: ignore[attr-defined]

    # a real timeline object, sealed with the task's secret, under a key that is markup
    monkeypatch.setenv("FLOW_HOME", str(world.home))
    task = Task.from_id(world.task_id)
    key = f"{timeline_prefix(world.task_id)}{PAYLOAD}"
    task.store.put_record(key, NodeTimeline("i-elsewhere", 0, {"agent_up": time.time()}))

    # over the stream: the open page shows the error that names the key, as text
    page.wait_for_function(  # type: ignore[attr-defined]
        "(text) => document.getElementById('timeline').textContent.includes(text)",
        arg=PAYLOAD, timeout=30_000)
    time.sleep(1.0)  # time for an image error handler to run, were there one
    assert page.locator("#timeline p.error").inner_text().count(PAYLOAD) == 1  # type: ignore[attr-defined]
    assert page.evaluate("document.querySelectorAll('img').length") == 0  # type: ignore[attr-defined]
    assert page.evaluate(RAN) is None  # type: ignore[attr-defined]

    # on page load (the live stream held off, so what shows is what the server rendered)
    page.route("**/events/**", lambda route: route.abort())  # type: ignore[attr-defined]
    answer = page.reload()  # type: ignore[attr-defined]
    html = answer.text()
    assert PAYLOAD not in html and "&lt;img src=x onerror=document" in html
    page.wait_for_selector("#timeline p.error", timeout=10_000)  # type: ignore[attr-defined]
    time.sleep(1.0)
    assert page.locator("#timeline p.error").inner_text().count(PAYLOAD) == 1  # type: ignore[attr-defined]
    assert page.evaluate("document.querySelectorAll('img').length") == 0  # type: ignore[attr-defined]
    assert page.evaluate(RAN) is None  # type: ignore[attr-defined]
    assert page.evaluate("window.__violations") == []  # type: ignore[attr-defined]
    page.close()  # type: ignore[attr-defined]

    # nothing acted on the task: it still runs
    assert Task.from_id(world.task_id).status is TaskStatus.RUNNING


INJECT = """() => new Promise((done) => {
  const mark = (how) => { document.documentElement.dataset.ran = how; };
  window.__mark = mark;
  const box = document.createElement("div");
  box.innerHTML = '<img src="/static/none.png" onerror="__mark(\\'img\\')">'
                + '<button id="injected" onclick="__mark(\\'click\\')">x</button>'
                + '<a id="jslink" href="javascript:__mark(\\'link\\')">x</a>';
  document.body.appendChild(box);
  const script = document.createElement("script");
  script.textContent = "__mark('script')";
  document.body.appendChild(script);
  document.getElementById("injected").click();
  document.getElementById("jslink").click();
  setTimeout(() => done(document.documentElement.dataset.ran || null), 1000);
})"""


def test_the_policy_stops_inline_script_and_handlers_injected_into_the_page(
        world: World, browser: object) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.add_init_script(VIOLATIONS)
    answer = page.goto(world.task_url)
    assert answer is not None and answer.ok
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe" not in csp, csp
    # the page's own script runs (its live log view shows the task's line) ...
    page.wait_for_function("() => [...document.querySelectorAll('#log div.line')]"
                           ".some((d) => d.textContent.endsWith('held'))", timeout=30_000)
    # ... an inline handler, an inline script and a javascript: link do not
    assert page.evaluate(INJECT) is None
    violations = set(page.evaluate("window.__violations"))
    assert {"script-src-attr", "script-src-elem"} <= violations, violations
    page.close()


def test_another_server_the_page_sends_the_browser_to_gets_no_credential(
        world: World, browser: object) -> None:
    name = urlsplit(world.ui.url).hostname
    other = Recorder()  # another port of 127.0.0.1, as another user of the machine would run
    try:
        page = browser.new_page()  # type: ignore[attr-defined]
        page.goto(world.ui.url)
        page.wait_for_selector("#tasks", timeout=30_000)
        # the browser holds the credential: a host-only cookie of the dashboard's own name
        [cookie] = page.context.cookies()
        assert cookie["name"] == COOKIE and cookie["value"] == world.ui.token, cookie
        assert cookie["domain"] == name and cookie["httpOnly"] and cookie["sameSite"] == "Strict"

        targets = [f"http://127.0.0.1:{other.port}/by-address",
                   f"http://localhost:{other.port}/by-localhost",
                   f"http://flow-0123456789abcdef.localhost:{other.port}/by-another-name"]
        for target in targets:
            page.goto(f"{world.ui.base}/")
            page.wait_for_selector("#tasks", timeout=30_000)
            # the dashboard's page sends the browser on, as a page of it could
            page.evaluate("(url) => { window.location.href = url; }", target)
            page.wait_for_url(target, timeout=30_000)
            assert page.locator("#other").inner_text() == "other"
        page.close()
    finally:
        other.close()
    # the browser really reached the other server, each time, and brought it nothing
    assert [seen.path for seen in other.seen] == [urlsplit(t).path for t in targets]
    for seen in other.seen:
        assert "cookie" not in seen.headers and "referer" not in seen.headers, seen
        assert world.ui.token not in seen.path + json.dumps(seen.headers), seen
        assert str(name) not in json.dumps(seen.headers), seen


# The browser ``flow ui --open`` starts (``$BROWSER``): records what it was given, the
# file's mode and, while it runs, which processes' command lines hold the token the file holds.
FAKE_BROWSER = """
import json, os, re, stat, sys
from pathlib import Path
from urllib.parse import urlsplit

given = sys.argv[1:]
page = Path(urlsplit(given[0]).path)
token = re.search(r"token=([A-Za-z0-9_-]+)", page.read_text()).group(1)
holders = []
for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
    try:
        if token.encode() in cmdline.read_bytes():
            holders.append(int(cmdline.parent.name))
    except OSError:
        continue  # ended meanwhile
Path(os.environ["OPENED_RECORD"]).write_text(json.dumps({
    "argv": given, "mode": stat.S_IMODE(page.stat().st_mode),
    "folder_mode": stat.S_IMODE(page.parent.stat().st_mode), "token": token,
    "holders": holders}))
"""


def test_open_hands_the_browser_a_0600_file_and_no_command_line_holds_the_token(
        browser: object, flow_home: Path, tmp_path: Path) -> None:
    record = tmp_path / "opened.json"
    fake = tmp_path / "fake-browser"
    fake.write_text(f"#!{sys.executable}\n{textwrap.dedent(FAKE_BROWSER)}")
    fake.chmod(0o755)
    ui = start_ui(flow_home, "--open", env={"BROWSER": str(fake), "OPENED_RECORD": str(record)})
    try:
        wait_until(record.exists, 30, "the browser to be opened")
        opened = json.loads(record.read_text())
        [uri] = opened["argv"]
        page_file = Path(urlsplit(uri).path)
        assert uri.startswith("file://") and page_file.parent == flow_home, uri
        assert opened["mode"] == 0o600 and opened["folder_mode"] == 0o700, opened
        assert opened["token"] == ui.token and ui.token not in uri
        assert opened["holders"] == []  # while the browser ran
        assert command_lines_holding(ui.token) == {}  # and now

        # the file takes a real browser to the dashboard, signed in
        page = browser.new_page()  # type: ignore[attr-defined]
        page.goto(uri)
        page.wait_for_url(f"{ui.base}/", timeout=30_000)
        page.wait_for_selector("#tasks", timeout=30_000)
        assert [c["name"] for c in page.context.cookies()] == [COOKIE]
        page.close()
    finally:
        code = ui.stop()
    assert code == 130
    assert not page_file.exists()  # the server removes it when it stops
    assert not [p for p in flow_home.glob("ui-open-*")]
    assert re.fullmatch(r"http://flow-[0-9a-f]{16}\.localhost:\d+", ui.base), ui.base
