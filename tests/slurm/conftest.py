"""One real Slurm cluster per test runner (``tests/slurm_cluster.py``): 3 nodes, each on its
own loopback address; after every test no job of the runner's user is left in ``squeue``."""

from __future__ import annotations

import getpass
from collections.abc import Iterator

import pytest

from slurm_cluster import SlurmCluster, runner_subnet


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"), nodes=3,
                                 subnet=runner_subnet())
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm_clean(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, checked empty of this user's jobs after the test."""
    yield slurm
    user = getpass.getuser()
    jobs = slurm.run("squeue", "-h", "-u", user, "-o", "%i %j %T").stdout
    if jobs.strip():
        slurm.run("scancel", "--full", "-u", user, check=False)
    assert not jobs.strip(), f"jobs left in squeue:\n{jobs}"
