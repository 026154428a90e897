"""The SDK's shipped contract suite on the procs provider, and a 2-node task whose nodes
import the SDK, this provider and its node-side module from the wheels the launch shipped."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from flow_procs.node import where_from
from flow_sdk.errors import ValidationError
from flow_sdk.testing import ProviderUnderTest
from flow_sdk.testing.suite import *  # noqa: F401,F403  (the contract, test by test)


def test_the_nodes_import_the_plugin_from_the_wheels_the_launch_shipped(
        provider_under_test: ProviderUnderTest) -> None:
    root = Path(str(dict(provider_under_test.config or {})["root"]))
    task = provider_under_test.app("procs-wheels").function(num_instances=2)(
        where_from).spawn()
    results = task.results(timeout=300)
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    sites = {Path(r["site"]) for r in results}
    assert len(sites) == 2  # each node installed its own
    for r in results:
        site = Path(r["site"])
        assert site.name == "site" and site.parent.parent == root / "nodes" / task.task_id
        for module in ("flow_sdk", "provider", "node_module"):
            assert Path(r[module]).is_relative_to(site), (module, r[module])
    shipped = {}
    for wheel in sorted((root / "store" / "code").glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            shipped[wheel.name] = archive.namelist()
            if "flow_procs/node.py" in shipped[wheel.name]:
                [points] = [n for n in shipped[wheel.name] if n.endswith("entry_points.txt")]
                assert "procs = flow_procs.provider:ProcsProvider" in archive.read(
                    points).decode()
    assert sum("flow_procs/node.py" in names for names in shipped.values()) == 1
    assert sum("flow_sdk/node/agent/main.py" in names for names in shipped.values()) == 1


def test_an_option_the_plugin_does_not_declare_is_refused_before_anything_starts(
        provider_under_test: ProviderUnderTest) -> None:
    root = Path(str(dict(provider_under_test.config or {})["root"]))

    def tasks() -> set[str]:
        folder = root / "instances"
        return {p.name for p in folder.iterdir()} if folder.is_dir() else set()

    before = tasks()
    app = provider_under_test.app("procs-refused")
    with pytest.raises(ValidationError) as refused:
        app.function(num_instances=2, image="python:3.11", mounts={"/s3": "s3://bucket/prefix"})(
            where_from)
    assert [p.field for p in refused.value.problems] == ["image", "mounts"]
    assert all("the procs provider does not support" in p.message
               for p in refused.value.problems)
    assert tasks() == before  # refused before any node started
