"""The import-linter contracts in pyproject.toml catch a wrong arrow, and their exceptions are true.

The test command runs ``lint-imports`` on the real tree; these tests prove the contracts have
teeth (a copy of the package with one upward import fails them) and that every import a
client-side contract ignores is made inside a function, never at module level.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
WRONG_IMPORT = "flow_sdk.providers.base -> flow_sdk.node.agent"
Lint = subprocess.CompletedProcess[str]


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def _copy_tree(dest: Path) -> Path:
    """A copy of the package and its pyproject under ``dest``."""
    dest.mkdir()
    shutil.copytree(REPO / "flow_sdk", dest / "flow_sdk",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, dest / "pyproject.toml")
    return dest


def _lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the copy at ``root`` (first on PYTHONPATH, its own config)."""
    command = shutil.which("lint-imports")
    assert command is not None, "lint-imports is missing: run `bash scripts/setup.sh --dev`"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    args = [command, "--config", str(root / "pyproject.toml"), "--no-cache", "--no-logo"]
    for contract in contracts:
        args += ["--contract", contract]
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.fixture(scope="module")
def clean_lint(tmp_path_factory: pytest.TempPathFactory) -> Lint:
    """Every contract on an unchanged copy, once per runner: each scratch test below checks
    that its contract was kept there before its one import breaks it."""
    return _lint(_copy_tree(tmp_path_factory.mktemp("layers") / "clean"))


def test_an_upward_import_from_a_provider_breaks_the_contracts(tmp_path: Path,
                                                              clean_lint: Lint) -> None:
    names = {key: c["name"] for key, c in _contracts().items()}
    broken = _copy_tree(tmp_path / "broken")
    base = broken / "flow_sdk" / "providers" / "base.py"
    base.write_text(base.read_text(encoding="utf-8") + "\nimport flow_sdk.node.agent\n",
                    encoding="utf-8")

    before = clean_lint
    after = _lint(broken, "layers", "providers-below-callers")

    assert WRONG_IMPORT not in before.stdout, before.stdout
    assert after.returncode != 0, after.stdout + after.stderr
    assert f"{names['providers-below-callers']} BROKEN" in after.stdout, after.stdout
    assert f"{names['layers']} BROKEN" in after.stdout, after.stdout
    assert "flow_sdk.providers is not allowed to import flow_sdk.node" in after.stdout
    assert WRONG_IMPORT in after.stdout, after.stdout


def test_an_upward_import_inside_the_agent_breaks_its_parts_contract(tmp_path: Path,
                                                                    clean_lint: Lint) -> None:
    name = _contracts()["agent-parts"]["name"]
    broken = _copy_tree(tmp_path / "broken")
    records = broken / "flow_sdk" / "node" / "agent" / "records.py"
    records.write_text(records.read_text(encoding="utf-8") + "\nimport flow_sdk.node.agent.watch\n",
                       encoding="utf-8")

    before = clean_lint
    after = _lint(broken, "agent-parts")

    assert before.returncode == 0, before.stdout + before.stderr
    assert after.returncode != 0, after.stdout + after.stderr
    assert f"{name} BROKEN" in after.stdout, after.stdout
    assert "flow_sdk.node.agent.records -> flow_sdk.node.agent.watch" in after.stdout, after.stdout


def test_an_import_of_the_simulated_cloud_from_the_aws_provider_breaks_the_contract(
        tmp_path: Path, clean_lint: Lint) -> None:
    """The aws provider never imports the simulated cloud: a scratch ``import flow_sdk.sim``
    in it makes ``lint-imports`` fail."""
    name = _contracts()["sim-outside-aws"]["name"]
    broken = _copy_tree(tmp_path / "broken")
    runtime = broken / "flow_sdk" / "providers" / "aws" / "_runtime.py"
    runtime.write_text(runtime.read_text(encoding="utf-8") + "\nimport flow_sdk.sim\n",
                       encoding="utf-8")

    before = clean_lint
    after = _lint(broken, "sim-outside-aws")

    assert before.returncode == 0 and f"{name} KEPT" in before.stdout, before.stdout
    assert after.returncode != 0, after.stdout + after.stderr
    assert f"{name} BROKEN" in after.stdout, after.stdout
    assert "flow_sdk.providers is not allowed to import flow_sdk.sim" in after.stdout
    assert "flow_sdk.providers.aws._runtime -> flow_sdk.sim" in after.stdout, after.stdout


