"""CloudWatch Logs keeps one event per line: a record's ``\\r\\n``, ``\\r`` and ``\\n`` split
it into events (a progress bar's updates read back as lines), against moto over HTTP."""

from __future__ import annotations

import time

from aws_moto_world import AwsWorld

from flow_sdk.providers.base import LogRecord


def test_a_records_line_ends_become_events_of_their_own(aws: AwsWorld) -> None:
    logs = aws.provider().logs
    writer = logs.writer("task-lines", "node-0.rank-0")
    now = time.time()
    writer.write([LogRecord(now, "\r  0%|\r 50%|\r100%|"), LogRecord(now, "a\r\nb\n\nc"),
                  LogRecord(now, "")])
    writer.close()
    records, cursor = logs.read("task-lines", "node-0.rank-0")
    assert [r.text for r in records] == ["  0%|", " 50%|", "100%|", "a", "b", "", "c", ""]
    assert cursor == len(records)  # the cursor counts events: one per line
