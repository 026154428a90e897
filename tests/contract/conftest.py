"""The providers the shipped contract suite (``flow_sdk.testing``) runs against here:
``local``, and ``aws-sim``, the aws provider on the simulated cloud (a moto server over HTTP on
127.0.0.1 whose instances boot through the real node bootstrap).

Another provider runs the same suite by name: ``python -m flow_sdk.testing NAME``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "aws"))

from aws_moto_world import fresh_world, moto_gaps  # noqa: E402
from flow_testing import moto_server  # noqa: E402

from flow_sdk.testing import ProviderUnderTest  # noqa: E402


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    with moto_server() as url, moto_gaps():
        yield url


@pytest.fixture(params=["local", "aws-sim"])
def provider_under_test(request: pytest.FixtureRequest, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderUnderTest]:
    if request.param == "local":
        yield ProviderUnderTest("local")
        return
    world = fresh_world(request.getfixturevalue("moto_url"), tmp_path, monkeypatch)
    yield ProviderUnderTest("aws-sim", world.sim_config())
    world.stop_simulated()  # a failed test stops its nodes too
