"""Every parser that reads bytes from outside the process is total: seeded random and
structured hostile inputs are refused with a typed error (or accepted as well-formed), and
nothing else ever escapes: no RecursionError, TypeError, ValueError, UnicodeError or
KeyError."""

from __future__ import annotations

import base64
import json
import struct
import time
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow_sdk.errors import RecordError, SignatureError
from flow_sdk.node import headjob
from flow_sdk.node.rendezvous import kvwire
from flow_sdk.node.rendezvous.store import parse_report
from flow_sdk.wire import BootConfig, NodeRecord, Outcome, TaskRecord, safejson, signing
from flow_sdk.providers.files import MAX_EPOCH_S, parse_log_lines
from flow_sdk.wire.keys import rank_stream, rank_stream_place
from flow_sdk.wire.pools import sequence_key, sequence_number, sequence_prefix
from flow_sdk.wire.stacks import (
    StackDump,
    StacksRequest,
    StallRecord,
    request_numbers,
    stack_dump_key,
    stacks_request_key,
)

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
@given(st.one_of(
    st.text(max_size=200),
    hostile.map(lambda data: data.decode("latin-1")),
    st.binary(max_size=100).map(bytes.hex),  # well-formed hex of any length: no valid tag
    st.text(alphabet="0123456789abcdefABCDEF\u0660\uff10 \n=+/", max_size=160),
    st.binary(max_size=90).map(lambda data: base64.b64encode(data).decode()),
))
def test_sealed_secrets_refuse_with_signature_errors(sealed: str) -> None:
    with pytest.raises(SignatureError) as refused:
        signing.open_secret(SECRET, "tasks/p/assign/i-1/00000000.json", sealed)
    assert refused.value.key == "tasks/p/assign/i-1/00000000.json"


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


# -- the names and records the client reads back from a store ---------------------------------

POOL = "pool-1"
# ASCII digits, digits of other scripts (which str.isdigit accepts and int() may not), signs,
# separators and path parts.
digitish = st.text(alphabet="0123456789\u00b2\u0663\uff10 -+_x/.", max_size=24)


@settings(max_examples=CASES, deadline=None)
@given(st.one_of(st.text(max_size=40), digitish.map(lambda tail: sequence_prefix(POOL) + tail)),
       st.integers(0, 10**17))
def test_sequence_keys_parse_totally_and_only_as_the_client_writes_them(key: str,
                                                                       claimed: int) -> None:
    number = sequence_number(POOL, key)
    assert number is None or sequence_key(POOL, number) == key
    assert sequence_number(POOL, sequence_key(POOL, claimed)) == claimed  # a client's claim


@settings(max_examples=CASES, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=30),
                          digitish.map(lambda t: f"tasks/t/stacks/{t}/request.json")),
                max_size=8))
def test_stacks_request_numbers_parse_totally(keys: list[str]) -> None:
    numbers = request_numbers(keys)
    assert numbers == sorted(numbers)
    named = [key.rstrip("/").split("/")[-2:] for key in keys]
    assert all([str(n), "request.json"] in named for n in numbers)
    assert request_numbers([stacks_request_key("t", n) for n in (3, 0, 12)]) == [0, 3, 12]


@settings(max_examples=CASES, deadline=None)
@given(st.one_of(st.text(max_size=30), st.tuples(digitish, digitish).map(
    lambda parts: f"node-{parts[0]}.rank-{parts[1]}")))
def test_log_stream_names_parse_totally(stream: str) -> None:
    place = rank_stream_place(stream)
    assert place is None or rank_stream(*place) == stream


GOOD: dict[type[Any], dict[str, Any]] = {
    StallRecord: {"number": 1, "ranks": [1], "odd_ranks": [1], "idle_s": 30.0,
                  "timeout_s": 20.0, "stacks_request": 1, "action": "warn",
                  "message": "rank 1 made no progress", "at": 1.7e9, "extra": {}},
    StackDump: {"rank": 0, "node": 0, "text": 'Thread 0x1 (most recent call first):\n  File '
                '"x.py", line 3 in f', "taken_at": 1.7e9, "how": "faulthandler"},
    StacksRequest: {"number": 2, "node": None, "reason": "asked", "requested_at": 1.7e9},
}


def _reshaped(cls: type[Any]) -> st.SearchStrategy[bytes]:
    """A well-formed record of ``cls`` with one field replaced by any JSON value, or every
    field of it any JSON value: valid JSON of the wrong shape."""
    one = st.tuples(st.sampled_from(sorted(GOOD[cls])), json_values).map(
        lambda change: {**GOOD[cls], change[0]: change[1]})
    every = st.fixed_dictionaries({f.name: json_values for f in fields(cls)})
    return st.one_of(one, every).map(lambda record: json.dumps(record).encode())


@settings(max_examples=CASES, deadline=None)
@given(st.sampled_from(sorted(GOOD, key=lambda cls: cls.__name__)).flatmap(
    lambda cls: st.tuples(st.just(cls), _reshaped(cls))))
def test_stall_and_stack_records_of_the_wrong_shape_are_refused(case: tuple[Any, bytes]
                                                                  ) -> None:
    cls, data = case
    try:
        record = cls.from_json(data)
    except RecordError as exc:
        assert cls.__name__ in str(exc), "a refusal names the record"
        return
    # accepted: every use the status, the stacks and the task page make of it works
    if isinstance(record, StallRecord):
        assert sorted([record, record], key=lambda s: s.number)
        assert all(isinstance(r, int) for r in record.ranks + record.odd_ranks)
        time.localtime(record.at)
        assert record.summary() and stack_dump_key("t", record.stacks_request, 0)
    elif isinstance(record, StackDump):
        time.localtime(record.taken_at)
        record.main_frames()
        assert stack_dump_key("t", 1, record.rank)
    else:
        time.localtime(record.requested_at)
        assert record.node is None or record.node >= 0


@settings(max_examples=CASES, deadline=None)
@given(st.one_of(
    st.binary(max_size=512),
    st.lists(st.tuples(st.text(alphabet="0123456789.eE+-naifNI \t", max_size=12),
                       st.text(max_size=20)), max_size=6).map(
        lambda rows: "".join(f"{ts}\t{text}\n" for ts, text in rows).encode())))
def test_log_store_lines_parse_totally(data: bytes) -> None:
    records = parse_log_lines(data)
    assert len(records) == data.count(b"\n")  # one record per line: nothing lost
    for record in records:
        assert 0.0 <= record.ts < MAX_EPOCH_S
        time.localtime(record.ts)  # a clock can show it
