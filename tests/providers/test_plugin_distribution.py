"""A provider from a distribution of its own (``tests/plugin_provider``: nodes that are processes
over a shared directory, with a node-side module) installed into a virtualenv of its own, not
the one the test runners share: there it passes the SDK's shipped contract suite and runs a
2-node task whose nodes import it from the wheel the launch shipped."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from flow_sdk.providers import sdkwheel

PLUGIN = Path(__file__).resolve().parents[1] / "plugin_provider"
CONTRACT_TESTS = 10  # the shipped suite's eight and the plug-in's own two


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_plugin_distribution_in_its_own_venv_passes_the_shipped_suite(
        tmp_path: Path) -> None:
    assert importlib.util.find_spec("flow_procs") is None  # not in the runners' environment
    source = tmp_path / "flow-procs-provider"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info",
                                                                   "build"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    # The SDK's dependencies (and pip, pytest, setuptools) come from the runners' site
    # directories; the SDK (its wheel, as the nodes get it) and the plug-in are installed into
    # this venv alone, and are found there first.
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "parent-sites.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in parents) + "\n")
    sdk = sdkwheel.build(cache_dir=tmp_path / "wheels")
    wheel = tmp_path / sdk.filename
    wheel.write_bytes(sdk.data)
    for what in (wheel, source):
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                        "--no-build-isolation", str(what)], check=True, cwd=tmp_path)
    assert (purelib / "flow_procs" / "node.py").is_file()
    assert (purelib / "flow_sdk" / "testing" / "suite.py").is_file()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["FLOW_HOME"] = str(tmp_path / "home")  # the caller's, for this run
    run = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(source),
         "--confcutdir", str(source), "--basetemp", str(tmp_path / "runs"),
         str(source / "tests")], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=840)
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, report
    assert re.search(rf"\b{CONTRACT_TESTS} passed in\b", run.stdout), report
