"""Where flow-sdk keeps its state on this machine."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def flow_home(create: bool = True) -> Path:
    """The flow data directory: ``$FLOW_HOME``, else ``~/.flow``; created (0700: it holds
    task secrets, payloads and results) unless ``create`` is False (for callers that only
    name a path in it). One that exists is tightened to 0700, and refused when another user
    owns it."""
    home = Path(os.environ.get("FLOW_HOME") or Path.home() / ".flow").expanduser()
    if create:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make_private(home)
    return home


def _make_private(home: Path) -> None:
    info = home.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"the flow data directory {home} belongs to user {info.st_uid}, not "
                          f"to you ({os.getuid()}): it would hold your task secrets; set "
                          "FLOW_HOME to a directory of your own")
    if stat.S_IMODE(info.st_mode) & 0o077:
        home.chmod(0o700)
