"""The Slurm tests use the test runner's cluster (the ``slurm`` fixture of tests/conftest.py);
after every test no job of the runner's user is left in ``squeue``."""

from __future__ import annotations

import getpass
from collections.abc import Iterator

import pytest

from slurm_cluster import SlurmCluster


@pytest.fixture
def slurm_clean(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, checked empty of this user's jobs after the test."""
    yield slurm
    left = slurm.jobs_left()
    if left:
        slurm.run("scancel", "--full", "-u", getpass.getuser(), check=False)
    assert not left, f"jobs left in squeue:\n{left}"
