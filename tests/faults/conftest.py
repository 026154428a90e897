"""Fault-injection cases record how they ended; ``bench/faults.py`` prints the table.

Each case calls ``fault_record(case, seconds_to_terminal, leaked, data_lost)``. When
``FLOW_FAULT_REPORT`` names a file, the records are appended to it as JSON lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

Recorder = Callable[[str, float, int, str], None]


@pytest.fixture
def fault_record() -> Recorder:
    def record(case: str, seconds: float, leaked: int, data_lost: str) -> None:
        assert leaked == 0, f"{case}: {leaked} process(es)/instance(s) leaked"
        assert data_lost == "none", f"{case}: lost {data_lost}"
        target = os.environ.get("FLOW_FAULT_REPORT")
        if target:
            with open(Path(target), "a") as fh:
                fh.write(json.dumps({"case": case, "seconds": round(seconds, 2),
                                     "leaked": leaked, "data_lost": data_lost}) + "\n")

    return record
