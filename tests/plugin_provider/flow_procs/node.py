"""Node-side code of the procs provider: what a node says about where it runs. Imported on
the nodes from the wheel the launch shipped."""

from __future__ import annotations

import os
import sys
from typing import Any

import flow_sdk
from flow_sdk import current


def where_from() -> dict[str, Any]:
    """Where this worker imported the SDK, this provider and this module from, and its rank."""
    import flow_procs.provider

    return {"rank": current.rank, "world": current.world_size, "flow_sdk": flow_sdk.__file__,
            "provider": flow_procs.provider.__file__, "node_module": __file__,
            "site": os.environ.get("PYTHONPATH", ""), "python": sys.executable}
