"""Where flow-sdk keeps its state on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def flow_home(create: bool = True) -> Path:
    """The flow data directory: ``$FLOW_HOME``, else ``~/.flow``; created (0700: it holds
    task secrets, payloads and results) unless ``create`` is False (for callers that only
    name a path in it)."""
    home = Path(os.environ.get("FLOW_HOME") or Path.home() / ".flow").expanduser()
    if create:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home
