"""`flow volumes create/list/delete` through the real console script."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def _flow(flow_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["flow", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FLOW_HOME": str(flow_home)}, check=False)


def test_create_list_delete_a_local_volume(flow_home: Path) -> None:
    created = _flow(flow_home, "volumes", "create", "ckpt", "--size-gb", "5")
    assert created.returncode == 0, created.stderr
    listed = json.loads(_flow(flow_home, "volumes", "list", "--json").stdout)
    assert [(v["name"], v["interface"]) for v in listed] == [("ckpt", "file")]
    deleted = _flow(flow_home, "volumes", "delete", "ckpt", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(_flow(flow_home, "volumes", "list", "--json").stdout) == []
    missing = _flow(flow_home, "volumes", "delete", "ckpt", "--yes")
    assert missing.returncode != 0 and "no volume named 'ckpt'" in missing.stderr


def test_bad_volume_name_is_a_usage_error_and_creates_nothing(flow_home: Path) -> None:
    bad = _flow(flow_home, "volumes", "create", "../escape")
    assert bad.returncode == 2, (bad.returncode, bad.stderr)
    assert json.loads(_flow(flow_home, "volumes", "list", "--json").stdout) == []
