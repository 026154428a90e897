from __future__ import annotations

import pytest

from flow_sdk import PayloadError, payload


def test_round_trip_of_a_closure_and_lambda() -> None:
    base = 40
    blob = payload.pack_call(lambda x, y=0: x + y + base, (1,), {"y": 1})
    call = payload.unpack_call(blob)
    assert call.fn(*call.args, **call.kwargs) == 42


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


def test_a_blob_that_is_not_a_call_is_refused_as_one() -> None:
    with pytest.raises(PayloadError, match="not a call"):
        payload.unpack_call(payload.dumps((len, ("ab",), {})))


def test_digest_is_content_addressed() -> None:
    assert payload.digest(b"abc") == payload.digest(b"abc") != payload.digest(b"abd")


def _callers_helper(x: int) -> int:
    return x * 2


def test_callers_functions_passed_as_arguments_travel_by_value(tmp_path) -> None:
    import subprocess
    import sys

    def apply(f: object, x: int) -> object:
        return f(x)  # type: ignore[operator]

    blob_path = tmp_path / "call.bin"
    blob_path.write_bytes(payload.pack_call(apply, (_callers_helper, 21), {}))
    # A fresh interpreter in another directory: this test module cannot be imported there,
    # so only a by-value payload can run.
    code = ("import sys; from flow_sdk import payload; "
            "c = payload.unpack_call(open(sys.argv[1], 'rb').read()); print(c.fn(*c.args, **c.kwargs))")
    out = subprocess.run([sys.executable, "-c", code, str(blob_path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "42"
