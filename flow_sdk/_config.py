"""Where flow-sdk keeps its state on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def flow_home() -> Path:
    """The flow data directory: ``$FLOW_HOME``, else ``~/.flow``. Created on first use."""
    home = Path(os.environ.get("FLOW_HOME") or Path.home() / ".flow").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home
