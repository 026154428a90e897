"""``flow ui --open``: the browser is given a file, not the URL. Its command line (``ps``
shows it to every user of the machine) names a page in ``$FLOW_HOME`` that only this user
can read (0600) and that sends the browser on to the URL with the token, as notebook
servers do. The server removes the file when it stops."""

from __future__ import annotations

import os
import tempfile
import webbrowser
from pathlib import Path

from flow_sdk._config import flow_home
from flow_sdk.client.dashboard.render import render


def write_redirect(url: str) -> Path:
    """A new 0600 page in ``$FLOW_HOME`` (0700) that sends the browser to ``url``."""
    fd, name = tempfile.mkstemp(prefix="ui-open-", suffix=".html", dir=flow_home())
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(render("open.html", url=url))
    return Path(name)


def open_page(page: Path) -> bool:
    """Give the browser ``page`` (a file); whether a browser took it."""
    return webbrowser.open(page.as_uri())
