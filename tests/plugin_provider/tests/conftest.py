"""The procs provider under the SDK's contract suite: its shared directory, and a launch
whose second node cannot start (for the all-or-none test)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import flow_procs.provider as procs_provider
from flow_sdk.testing import ProviderUnderTest

pytest_plugins = ["flow_sdk.testing.plugin"]


@contextmanager
def _second_node_cannot_start() -> Iterator[None]:
    spawn = procs_provider.spawn
    started: list[object] = []

    def first_only(*args: Any, **options: Any) -> Any:
        if started:
            raise OSError(11, "Resource temporarily unavailable (the test's)")
        started.append(args)
        return spawn(*args, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(procs_provider, "spawn", first_only)
        yield


@pytest.fixture
def provider_under_test(tmp_path_factory: pytest.TempPathFactory) -> ProviderUnderTest:
    root = tmp_path_factory.getbasetemp() / "shared"
    return ProviderUnderTest("procs", {"root": str(root)},
                             partial_launch=_second_node_cannot_start)
