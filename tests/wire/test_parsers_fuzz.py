"""Every parser that reads bytes from outside the process is total: seeded random and
structured hostile inputs are refused with a typed error (or accepted as well-formed), and
nothing else ever escapes: no RecursionError, TypeError, UnicodeError or KeyError."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow_sdk.errors import RecordError, SignatureError
from flow_sdk.node import headjob
from flow_sdk.rendezvous import kvwire
from flow_sdk.rendezvous.store import parse_report
from flow_sdk.wire import BootConfig, NodeRecord, Outcome, TaskRecord, safejson, signing
from flow_sdk.wire.stacks import StackDump, StallRecord

SECRET = bytes(range(32))
CASES = 300  # per parser

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20)
hostile = st.one_of(
    st.binary(max_size=2048),
    st.integers(1, 5000).map(lambda n: b"[" * n),
    st.integers(1, 5000).map(lambda n: b'{"a":' * n),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.text(max_size=200).map(lambda t: json.dumps({"mac": t, "status": "FAILED"},
                                                   ensure_ascii=False).encode()),
)


@settings(max_examples=CASES, deadline=None)
@given(hostile)
def test_bounded_json_refuses_or_parses(data: bytes) -> None:
    try:
        safejson.loads(data, max_bytes=1 << 16)
    except safejson.BadJson as exc:
        assert str(exc), "a refusal says why"


@settings(max_examples=CASES, deadline=None)
@given(hostile)
def test_store_records_and_blobs_refuse_with_signature_errors(data: bytes) -> None:
    for open_ in (signing.open_record, signing.open_blob):  # nothing unsigned ever opens
        with pytest.raises(SignatureError) as refused:
            open_(SECRET, "tasks/t/outcome.json", data)
        assert refused.value.key == "tasks/t/outcome.json"


@settings(max_examples=CASES, deadline=None)
@given(hostile)
def test_record_readers_refuse_with_record_errors(data: bytes) -> None:
    for reader in (Outcome.from_json, NodeRecord.from_json, TaskRecord.from_json,
                   StackDump.from_json, StallRecord.from_json):
        try:
            reader(data)
        except RecordError as exc:
            assert reader.__self__.__name__ in str(exc), "a refusal names the record"


@settings(max_examples=CASES, deadline=None)
@given(hostile)
def test_boot_files_and_failure_reports_refuse_cleanly(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        BootConfig.decode(text)
    except RecordError as exc:
        assert "FLOW_BOOT" in str(exc), "a refusal names the boot configuration"
    report = parse_report(text, 4)
    assert report is None or 0 <= report.node < 4


@settings(max_examples=CASES, deadline=None)
@given(json_values)
def test_store_requests_are_judged_without_raising(request: object) -> None:
    problem = kvwire.problem(request)
    assert problem is None or isinstance(problem, str)


@settings(max_examples=CASES, deadline=None)
@given(st.binary(max_size=256), st.integers(0, 2**64 - 1))
def test_head_job_frames_refuse_bad_tags_and_sizes(body: bytes, size: int) -> None:
    import socket

    left, right = socket.socketpair()
    with left, right:
        link = headjob._Link(right, SECRET, bytes(16), head=True)
        left.sendall(struct.pack("!Q", size) + bytes(32) + body[:64])
        left.shutdown(socket.SHUT_WR)
        try:
            link.receive()
        except headjob.HeadJobError:
            return
        raise AssertionError("an unauthenticated frame was accepted")
