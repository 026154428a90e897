"""Where flow-sdk keeps its state on this machine."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from flow_sdk.wire import envvars


def flow_home(create: bool = True) -> Path:
    """The flow data directory: ``$FLOW_HOME``, else ``~/.flow``; created (0700: it holds
    task secrets, payloads and results) unless ``create`` is False (for callers that only
    name a path in it). One that exists is tightened to 0700, and refused when it is a
    symbolic link or another user owns it. What flow creates below it is safe from then on:
    nobody else can add, swap or link anything in a 0700 directory of this user's."""
    home = Path(os.environ.get(envvars.HOME) or Path.home() / ".flow").expanduser()
    if create:
        if home.is_symlink():
            raise _link_error(home)
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make_private(home)
    return home


def _link_error(home: Path) -> PermissionError:
    return PermissionError(
        f"the flow data directory {home} is a symbolic link: flow does not follow it, since "
        "whoever can change the link or its target could read the task secrets written "
        "there; remove the link and set FLOW_HOME to a directory of your own (not a link)")


def _make_private(home: Path) -> None:
    """Check that ``home`` is this user's directory and tighten it to 0700, through one
    descriptor opened without following a link (so none can be swapped in between)."""
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_error(home) from exc
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise PermissionError(
                f"the flow data directory {home} belongs to user {info.st_uid}, not to you "
                f"({os.getuid()}): it would hold your task secrets; set FLOW_HOME to a "
                "directory of your own")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
