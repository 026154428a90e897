"""The Slurm tests use the test runner's cluster (the ``slurm`` fixture of tests/conftest.py);
after every test no job of the runner's user is left in ``squeue``. ``app`` is a ``FlowApp``
on it with a shared folder of the test's own. ``every_node_busy`` and
``one_node_busy`` hold nodes with a job of another name, as another user's job would."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from pathlib import Path

import pytest

from flow_sdk import FlowApp
from flow_testing import wait_until
from slurm_cluster import SlurmCluster


@pytest.fixture
def app(slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FlowApp:
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    return FlowApp("slurm-test", provider="slurm",
                   provider_config={"shared_dir": str(tmp_path / "shared")})


@pytest.fixture
def slurm_clean(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, checked empty of this user's jobs after the test."""
    yield slurm
    left = slurm.jobs_left()
    if left:
        slurm.run("scancel", "--full", "-u", getpass.getuser(), check=False)
    assert not left, f"jobs left in squeue:\n{left}"


def _hold(cluster: SlurmCluster, nodes: int) -> Iterator[str]:
    """Another user's job (as Slurm sees it) holding ``nodes`` nodes until the test ends."""
    job = cluster.run("sbatch", "--parsable", f"-N{nodes}", "--exclusive", "--time=5",
                      "--job-name=other",
                      "--wrap", "sleep 300").stdout.strip()
    try:
        wait_until(lambda: "RUNNING" in cluster.run("squeue", "-h", "-j", job,
                                                    "-o", "%T").stdout, 30, "the holding job")
        yield job
    finally:
        cluster.run("scancel", job, check=False)


@pytest.fixture
def every_node_busy(slurm_clean: SlurmCluster) -> Iterator[str]:
    yield from _hold(slurm_clean, len(slurm_clean.nodes))


@pytest.fixture
def one_node_busy(slurm_clean: SlurmCluster) -> Iterator[str]:
    yield from _hold(slurm_clean, 1)
