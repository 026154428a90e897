"""The file log store keeps one record per line: a record's line ends become lines of their
own when written, and a stream an older writer left with a carriage return (or any other
character ``str.splitlines`` would cut at) or a line without a time reads back whole."""

from __future__ import annotations

from pathlib import Path

from flow_sdk.providers.base import LogRecord
from flow_sdk.providers.files import FileLogStore


def test_a_records_line_ends_become_lines_of_their_own(tmp_path: Path) -> None:
    logs = FileLogStore(tmp_path)
    writer = logs.writer("t", "agent.i-1")
    writer.write([LogRecord(5.0, "\r  0%|\r 50%|\r100%|"), LogRecord(6.0, "a\r\nb\nc\n"),
                  LogRecord(7.0, "")])
    writer.close()
    records, _ = logs.read("t", "agent.i-1")
    assert [(r.ts, r.text) for r in records] == [
        (5.0, "  0%|"), (5.0, " 50%|"), (5.0, "100%|"), (6.0, "a"), (6.0, "b"), (6.0, "c"),
        (7.0, "")]


def test_a_stream_an_older_writer_left_reads_whole(tmp_path: Path) -> None:
    logs = FileLogStore(tmp_path)
    odd = "one\rtwo\x0bthree\x0cfour\x1cfive\x1dsix\x1eseven\x85eight\u2028nine\u2029ten"
    lines = [f"1700000000.250000\t{odd}", "no time here", "nan\tnot a number",
             "1e300\tfar away", "1700000001.000000\t\x1b[2K\x1b[1G[Node 1] fake", "\t", ""]
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "node-0.rank-0.log").write_bytes(("\n".join(lines) + "\n").encode())
    records, cursor = logs.read("t", "node-0.rank-0")
    assert cursor == (folder / "node-0.rank-0.log").stat().st_size
    assert [(r.ts, r.text) for r in records] == [
        (1700000000.25, odd),
        (1700000000.25, "no time here"),  # kept whole, at the time of the line before
        (1700000000.25, "nan\tnot a number"),
        (1700000000.25, "1e300\tfar away"),
        (1700000001.0, "\x1b[2K\x1b[1G[Node 1] fake"),  # stored as written; shown escaped
        (1700000001.0, "\t"),
        (1700000001.0, "")]
