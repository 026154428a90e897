"""The pytest plugin of the contract suite: ``--flow-provider NAME`` and
``--flow-provider-config JSON`` choose the provider the ``provider_under_test`` fixture gives
the tests of ``flow_sdk.testing.suite``."""

from __future__ import annotations

import json

import pytest

from flow_sdk.testing.target import ProviderUnderTest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flow-sdk", "flow-sdk provider contract suite")
    group.addoption("--flow-provider", metavar="NAME", default=None,
                    help="the provider to check, by name (a built-in or a plug-in)")
    group.addoption("--flow-provider-config", metavar="JSON", default=None,
                    help="its provider_config, a JSON object (default: its defaults)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: launches a task (real nodes of the provider)")


@pytest.fixture
def provider_under_test(request: pytest.FixtureRequest) -> ProviderUnderTest:
    name = request.config.getoption("--flow-provider")
    if not name:
        raise pytest.UsageError("the contract suite checks one provider: pass --flow-provider "
                                "NAME (python -m flow_sdk.testing NAME)")
    raw = request.config.getoption("--flow-provider-config")
    config = None if raw is None else json.loads(raw)
    if config is not None and not isinstance(config, dict):
        raise pytest.UsageError(f"--flow-provider-config must be a JSON object, not {raw!r}")
    return ProviderUnderTest(name, config)
