"""Remote tracebacks and workers' stacks name the caller's file, line and source, whatever
cloudpickle does to the file names of code it ships by value, read the same, and leave the
SDK's frames out."""

from __future__ import annotations

import faulthandler
import sys
import tempfile
import textwrap
import threading
import traceback
from pathlib import Path

import cloudpickle
import pytest

from flow_sdk import payload
from flow_sdk.wire import tracebacks
from flow_sdk.wire.stacks import StackDump, threads


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


def _raises_inside(n: int) -> None:
    raise LookupError(f"no shard {n}")


def test_the_sdks_frames_are_left_out_and_counted() -> None:
    # The SDK's own code between two user frames: NodeEntry calls this module's function.
    entry = payload.NodeEntry(__name__, "_raises_inside")
    try:
        entry(4)
    except LookupError as exc:
        captured = tracebacks.capture(exc, {})
    files = [frame[0] for frame in captured["frames"]]
    assert any(file.endswith("flow_sdk/payload.py") for file in files)  # kept as data
    text = tracebacks.render(captured)
    assert "flow_sdk/" not in text and "  (1 flow-sdk frame left out)\n" in text
    assert 'in _raises_inside\n    raise LookupError(f"no shard {n}")\n' in text


def test_the_runner_that_leads_is_the_sdks_and_a_traceback_of_the_sdk_alone_is_kept() -> None:
    sdk = str(Path(tracebacks.__file__).with_name("payload.py"))
    found = tracebacks.frames([(sdk, 140, "__call__", None), ("<frozen runpy>", 88, "_run_code",
                                                             None),
                               (__file__, 1, "<module>", None), ("<frozen runpy>", 5, "x", None)],
                              {})
    assert [frame[4] for frame in found] == [True, True, False, False]
    assert tracebacks.frames_text(found).startswith("  (2 flow-sdk frames left out)\n")
    only_sdk = tracebacks.frames([(sdk, 140, "__call__", None)], {})
    assert tracebacks.frames_text(only_sdk).startswith(f'  File "{sdk}", line 140')


def test_a_stack_frame_of_shipped_code_takes_the_code_that_starts_last_before_its_line() -> None:
    origins = {("train", 10): "/home/me/a.py", ("train", 40): "/home/me/b.py",
               ("step", 5): "/home/me/a.py"}
    assert tracebacks.caller_file(origins, "<dynamic-code>", "train", 45) == "/home/me/b.py"
    assert tracebacks.caller_file(origins, "<dynamic-code>", "train", 12) == "/home/me/a.py"
    assert tracebacks.caller_file(origins, "<dynamic-code>", "train", 3) == "<dynamic-code>"
    assert tracebacks.caller_file(origins, "/real/file.py", "train", 45) == "/real/file.py"
    assert tracebacks.caller_file(origins, "<dynamic-code>", "train", 45, 10) == "/home/me/a.py"
    assert tracebacks.origins_from_json(tracebacks.origins_json(origins)) == origins
    assert tracebacks.origins_from_json('[["train", true, "x"]]') is None
    assert tracebacks.origins_from_json("{") is None


def test_a_stack_and_a_traceback_of_shipped_code_read_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = textwrap.dedent("""
        def wait_or_raise(ready, go, fail):
            ready.set()
            go.wait(30)
            if fail:
                raise RuntimeError("stopped")
    """)
    (tmp_path / "waitlib.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import waitlib  # type: ignore[import-not-found]

    call = payload.unpack_call(payload.pack_call(waitlib.wait_or_raise, (), {}))
    sys.modules.pop("waitlib")
    ready, go = threading.Event(), threading.Event()
    thread = threading.Thread(target=call.fn, args=(ready, go, False))
    thread.start()
    ready.wait(30)
    with tempfile.TemporaryFile("w+") as dump:
        faulthandler.dump_traceback(dump, all_threads=True)
        dump.seek(0)
        text = dump.read()
    go.set()
    thread.join(30)
    assert "<dynamic-code>" in text  # what the worker's faulthandler writes
    stack = StackDump(0, 0, text, 1.0, "faulthandler", [
        tracebacks.frames([(file, line, function, None) for file, line, function in
                           reversed(thread_frames)], call.origins)
        for thread_frames in threads(text)])
    shown = tracebacks.stack_text(stack)
    wait_line = source.splitlines().index("    go.wait(30)") + 1
    expected = f'  File "{tmp_path / "waitlib.py"}", line {wait_line}, in wait_or_raise\n' \
               "    go.wait(30)\n"
    assert expected in shown and "<dynamic-code>" not in shown
    # A traceback through the same function names its frames the same way.
    go.set()
    with pytest.raises(RuntimeError) as info:
        call.fn(threading.Event(), go, True)
    raised = tracebacks.render(tracebacks.capture(info.value, call.origins))
    assert f'  File "{tmp_path / "waitlib.py"}", line {wait_line + 2}, in wait_or_raise\n' \
           '    raise RuntimeError("stopped")\n' in raised
