"""The task's secret and objects on the cluster's shared filesystem, as another user of the
cluster sees them: a queued task's boot files (the secret) are 0600 in 0700 folders, and a
process of uid 65534 reads nothing under ``shared_dir`` while the folder above it is open to
all."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flow_sdk import FlowApp, current
from flow_testing import wait_until
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
NOBODY = 65534
# what another user tries on each path (the shell: the test's own interpreter is not theirs)
PROBE = """
for path in "$@"; do
  if [ -d "$path" ]; then ls "$path" > /dev/null 2>&1 && r=READ || r=REFUSED
  else head -c 1 "$path" > /dev/null 2>&1 && r=READ || r=REFUSED
  fi
  echo "$r $path"
done
"""


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A folder every user may enter and list (the shared filesystem's project folder)."""
    folder = Path(tempfile.mkdtemp(prefix="flow-shared-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_nobody(paths: list[Path]) -> dict[str, str]:
    """What a process of uid 65534 could do with each path: READ or REFUSED."""
    assert os.geteuid() == 0, "this test plays another user of the cluster: run it as root"

    def drop() -> None:
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    done = subprocess.run(["/bin/sh", "-c", PROBE, "probe", *map(str, paths)],
                          capture_output=True, text=True, timeout=60, preexec_fn=drop,
                          check=True)
    return {line.split()[1]: line.split()[0] for line in done.stdout.splitlines()}


def rank() -> int:
    return current.rank


def test_another_user_reads_nothing_of_a_task_under_shared_dir(
        slurm_clean: SlurmCluster, every_node_busy: str, open_parent: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    shared = open_parent / "flow"
    app = FlowApp("slurm-files", provider="slurm", provider_config={"shared_dir": str(shared)})
    task = app.function(num_instances=2, max_run_time_hours=0.1)(rank).spawn()  # queued
    wait_until(lambda: bool(task.waiting()), 30, "the job queued")
    boot_files = sorted((shared / "jobs" / task.task_id / "boot").glob("*.json"))
    assert len(boot_files) == 2
    for path in boot_files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (shared, *[p for p in shared.rglob("*") if p.is_dir()]):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    objects = [p for p in shared.rglob("*") if p.is_file()]
    assert any("tasks" in p.parts for p in objects)  # the task's record is among them
    seen = _as_nobody([open_parent, shared, *boot_files, *objects])
    assert seen.pop(str(open_parent)) == "READ"  # the probe can read what is open to it
    assert set(seen.values()) == {"REFUSED"}, seen
    task.cancel()