@pytest.mark.parametrize(("module", "line", "contract", "chain"), [
    ("client/app.py", "import flow_sdk.node.headjob", "client-not-node",
     "flow_sdk.client.app -> flow_sdk.node.headjob"),
    ("client/task.py", "import flow_sdk.node.rendezvous.store", "client-not-node",
     "flow_sdk.client.task -> flow_sdk.node.rendezvous.store"),
    # indirect: a module both sides use, importing node code
    ("payload.py", "import flow_sdk.node.current", "client-not-node",
     "flow_sdk.payload -> flow_sdk.node.current"),
    ("node/agent/worker.py", "import flow_sdk.client.task", "node-not-client",
     "flow_sdk.node.agent.worker -> flow_sdk.client.task"),
    ("node/volumes/prepare.py", "import flow_sdk.client.records", "node-not-client",
     "flow_sdk.node.volumes.prepare -> flow_sdk.client.records"),
])
def test_an_import_across_the_wire_breaks_the_client_node_contracts(
        tmp_path: Path, clean_lint: Lint, module: str, line: str, contract: str,
        chain: str) -> None:
    """Client code never imports node code and node code never imports client code: a
    scratch import either way, direct or through a shared module, makes ``lint-imports``
    fail."""
    name = _contracts()[contract]["name"]
    broken = _copy_tree(tmp_path / "broken")
    path = broken / "flow_sdk" / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")

    before = clean_lint
    after = _lint(broken, contract)

    assert before.returncode == 0 and f"{name} KEPT" in before.stdout, before.stdout
    assert after.returncode != 0, after.stdout + after.stderr
    assert f"{name} BROKEN" in after.stdout, after.stdout
    assert chain in after.stdout, after.stdout


def _module_level_imports(path: Path) -> set[str]:
    """Modules imported by statements that run when ``path`` is imported (anything outside
    a function body; class bodies and ``if``/``try`` blocks at module level count)."""
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        pending.extend(ast.iter_child_nodes(node))
    return found


CLIENT_CONTRACTS = ("client-light", "client-light-root")


@pytest.mark.parametrize("contract", CLIENT_CONTRACTS)
def test_client_contracts_ignore_only_imports_made_inside_functions(contract: str) -> None:
    spec = _contracts()[contract]
    assert spec["type"] == "forbidden"
    assert set(spec["forbidden_modules"]) == {"torch", "xgboost", "pyarrow"}
    for rule in spec.get("ignore_imports", []):
        importer, _, imported = (part.strip() for part in rule.partition("->"))
        assert imported in spec["forbidden_modules"], rule
        path = REPO / Path(*importer.split(".")).with_suffix(".py")
        assert path.is_file(), f"{rule}: {path} is not a module"
        at_module_level = {name for name in _module_level_imports(path)
                           if name == imported or name.startswith(imported + ".")}
        assert not at_module_level, f"{rule}: {importer} imports {at_module_level} at module level"


def test_the_module_level_scan_sees_imports_outside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import json\nif True:\n    from torch import nn\n"
                      "class C:\n    import xgboost\n"
                      "def f():\n    import pyarrow\n", encoding="utf-8")
    assert _module_level_imports(module) == {"json", "torch", "xgboost"}


@pytest.mark.parametrize(("module", "chain", "direct"), [
    ("node/headjob.py", "flow_sdk.node.headjob -> flow_sdk.providers.local", True),
    # indirect: the agent imports the providers package, which would import the local
    # provider; the older interface-only contract allows that chain, this one does not
    ("providers/__init__.py", "flow_sdk.providers -> flow_sdk.providers.local", False),
])
def test_node_code_that_reaches_the_local_provider_breaks_the_contract(
        tmp_path: Path, clean_lint: Lint, module: str, chain: str, direct: bool) -> None:
    name = _contracts()["node-code-not-local"]["name"]
    broken = _copy_tree(tmp_path / "broken")
    path = broken / "flow_sdk" / module
    path.write_text(path.read_text(encoding="utf-8") + "import flow_sdk.providers.local\n",
                    encoding="utf-8")

    before = clean_lint
    after = _lint(broken, "node-code-not-local", "interface-only")

    assert before.returncode == 0, before.stdout + before.stderr
    assert f"{name} KEPT" in before.stdout, before.stdout
    assert after.returncode != 0, after.stdout + after.stderr
    assert f"{name} BROKEN" in after.stdout, after.stdout
    assert chain in after.stdout, after.stdout
    if not direct:
        old = re.escape(_contracts()["interface-only"]["name"])
        assert re.search(old + r"\s*KEPT", after.stdout), after.stdout


