"""Local code travels with the function: a module beside this test file and a local package,
used as ``import helper_mod; helper_mod.f()``, work on two nodes that do not have this folder."""

from __future__ import annotations

import os

import helper_mod
import helper_pkg
import pytest

from flow_sdk import FlowApp

pytestmark = pytest.mark.slow

app = FlowApp("local-modules")


@app.function(num_instances=2, quiet=True)
def uses_local_code(x: int) -> dict[str, object]:
    return {"mod": helper_mod.f(x), "pkg": helper_pkg.triple(x), "node": os.environ["FLOW_NODE_RANK"],
            "cwd_has_helper": os.path.exists("helper_mod.py")}


def test_a_module_beside_the_caller_and_a_local_package_work_on_two_nodes() -> None:
    results = uses_local_code.spawn(5).results(timeout=120)
    assert [r["mod"] for r in results] == ["helper_mod.f(5)"] * 2
    assert [r["pkg"] for r in results] == [15, 15]
    assert sorted(r["node"] for r in results) == ["0", "1"]
    assert not any(r["cwd_has_helper"] for r in results)  # shipped, not found on disk
