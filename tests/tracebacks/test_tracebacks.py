"""Remote tracebacks name the caller's file, line and source, whatever cloudpickle does to the
file names of code it ships by value."""

from __future__ import annotations

import sys
import textwrap
import traceback
from pathlib import Path

import cloudpickle
import pytest

from flow_sdk import payload, tracebacks


def _without_carets(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True)
                   if line.strip() == "" or line.strip(" ^~\n") != "")


def _inner(n: int) -> None:
    raise KeyError(f"missing {n}")


def _outer() -> None:
    try:
        _inner(3)
    except KeyError as exc:
        raise ValueError("wrapped") from exc


def test_render_of_a_captured_chain_is_what_python_prints() -> None:
    try:
        _outer()
    except ValueError as exc:
        exc.add_note("raised on node 1")
        expected = "".join(traceback.format_exception(exc))
        captured = tracebacks.capture(exc, {})
    assert tracebacks.render(captured) == _without_carets(expected)
    assert "The above exception was the direct cause" in expected


def _cloudpickle_version() -> tuple[int, ...]:
    return tuple(int(part) for part in cloudpickle.__version__.split(".")[:3])


def test_a_by_value_function_keeps_its_file_line_and_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = textwrap.dedent("""
        def shard(n):
            if n > 2:
                raise RuntimeError(f"bad shard {n}")
            return n
    """)
    (tmp_path / "userlib.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import userlib  # type: ignore[import-not-found]

    blob = payload.pack_call(userlib.shard, (17,), {})
    sys.modules.pop("userlib")
    call = payload.unpack_call(blob)
    if _cloudpickle_version() >= (3, 1, 3):  # the release that renamed shipped code's files
        assert call.fn.__code__.co_filename == "<dynamic-code>"
    with pytest.raises(RuntimeError) as info:
        call.fn(*call.args, **call.kwargs)
    text = tracebacks.render(tracebacks.capture(info.value, call.origins))
    raise_line = source.splitlines().index('        raise RuntimeError(f"bad shard {n}")') + 1
    assert (f'File "{tmp_path / "userlib.py"}", line {raise_line}, in shard\n'
            f'    raise RuntimeError(f"bad shard {{n}}")\n') in text
    assert text.endswith("RuntimeError: bad shard 17\n")


def test_a_node_without_the_file_ships_its_own_line_and_the_caller_reads_its_own() -> None:
    captured = tracebacks.Captured(
        type="builtins.OSError", message="disk", notes=[], cause=None, context=None,
        suppress_context=False,
        frames=[["/nowhere/on/this/machine.py", 3, "run", "open(path)"],
                [__file__, 1, "head", ""]])
    text = tracebacks.render(captured)
    assert '  File "/nowhere/on/this/machine.py", line 3, in run\n    open(path)\n' in text
    first_line = Path(__file__).read_text().splitlines()[0]
    assert f'line 1, in head\n    {first_line}\n' in text
