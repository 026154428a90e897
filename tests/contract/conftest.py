"""The providers the shipped contract suite (``flow_sdk.testing``) runs against here:
``local``; ``aws-sim``, the aws provider on the simulated cloud (a moto server over HTTP on
127.0.0.1 whose instances boot through the real node bootstrap); and ``slurm`` on the test
runner's real Slurm cluster (the ``slurm`` fixture).

Another provider runs the same suite by name: ``python -m flow_sdk.testing NAME``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "aws"))

from aws_moto_world import Ec2Faults, faulty_run_instances, fresh_world, moto_gaps  # noqa: E402
from moto.ec2.models.instances import InstanceBackend  # noqa: E402
from flow_testing import moto_server  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402

from flow_sdk.providers.local import _node  # noqa: E402
from flow_sdk.testing import ProviderUnderTest  # noqa: E402


@contextmanager
def _local_node_fails_after_the_first() -> Iterator[None]:
    """The local provider starts a gang's first node; the next cannot start (no processes)."""
    spawn = _node.spawn
    started: list[object] = []

    def first_only(*args: Any, **options: Any) -> dict[str, Any]:
        if started:
            raise OSError(11, "Resource temporarily unavailable (the test's)")
        started.append(args)
        return spawn(*args, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_node, "spawn", first_only)
        yield


@contextmanager
def _ec2_starts_fewer_than_asked() -> Iterator[None]:
    """EC2 (moto) starts one instance of each gang's request, below its MinCount."""
    faults = Ec2Faults()
    faults.partial(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InstanceBackend, "run_instances", faulty_run_instances(faults))
        yield


@contextmanager
def _partition_takes_one_node(cluster: SlurmCluster) -> Iterator[None]:
    """Slurm starts a job's nodes together or not at all: a gang the partition cannot hold
    whole is refused at submission (``EnforcePartLimits``), and no node of it starts."""
    partition = f"PartitionName={cluster.partition}"
    cluster.run("scontrol", "update", partition, "MaxNodes=1")
    try:
        yield
    finally:
        cluster.run("scontrol", "update", partition, "MaxNodes=UNLIMITED")


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    with moto_server() as url, moto_gaps():
        yield url


@pytest.fixture(params=["local", "aws-sim", "slurm"])
def provider_under_test(request: pytest.FixtureRequest, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderUnderTest]:
    if request.param == "local":
        yield ProviderUnderTest("local", partial_launch=_local_node_fails_after_the_first)
        return
    if request.param == "slurm":
        cluster: SlurmCluster = request.getfixturevalue("slurm")
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield ProviderUnderTest("slurm", {"shared_dir": str(tmp_path / "slurm-shared")},
                                partial_launch=lambda: _partition_takes_one_node(cluster))
        left = cluster.jobs_left()
        assert not left, f"jobs left in squeue:\n{left}"
        return
    world = fresh_world(request.getfixturevalue("moto_url"), tmp_path, monkeypatch)
    yield ProviderUnderTest("aws-sim", world.sim_config(),
                            partial_launch=_ec2_starts_fewer_than_asked)
    world.stop_simulated()  # a failed test stops its nodes too
