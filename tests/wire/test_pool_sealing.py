"""A task's secret reaches a pool node sealed under the pool's secret: encrypted (the store
never holds it readable) and authenticated (bound to its key; another secret, another key or
one changed byte is refused)."""

from __future__ import annotations

import pytest

from flow_sdk.errors import SignatureError
from flow_sdk.wire import signing
from flow_sdk.wire.pools import Assignment, pool_of_task

POOL = signing.secret_from_hex(signing.new_secret())
TASK = bytes.fromhex(signing.new_secret())
KEY = "tasks/dev-1/assign/i-1/00000003.json"


def test_a_sealed_secret_opens_only_with_the_pools_secret_and_its_key() -> None:
    sealed = signing.seal_secret(POOL, KEY, TASK)
    assert signing.open_secret(POOL, KEY, sealed) == TASK
    assert TASK.hex() not in sealed  # encrypted, not only signed
    assert signing.seal_secret(POOL, KEY, TASK) != sealed  # a fresh nonce each time
    other = signing.secret_from_hex(signing.new_secret())
    with pytest.raises(SignatureError, match="not sealed with the pool's secret"):
        signing.open_secret(other, KEY, sealed)
    with pytest.raises(SignatureError):
        signing.open_secret(POOL, KEY.replace("i-1", "i-2"), sealed)  # moved to another node
    flipped = sealed[:40] + ("0" if sealed[40] != "0" else "1") + sealed[41:]
    with pytest.raises(SignatureError):
        signing.open_secret(POOL, KEY, flipped)
    with pytest.raises(SignatureError, match="not hex"):
        signing.open_secret(POOL, KEY, "zz" * 80)


def test_an_assignment_record_is_strict_and_a_pool_tasks_id_names_its_pool() -> None:
    raw = signing.seal_record(POOL, KEY, {"number": 3, "task_id": "dev-1.t-2", "role": "run",
                                          "sealed_secret": "00", "created_at": 1.0})
    assert Assignment.from_json(signing.open_record(POOL, KEY, raw)).role == "run"
    bad = signing.seal_record(POOL, KEY, {"number": 3, "task_id": "dev-1.t-2", "role": "boss",
                                          "sealed_secret": "00", "created_at": 1.0})
    with pytest.raises(Exception, match="not one of"):
        Assignment.from_json(bad)
    assert (pool_of_task("dev-1.t-2"), pool_of_task("t-2")) == ("dev-1", "")
