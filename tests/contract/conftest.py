"""The providers the shipped contract suite (``flow_sdk.testing``) runs against here:
``local``, and ``aws-sim``, the aws provider on the simulated cloud (a moto server over HTTP on
127.0.0.1 whose instances boot through the real node bootstrap).

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


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    with moto_server() as url, moto_gaps():
        yield url


@pytest.fixture(params=["local", "aws-sim"])
def provider_under_test(request: pytest.FixtureRequest, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderUnderTest]:
    if request.param == "local":
        yield ProviderUnderTest("local", partial_launch=_local_node_fails_after_the_first)
        return
    world = fresh_world(request.getfixturevalue("moto_url"), tmp_path, monkeypatch)
    yield ProviderUnderTest("aws-sim", world.sim_config(),
                            partial_launch=_ec2_starts_fewer_than_asked)
    world.stop_simulated()  # a failed test stops its nodes too
