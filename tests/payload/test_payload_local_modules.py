"""Where the line falls: the caller's own modules travel by value, installed ones by
reference, and ``include`` adds more."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flow_sdk import payload
from flow_sdk.errors import PayloadError, ValidationError
from flow_sdk.spec import build_task_spec

_LOAD = "import sys; from flow_sdk import payload; c = payload.unpack_call(sys.stdin.buffer.read()); print(c.fn(*c.args, **c.kwargs))"


def _call_elsewhere(blob: bytes, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Unpickle and call in a fresh interpreter that cannot import the caller's folder."""
    return subprocess.run([sys.executable, "-c", _LOAD], input=blob, capture_output=True,
                          cwd=cwd, timeout=60, check=False)


def test_a_module_used_by_name_travels_by_value(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    code = tmp_path / "code"
    (code / "mypkg").mkdir(parents=True)
    (code / "mylib.py").write_text("import mypkg.inner\n\ndef helper(x):\n"
                                   "    return mypkg.inner.twice(x) + 1\n")
    (code / "mypkg" / "__init__.py").write_text("")
    (code / "mypkg" / "inner.py").write_text("def twice(x):\n    return 2 * x\n")
    (code / "caller.py").write_text(textwrap.dedent("""
        import json
        import mylib

        def run(x):
            return json.dumps(mylib.helper(x))
    """))
    monkeypatch.syspath_prepend(str(code))
    import caller  # type: ignore[import-not-found]

    blob = payload.pack_call(caller.run, (20,), {})
    assert payload._ship_by_value(sys.modules["mylib"]) is True
    for name in ("caller", "mylib", "mypkg", "mypkg.inner"):
        sys.modules.pop(name, None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _call_elsewhere(blob, elsewhere)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "41"
    import json

    import click

    # the line: the caller's files travel, the standard library and site-packages do not
    assert payload._ship_by_value(sys.modules["flow_sdk"]) is False
    assert payload._ship_by_value(json) is False and payload._ship_by_value(click) is False


def test_a_site_directory_that_a_pth_file_adds_holds_installed_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a venv whose .pth names a base image's site-packages (the nodes' own layout): what is
    # there is installed, so it stays a reference; the caller's folder beside it travels
    image_site = tmp_path / "image" / "lib" / "python3" / "site-packages"
    image_site.mkdir(parents=True)
    (image_site / "imagepkg.py").write_text("def f():\n    return 1\n")
    own = tmp_path / "own"
    own.mkdir()
    (own / "ownmod.py").write_text("def g():\n    return 2\n")
    monkeypatch.syspath_prepend(str(image_site))
    monkeypatch.syspath_prepend(str(own))
    import imagepkg  # type: ignore[import-not-found]
    import ownmod  # type: ignore[import-not-found]

    try:
        assert payload._ship_by_value(imagepkg) is False
        assert payload._ship_by_value(ownmod) is True
    finally:
        sys.modules.pop("imagepkg")
        sys.modules.pop("ownmod")


def test_include_names_importable_modules_only() -> None:
    with pytest.raises(PayloadError, match="no_such_module_here"):
        payload.pack_call(len, ((),), {}, include=["no_such_module_here"])
    with pytest.raises(ValidationError, match="include"):
        build_task_spec(app="a", name="n", include="mylib")
    with pytest.raises(ValidationError, match="not module names"):
        build_task_spec(app="a", name="n", include=["my-lib"])
    assert build_task_spec(app="a", name="n", include=["mylib.sub"]).include == ("mylib.sub",)
