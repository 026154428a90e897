"""The SDK wheel the client ships to the nodes: reproducible, pinned, verified, installable."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flow_sdk.providers import sdkwheel
from flow_sdk.errors import PayloadError
from flow_sdk.providers.sdkwheel import CodeIntegrityError


def _tree(root: Path) -> Path:
    pkg = root / "flow_sdk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 41\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("def answer():\n    return 42\n")
    (pkg / "data.json").write_text("{}\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "junk.cpython-311.pyc").write_bytes(b"\0")
    return pkg


def test_build_is_reproducible_and_cached(tmp_path: Path) -> None:
    pkg = _tree(tmp_path / "src")
    first = sdkwheel.build(cache_dir=tmp_path / "cache", root=pkg)
    again = sdkwheel.build(cache_dir=tmp_path / "cache2", root=pkg)
    assert first.sha256 == again.sha256 == hashlib.sha256(first.data).hexdigest()
    cached = sdkwheel.build(cache_dir=tmp_path / "cache", root=pkg)
    assert cached.data == first.data
    assert len(list((tmp_path / "cache").glob("*.whl"))) == 1
    (pkg / "sub" / "mod.py").write_text("def answer():\n    return 43\n")
    changed = sdkwheel.build(cache_dir=tmp_path / "cache", root=pkg)
    assert changed.sha256 != first.sha256
    assert first.python == f"{sys.version_info.major}.{sys.version_info.minor}"


def test_wheel_holds_the_package_files_and_pinned_metadata(tmp_path: Path) -> None:
    pkg = _tree(tmp_path / "src")
    files = sdkwheel.package_files(pkg)
    assert [name for name, _ in files] == ["flow_sdk/__init__.py", "flow_sdk/data.json",
                                            "flow_sdk/sub/__init__.py", "flow_sdk/sub/mod.py"]
    name, data = sdkwheel.pack(files, "1.2.3", ["pydantic==2.13.4"])
    assert name == "flow_gang_sdk-1.2.3-py3-none-any.whl"
    (tmp_path / name).write_bytes(data)
    with zipfile.ZipFile(tmp_path / name) as archive:
        names = archive.namelist()
        metadata = archive.read("flow_gang_sdk-1.2.3.dist-info/METADATA").decode()
        record = archive.read("flow_gang_sdk-1.2.3.dist-info/RECORD").decode()
    assert "flow_sdk/sub/mod.py" in names
    assert not any("__pycache__" in n for n in names)
    assert "Requires-Dist: pydantic==2.13.4" in metadata
    assert f"Requires-Python: =={sdkwheel.python_version()}.*" in metadata
    assert "flow_sdk/sub/mod.py,sha256=" in record


def test_pinned_requirements_follow_the_installed_versions() -> None:
    import pydantic

    requires = ['pydantic<3,>=2.5', 'torch<3,>=2.1; extra == "torch"',
                'boto3>=1.34; extra == "aws"', 'flow-gang-sdk[aws]; extra == "dev"']
    pins = sdkwheel.pinned_requirements(requires, extras=("aws",))
    import boto3

    assert pins == (f"boto3=={boto3.__version__}", f"pydantic=={pydantic.VERSION}")


def test_missing_dependency_cannot_be_pinned() -> None:
    with pytest.raises(sdkwheel.PayloadError, match="not-a-real-dist-xyz"):
        sdkwheel.pinned_requirements(["not-a-real-dist-xyz>=1"])


def test_verify_refuses_altered_bytes(tmp_path: Path) -> None:
    wheel = sdkwheel.build(cache_dir=tmp_path, root=_tree(tmp_path / "src"))
    sdkwheel.verify(wheel.data, wheel.sha256)
    with pytest.raises(CodeIntegrityError, match=wheel.sha256):
        sdkwheel.verify(wheel.data + b"x", wheel.sha256, key="code/abc")


@pytest.mark.slow
def test_wheel_installs_offline_and_runs_the_shipped_code(tmp_path: Path) -> None:
    pkg = _tree(tmp_path / "src")
    wheel = sdkwheel.build(cache_dir=tmp_path / "cache", root=pkg)
    path = tmp_path / wheel.filename
    path.write_bytes(wheel.data)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-deps", "--target", str(target), str(path)], check=True)
    out = subprocess.run([sys.executable, "-c",
                          "import flow_sdk, flow_sdk.sub.mod as m; "
                          "print(flow_sdk.__file__, flow_sdk.VALUE, m.answer())"],
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    file, value, answer = out.stdout.split()
    assert Path(file).is_relative_to(target) and (value, answer) == ("41", "42")


def test_a_node_of_another_python_minor_refuses_the_task() -> None:
    mine = sdkwheel.python_version()
    sdkwheel.require_python(mine)
    sdkwheel.require_python("")  # a record from a client that did not say
    with pytest.raises(sdkwheel.PythonMismatchError) as caught:
        sdkwheel.require_python("3.99")
    assert f"launched from Python 3.99, but this node runs Python {mine}" in str(caught.value)


def _plugin_dist(root: Path) -> None:
    """An installed plug-in distribution: its package and its dist-info on ``root``."""
    (root / "fakeplug" / "nodeside").mkdir(parents=True)
    (root / "fakeplug" / "__init__.py").write_text("")
    (root / "fakeplug" / "nodeside" / "__init__.py").write_text("WHERE = 'node'\n")
    info = root / "fake_plug-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plug\nVersion: 2.0\n"
                                   "Requires-Dist: flow-gang-sdk\nRequires-Dist: pydantic\n")
    (info / "entry_points.txt").write_text("[flow_sdk.providers]\n"
                                           "fake = fakeplug:FakeProvider\n")


def test_a_plugin_distribution_is_packed_with_its_entry_points_and_pins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin_dist(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    first = sdkwheel.build_distribution("fake-plug", ["fakeplug"], cache_dir=tmp_path / "a")
    again = sdkwheel.build_distribution("fake-plug", ["fakeplug"], cache_dir=tmp_path / "b")
    assert first.filename == "fake_plug-2.0-py3-none-any.whl" and first.data == again.data
    with zipfile.ZipFile(io.BytesIO(first.data)) as archive:
        names = set(archive.namelist())
        assert {"fakeplug/__init__.py", "fakeplug/nodeside/__init__.py"} <= names
        assert archive.read("fake_plug-2.0.dist-info/entry_points.txt").decode().endswith(
            "fake = fakeplug:FakeProvider\n")
        metadata = archive.read("fake_plug-2.0.dist-info/METADATA").decode()
    import pydantic

    assert f"Requires-Dist: pydantic=={pydantic.VERSION}" in metadata
    assert "flow-gang-sdk" not in metadata  # the SDK's own wheel ships beside it
    with pytest.raises(PayloadError, match="not installed here"):
        sdkwheel.build_distribution("no-such-plugin-xyz", ["x"], cache_dir=tmp_path)
    with pytest.raises(PayloadError, match="'missingpkg'"):
        sdkwheel.build_distribution("fake-plug", ["missingpkg"], cache_dir=tmp_path)
