"""Where code runs, visible at import: ``import flow_sdk`` and the client's public names load
no node-side module (read from ``python -X importtime``); the node-side public names
(``current``, the checkpoint helpers) load theirs only when used."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _node_side() -> list[str]:
    """The node-side modules, as the import contracts name them (client-not-node)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in project["tool"]["importlinter"]["contracts"]
                  if c["id"] == "client-not-node"]
    return list(contract["forbidden_modules"])


def _timed_imports(code: str) -> list[str]:
    """The modules ``python -X importtime -c code`` reports (import statements; what
    ``importlib.import_module`` loads is not timed there)."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=120)
    return [line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2
            and "imported package" not in line]


def _loaded(code: str) -> list[str]:
    """The modules that running ``code`` after ``import flow_sdk`` loads."""
    run = subprocess.run([sys.executable, "-c", "import sys, flow_sdk\n"
                          "before = set(sys.modules)\n" + code + "\n"
                          "print(' '.join(sorted(set(sys.modules) - before)))"],
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    return run.stdout.split()


def _on_node_side(modules: list[str]) -> list[str]:
    sides = _node_side()
    return [m for m in modules if any(m == s or m.startswith(s + ".") for s in sides)]


def test_import_flow_sdk_loads_no_node_module() -> None:
    modules = _timed_imports("import flow_sdk")
    assert "flow_sdk" in modules  # the scan reads something
    assert _on_node_side(modules) == []


def test_the_client_names_load_no_node_module() -> None:
    modules = _loaded("from flow_sdk import FlowApp, Task, TaskSpec, TaskStatus, FlowError, "
                      "Volume, list_pools")
    assert {"flow_sdk.client.app", "flow_sdk.client.task"} <= set(modules)
    assert _on_node_side(modules) == []


def test_node_side_names_load_their_modules_only_when_used() -> None:
    modules = _loaded("flow_sdk.current, flow_sdk.save_checkpoint")
    assert {"flow_sdk.node.current", "flow_sdk.volumes.checkpoint"} <= set(modules)
