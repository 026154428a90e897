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
    assert len(sealed) == 2 * (12 + len(TASK) + 16)  # a 96-bit nonce, the ciphertext, the tag
    assert TASK.hex() not in sealed  # encrypted, not only signed
    assert signing.seal_secret(POOL, KEY, TASK) != sealed  # a fresh nonce each time
    other = signing.secret_from_hex(signing.new_secret())
    with pytest.raises(SignatureError, match="not sealed with the pool's secret"):
        signing.open_secret(other, KEY, sealed)
    for moved in (KEY.replace("i-1", "i-2"), KEY.replace("00000003", "00000004")):
        with pytest.raises(SignatureError, match="not sealed") as refused:
            signing.open_secret(POOL, moved, sealed)  # to another node, another place
        assert refused.value.key == moved


def _flipped(sealed: str, at: int) -> str:
    return sealed[:at] + ("0" if sealed[at] != "0" else "1") + sealed[at + 1:]


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag"])
def test_one_changed_digit_anywhere_is_refused(where: str) -> None:
    sealed = signing.seal_secret(POOL, KEY, TASK)
    at = {"nonce": 5, "ciphertext": 2 * 12 + 9, "tag": len(sealed) - 3}[where]
    with pytest.raises(SignatureError, match="or was altered"):
        signing.open_secret(POOL, KEY, _flipped(sealed, at))


def test_a_sealed_secret_cut_short_or_lengthened_is_refused() -> None:
    sealed = signing.seal_secret(POOL, KEY, TASK)
    for changed in (sealed[:-2], sealed[2:], sealed + "00", "00" + sealed,
                    sealed[:2 * 12] + sealed[-2 * 16:]):  # nonce and tag, no ciphertext
        with pytest.raises(SignatureError, match=KEY):
            signing.open_secret(POOL, KEY, changed)


@pytest.mark.parametrize("junk", [
    "", "zz" * 80, "0" * 55, "0" * 121, "é" * 120,  # empty, not hex, short, odd, not ASCII
    "٠" * 120,  # Arabic-Indic digits: str.isdigit() says yes, hex says no
    "AB" * 60,  # upper-case hex is not what seal_secret writes
    "q83v3q83v3q83v3q83v3q83v3q83v3q83v3q83v3q83v3q83v3q83v3q83v3q83v3==",  # base64
    "00" * 60 + "\n", " " + "00" * 60])
def test_junk_is_refused_with_the_typed_error(junk: str) -> None:
    with pytest.raises(SignatureError, match="not hex|not sealed") as refused:
        signing.open_secret(POOL, KEY, junk)
    assert refused.value.key == KEY


def test_an_assignment_record_is_strict_and_a_pool_tasks_id_names_its_pool() -> None:
    raw = signing.seal_record(POOL, KEY, {"number": 3, "task_id": "dev-1.t-2", "role": "run",
                                          "sealed_secret": "00", "created_at": 1.0})
    assert Assignment.from_json(signing.open_record(POOL, KEY, raw)).role == "run"
    bad = signing.seal_record(POOL, KEY, {"number": 3, "task_id": "dev-1.t-2", "role": "boss",
                                          "sealed_secret": "00", "created_at": 1.0})
    with pytest.raises(Exception, match="not one of"):
        Assignment.from_json(bad)
    assert (pool_of_task("dev-1.t-2"), pool_of_task("t-2")) == ("dev-1", "")