@pytest.mark.parametrize(("module", "line", "chain"), [
    ("wire/boot.py", "import flow_sdk.spec", "flow_sdk.wire.boot -> flow_sdk.spec"),
    ("wire/records.py", "import pydantic", "flow_sdk.wire.records -> pydantic"),
    # indirect: the one flow_sdk module the wire may import, importing another
    ("errors.py", "import flow_sdk.system.procs", "flow_sdk.errors -> flow_sdk.system.procs"),
])
def test_a_wire_import_beyond_the_stdlib_and_errors_breaks_its_contract(
        tmp_path: Path, clean_lint: Lint, module: str, line: str, chain: str) -> None:
    name = _contracts()["wire-stdlib-only"]["name"]
    broken = _copy_tree(tmp_path / "broken")
    path = broken / "flow_sdk" / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")

    before = clean_lint
    after = _lint(broken, "wire-stdlib-only")

    assert before.returncode == 0 and f"{name} KEPT" in before.stdout, before.stdout
    assert after.returncode != 0, after.stdout + after.stderr
    assert f"{name} BROKEN" in after.stdout, after.stdout
    assert chain in after.stdout, after.stdout


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the statement is (relative imports as
    ``.``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." if node.level else str(node.module))
    return found


def test_the_wire_imports_only_the_standard_library_cryptography_and_errors() -> None:
    """What the contract cannot list (every third-party package there is): each import of the
    wire layer is the standard library's, ``cryptography``'s (signing's key derivation and
    sealing), ``flow_sdk.errors`` or the wire's own."""
    allowed = set(sys.stdlib_module_names) | {"__future__", "cryptography"}
    modules = sorted((REPO / "flow_sdk" / "wire").glob("*.py"))
    assert {p.stem for p in modules} >= {"__init__", "keys", "records", "boot", "signing"}
    for path in modules:
        for name in _imports(path):
            ok = (name.split(".")[0] in allowed or name == "flow_sdk.errors"
                  or name.startswith("flow_sdk.wire."))
            assert ok, f"{path.name} imports {name}"


def test_the_import_scan_sees_every_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import json\ndef f():\n    from pydantic import BaseModel\n"
                      "from . import x\n", encoding="utf-8")
    assert _imports(module) == {"json", "pydantic", "."}


def test_nothing_in_the_aws_provider_mentions_the_simulated_cloud() -> None:
    """The simulated cloud plugs in through the node-runtime seam; the AWS provider's code,
    comments included, knows only EC2 and AWS-compatible endpoints."""
    pattern = re.compile(r"simulat|\bsim\b|flow_sdk\.sim|moto", re.IGNORECASE)
    mentions = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
                for path in sorted((REPO / "flow_sdk" / "providers" / "aws").rglob("*"))
                if path.is_file() and "__pycache__" not in path.parts
                for number, line in enumerate(
                    path.read_text(encoding="utf-8").splitlines(), start=1)
                if pattern.search(line)]
    assert mentions == []


def _loaded_after(statement: str) -> list[str]:
    """The modules of flow_sdk, pydantic, rich and boto3 a fresh interpreter holds after
    ``statement``."""
    probe = (f"{statement}; import sys; print('\\n'.join(sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('flow_sdk', 'pydantic', 'rich', 'boto3'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True, cwd=REPO)
    return done.stdout.split()


def test_import_flow_sdk_loads_its_public_names_only_when_asked() -> None:
    """Every node process imports the package: its public names come on first use, so a
    worker pays for none of the client's modules (pydantic and rich among them)."""
    assert _loaded_after("import flow_sdk") == ["flow_sdk", "flow_sdk._lazy", "flow_sdk._version"]
    worker = _loaded_after("import flow_sdk.node.agent.worker")
    assert not [m for m in worker if m.startswith(("flow_sdk.client", "pydantic", "rich",
                                                   "boto3"))], worker
    for helper in ("flow_sdk.sim._root", "flow_sdk.sim._serve"):  # the simulated instance's
        # root helper and the account's server, before moto: no provider, no pydantic
        loaded = _loaded_after(f"import {helper}")
        assert not [m for m in loaded if m.startswith(("flow_sdk.providers", "flow_sdk.spec",
                                                       "pydantic", "boto3"))], loaded
    asked = _loaded_after("from flow_sdk import FlowApp, current, save_checkpoint")
    assert {"flow_sdk.client.app", "flow_sdk.node.current", "flow_sdk.volumes.checkpoint"} \
        <= set(asked)


@pytest.mark.parametrize("package", ["flow_sdk", "flow_sdk.volumes", "flow_sdk.sim",
                                     "flow_sdk.providers.aws"])
def test_a_lazy_packages_type_imports_run_time_map_and_all_name_the_same_things(
        package: str) -> None:
    """The names a type checker sees (the ``TYPE_CHECKING`` imports), the ones ``__getattr__``
    imports (``_WHERE``) and ``__all__`` are written out apart; they must agree, module and
    name."""
    module = importlib.import_module(package)
    source = Path(module.__file__ or "").read_text()
    typed: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom) and imported.module
                for alias in imported.names:
                    name = alias.asname or alias.name
                    value = getattr(module, name)
                    typed[name] = (value.__name__ if isinstance(value, types.ModuleType)
                                   else imported.module)  # a module, such as ``current``
    assert typed == module._WHERE
    assert sorted(module.__all__) == sorted(typed)
