"""The providers the contract suite runs against: ``local``, and ``aws-sim``, the aws provider on
the simulated cloud (a moto server over HTTP on 127.0.0.1 whose instances boot through the real
node bootstrap).

A third provider proves itself by adding a parameter to ``contract`` that yields its
``Contract`` (name and provider_config) and passing ``test_provider_contract.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "aws"))

from aws_moto_world import fresh_world, moto_gaps  # noqa: E402
from contract_helpers import Contract  # noqa: E402
from flow_testing import moto_server  # noqa: E402



@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    with moto_server() as url, moto_gaps():
        yield url


@pytest.fixture(params=["local", "aws-sim"])
def contract(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Contract]:
    if request.param == "local":
        yield Contract("local", None)
        return
    world = fresh_world(request.getfixturevalue("moto_url"), tmp_path, monkeypatch)
    yield Contract("aws-sim", world.sim_config())
    world.stop_simulated()  # a failed test stops its nodes too
