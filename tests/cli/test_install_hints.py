"""Every install line an error prints works from a fresh virtualenv: it names packages as the
package index knows them (this SDK's own distribution is not on any index), through one
helper, ``flow_sdk.errors.install_hint``."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import flow_sdk
from flow_sdk.providers import sdkwheel
from flow_sdk.client import ssh
from flow_sdk.errors import SshError, install_hint

PACKAGE = Path(flow_sdk.__file__).parent


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(
        PACKAGE.rglob("*.py"))]


def _hint_calls() -> list[tuple[str, list[str]]]:
    """(module, the packages named) for every ``install_hint(...)`` call in the SDK."""
    calls = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "install_hint"):
                names = [a.value for a in node.args[1:] if isinstance(a, ast.Constant)]
                dynamic = [a for a in node.args[1:] if not isinstance(a, ast.Constant)]
                module = str(path.relative_to(PACKAGE))
                # computed names: a requirement from the SDK's own metadata, or a provider's
                # entry in its _PACKAGES table (checked below)
                assert not dynamic or module in ("providers/sdkwheel.py", "providers/__init__.py"), \
                    (module, ast.dump(node))
                calls.append((module, names))
    return calls


def test_every_install_line_is_rendered_by_the_one_helper() -> None:
    written = [(str(path.relative_to(PACKAGE)), node.lineno) for path, tree in _sources()
               for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and "pip install" in node.value and path.name != "errors.py"]
    assert written == []
    modules = {module for module, _ in _hint_calls()}
    assert modules == {"client/ssh.py", "cli/infra.py", "data/_torch.py", "data/_s3.py",
                       "data/_xgboost.py", "node/volumes/s3mount.py", "providers/__init__.py",
                       "providers/sdkwheel.py", "sim/_server.py", "client/dashboard/deps.py",
                       "testing/__main__.py"}


def test_every_package_a_hint_names_is_a_real_distribution() -> None:
    named = {name for _, names in _hint_calls() for name in names}
    assert named == {"paramiko", "boto3", "torch", "xgboost", "moto[server]", "awscli",
                     "starlette", "uvicorn", "sse-starlette", "jinja2", "pytest"}
    for name in named:  # installed in the dev environment from the index, by this name
        assert importlib.metadata.version(name.split("[")[0]), name
    providers = __import__("flow_sdk.providers", fromlist=["_PACKAGES"])
    for packages in providers._PACKAGES.values():
        for name in packages:
            assert importlib.metadata.version(name), name
    assert "flow-gang-sdk" not in install_hint("x", "boto3")
    assert install_hint("SSH", "paramiko") == "SSH needs paramiko: pip install paramiko"
    assert install_hint("it", "a", "b") == "it needs a, b: pip install a b"
    assert install_hint("it", "moto[server]") == "it needs moto[server]: pip install 'moto[server]'"


def test_a_missing_paramiko_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "paramiko", None)
    with pytest.raises(SshError, match="^SSH needs paramiko: pip install paramiko$"):
        ssh._require_paramiko()


def test_a_requirement_missing_here_names_its_install_line() -> None:
    with pytest.raises(sdkwheel.PayloadError,
                       match="needs no-such-dist-xyz: pip install no-such-dist-xyz"):
        sdkwheel.pinned_requirements(['no-such-dist-xyz>=1; extra == "aws"'], ("aws",))


@pytest.mark.parametrize(("code", "expected"), [
    ("from flow_sdk.cli import main; main(['catalog', 'refresh'])",
     "flow: catalog refresh needs boto3: pip install boto3"),
    ("from flow_sdk.cli import main; main(['plan', '--provider', 'aws'])",
     "needs boto3: pip install boto3"),
])
def test_the_cli_without_boto3_prints_a_working_install_line(code: str, expected: str) -> None:
    ran = subprocess.run([sys.executable, "-c", "import sys; sys.modules['boto3'] = None; "
                          + code], capture_output=True, text=True, timeout=60, check=False)
    [line] = ran.stderr.splitlines()
    assert expected in line and "flow-gang-sdk" not in line, ran.stderr
    assert ran.returncode in (1, 2)
