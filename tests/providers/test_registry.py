"""The provider registry: built-ins registered as entry points, plug-ins from installed
distributions found by name and imported only when used; a duplicate registration counts once;
a plug-in under a built-in's name, a broken plug-in, or a name two distributions claim with
different classes is reported and never hides or breaks another provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from flow_sdk.providers import GROUP, _BUILTIN

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
from flow_sdk.providers.local import LocalProvider


class FakeCloud(LocalProvider):
    """A plug-in: the local provider under another name."""


class NotAProvider:
    pass
'''
FAILING = "raise RuntimeError('this plug-in cannot start here')\n"

# Run in a child with the fake distributions on its path: what it lists, what it loads, what it
# imported by then, and the warnings it reported.
CHILD = '''
import json, sys, warnings
from flow_sdk.errors import ProviderError
from flow_sdk.providers import available_providers, plugin_source, provider_class
from flow_sdk.providers.local import LocalProvider

out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out["listed"] = available_providers()
    out["imported_by_listing"] = "fake_cloud" in sys.modules
    out["local_is_builtin"] = provider_class("local") is LocalProvider
    out["fakecloud"] = provider_class("fakecloud").__name__
    out["sources"] = {name: plugin_source(name) for name in ("local", "aws", "fakecloud")}
    for name in ("broken", "notaprovider", "twin", "failing"):
        try:
            provider_class(name)
        except ProviderError as exc:
            out[name] = str(exc)
out["warnings"] = sorted({str(w.message) for w in caught})
print(json.dumps(out))
'''


def _distribution(site: Path, folder: str, name: str, entries: str) -> None:
    info = site / folder
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{entries}")


def test_every_built_in_is_registered_as_an_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"][GROUP] == _BUILTIN


def test_plug_ins_are_found_lazily_and_a_broken_or_hijacking_one_is_reported(tmp_path: Path
                                                                             ) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake_cloud.py").write_text(PLUGIN)
    (site / "failing_cloud.py").write_text(FAILING)
    fake = ("fakecloud = fake_cloud:FakeCloud\nbroken = no_such_module:Provider\n"
            "notaprovider = fake_cloud:NotAProvider\ntwin = fake_cloud:FakeCloud\n"
            "local = fake_cloud:FakeCloud\nfailing = failing_cloud:Provider\n")
    _distribution(site, "fake_cloud-1.0.dist-info", "fake-cloud", fake)
    # The same class registered again (an editable install left under its older name), and
    # another distribution claiming 'twin' with a different class.
    _distribution(site, "fake_cloud_dev.egg-info", "fake-cloud-dev",
                  "fakecloud = fake_cloud:FakeCloud\n")
    _distribution(site, "other_cloud-1.0.dist-info", "other-cloud",
                  "twin = fake_cloud:NotAProvider\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    out = json.loads(run.stdout.splitlines()[-1])

    assert {"local", "aws", "aws-sim", "fakecloud", "broken", "notaprovider", "twin"} <= \
        set(out["listed"])
    assert out["listed"].count("fakecloud") == 1
    assert out["imported_by_listing"] is False  # listing imports no plug-in
    assert out["local_is_builtin"] is True  # the plug-in's 'local' hides nothing
    assert out["fakecloud"] == "FakeCloud"
    # what the nodes of each must be shipped beside the SDK's wheel: nothing for a built-in
    assert out["sources"]["local"] is None and out["sources"]["aws"] is None
    dist, packages = out["sources"]["fakecloud"]
    assert dist in ("fake-cloud", "fake-cloud-dev") and "fake_cloud" in packages
    assert "no_such_module" in out["broken"] and "fake-cloud" in out["broken"]
    assert "not a flow_sdk Provider class" in out["notaprovider"]
    assert "cannot start here" in out["failing"] and "fake-cloud" in out["failing"]
    assert "fake-cloud" in out["twin"] and "other-cloud" in out["twin"]
    assert any("'local'" in w and "built-in" in w and "fake-cloud" in w
               for w in out["warnings"]), out["warnings"]
