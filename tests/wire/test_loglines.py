"""Where a log line ends: ``\\r\\n``, ``\\r`` and ``\\n`` each end one, the same whether a
stream arrives whole or in any chunks, and no line holds a line end."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flow_sdk.wire.loglines import LineSplitter, split_lines

# tqdm's output: a carriage return before each redraw, a newline when the bar closes
TQDM = b"before\n\r  0%|          | 0/3\r 33%|###3      | 1/3\r 67%|######6   | 2/3" \
       b"\r100%|##########| 3/3\r100%|##########| 3/3\nafter\n"
TQDM_LINES = [b"before", b"  0%|          | 0/3", b" 33%|###3      | 1/3",
              b" 67%|######6   | 2/3", b"100%|##########| 3/3", b"100%|##########| 3/3",
              b"after"]

streams = st.text(alphabet="ab \r\n\t", max_size=60).map(str.encode) | st.binary(max_size=200)


def _split_all(data: bytes, cuts: list[int], max_line_bytes: int = 1 << 20) -> list[bytes]:
    splitter = LineSplitter(max_line_bytes)
    lines: list[bytes] = []
    start = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        lines += splitter.feed(data[start:cut])
        start = cut
    return lines + splitter.finish()


def test_each_progress_bar_update_is_a_line_of_its_own() -> None:
    assert _split_all(TQDM, []) == TQDM_LINES
    # as a pipe delivers it: one write per update, each arriving on its own
    assert _split_all(TQDM, [i for i, byte in enumerate(TQDM) if byte == ord("\r")]) == \
        TQDM_LINES


def test_line_ends_and_empty_lines() -> None:
    assert split_lines("a\r\nb\rc\nd") == ["a", "b", "c", "d"]
    assert split_lines("a\n\nb\n") == ["a", "", "b"]  # a blank line printed stays
    assert split_lines("\r 10%\r 20%\n") == [" 10%", " 20%"]  # a leading \r makes no line
    assert split_lines("") == [""] and split_lines("one") == ["one"]
    assert _split_all(b"a\r", [2]) == [b"a"]  # a line ended by \r comes out at once
    assert _split_all(b"a\r\nb\n", [2]) == [b"a", b"b"]  # \r\n cut between two reads


@settings(max_examples=300, deadline=None)
@given(streams, st.lists(st.integers(0, 300), max_size=8))
def test_any_chunking_gives_the_lines_of_the_whole(data: bytes, cuts: list[int]) -> None:
    lines = _split_all(data, cuts)
    assert lines == _split_all(data, [])
    assert not any(b"\r" in line or b"\n" in line for line in lines)
    text = data.decode("latin-1")
    if text:
        assert [line.decode("latin-1") for line in lines] == split_lines(text)


@settings(max_examples=100, deadline=None)
@given(streams, st.lists(st.integers(0, 300), max_size=8))
def test_a_line_without_an_end_is_cut_at_the_limit(data: bytes, cuts: list[int]) -> None:
    lines = _split_all(data, cuts, max_line_bytes=7)
    assert all(len(line) <= 7 for line in lines)
    assert b"".join(lines) == b"".join(_split_all(data, []))  # nothing lost
