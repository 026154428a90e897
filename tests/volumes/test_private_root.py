"""The private root local nodes use for literal mount paths: what it hides, and that building
it leaves the host untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flow_sdk.system.mountns import hidden_host_entries, needed_tree

REPO = Path(__file__).resolve().parents[2]


def test_needed_tree_and_hidden_host_entries(tmp_path: Path) -> None:
    assert needed_tree(["/shared/ckpt", "/shared/data", "/x"]) == {
        "shared": {"ckpt": {}, "data": {}}, "x": {}}
    host = tmp_path / "host"
    (host / "tmp" / "other").mkdir(parents=True)
    (host / "mnt" / "ckpt").mkdir(parents=True)
    # New top-level directories and existing leaves hide nothing.
    assert hidden_host_entries(["/shared/ckpt", "/data", "/tmp"], host_root=host) == []
    # /tmp/x would turn the rest of /tmp into a read-only mirror.
    assert hidden_host_entries(["/tmp/x"], host_root=host) == [str(host / "tmp" / "other")]
    # ... unless those entries are themselves mounts already on the host (a cloud node).
    assert hidden_host_entries(["/mnt/data"], host_root=host) == [str(host / "mnt" / "ckpt")]
    assert hidden_host_entries(["/mnt/data"], host_root=host, mounted=["/mnt/ckpt"]) == []
    (host / "shared" / "ckpt").mkdir(parents=True)
    assert hidden_host_entries(["/shared/data"], host_root=host) == [str(host / "shared" / "ckpt")]


_CHILD = """
import os, sys
from pathlib import Path
from flow_sdk.system.mountns import Bind, enter_private_root
volume, cache, staging = map(Path, sys.argv[1:4])
enter_private_root([Bind("/flow-test-shared/ckpt", volume, False),
                    Bind("/flow-test-data", cache, True)], staging)
open("/flow-test-shared/ckpt/written", "w").write("from inside")
print(open("/flow-test-data/in-cache").read())
for target in ("/flow-test-data/new", "/flow-test-shared/new"):
    try:
        open(target, "w")
    except OSError as exc:
        print(exc)
print(sorted(os.listdir("/flow-test-shared")), os.path.isdir("/proc/self"), os.getcwd())
"""


def test_private_root_shows_binds_literally_and_leaves_the_host_alone(
        tmp_path: Path, literal_paths: bool) -> None:
    if not literal_paths:
        # CI runs as root, where the namespace must work: there this is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail("CI gives no private mount namespace (needs CAP_SYS_ADMIN as root)")
        pytest.skip("this machine gives no private mount namespace (needs CAP_SYS_ADMIN); "
                    "nodes use mapped paths here")
    volume, cache, staging = tmp_path / "volume", tmp_path / "cache", tmp_path / "root"
    volume.mkdir()
    cache.mkdir()
    (cache / "in-cache").write_text("cached")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(volume), str(cache), str(staging)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "cached",
        "[Errno 30] Read-only file system: '/flow-test-data/new'",
        "[Errno 30] Read-only file system: '/flow-test-shared/new'",
        f"['ckpt'] True {tmp_path}",
    ]
    assert (volume / "written").read_text() == "from inside"
    assert not os.path.exists("/flow-test-shared") and not os.path.exists("/flow-test-data")
    assert os.listdir(staging) == []  # the private root's tmpfs was never on the host
