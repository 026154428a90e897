from __future__ import annotations

import pytest

from flow_sdk import PayloadError, payload


def test_round_trip_of_a_closure_and_lambda() -> None:
    base = 40
    blob = payload.pack_call(lambda x, y=0: x + y + base, (1,), {"y": 1})
    fn, args, kwargs = payload.loads(blob)
    assert fn(*args, **kwargs) == 42


def test_tampered_payload_is_refused_before_unpickling() -> None:
    blob = bytearray(payload.dumps({"a": 1}))
    blob[-2] ^= 0xFF
    with pytest.raises(PayloadError, match="digest mismatch"):
        payload.loads(bytes(blob))


def test_truncated_and_foreign_blobs_are_refused() -> None:
    blob = payload.dumps([1, 2, 3])
    with pytest.raises(PayloadError):
        payload.loads(blob[:-1])
    with pytest.raises(PayloadError, match="bad header"):
        payload.loads(b"\x80\x05not ours")


def test_unpicklable_value_names_the_fix() -> None:
    import threading
    with pytest.raises(PayloadError, match="picklable"):
        payload.dumps(threading.Lock())


def test_digest_is_content_addressed() -> None:
    assert payload.digest(b"abc") == payload.digest(b"abc") != payload.digest(b"abd")
