"""The task secret, the keys derived from it per purpose, and the HMAC envelopes of
everything that crosses the store."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from flow_sdk.home import tasksecrets
from flow_sdk._config import flow_home
from flow_sdk.node import headjob
from flow_sdk.node.rendezvous import kvwire
from flow_sdk.wire import signing
from flow_sdk.errors import SignatureError, TaskSecretError
from flow_sdk.providers.files import FileObjectStore

SECRET = signing.secret_from_hex(signing.new_secret())
OTHER = signing.secret_from_hex(signing.new_secret())


@dataclass(frozen=True)
class Rec:
    status: str
    at: float


def test_a_record_opens_only_with_its_secret_and_key() -> None:
    raw = signing.seal_record(SECRET, "tasks/t/outcome.json", {"status": "FAILED", "at": 1.5})
    assert signing.open_record(SECRET, "tasks/t/outcome.json", raw) == raw
    assert json.loads(raw)["status"] == "FAILED"  # fields stay readable without the secret
    with pytest.raises(SignatureError, match="tasks/t/outcome.json") as info:
        signing.open_record(OTHER, "tasks/t/outcome.json", raw)
    assert info.value.key == "tasks/t/outcome.json"
    with pytest.raises(SignatureError, match="tasks/u/outcome.json"):
        signing.open_record(SECRET, "tasks/u/outcome.json", raw)  # copied to another key


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"status": "SUCCEEDED"}',
                                 b'{"status": "SUCCEEDED", "mac": 7}',
                                 # a MAC compare_digest cannot take (not ASCII), deep nesting
                                 json.dumps({"status": "SUCCEEDED", "mac": "\u00e9" * 64},
                                            ensure_ascii=False).encode(),
                                 b'{"mac": ' + b"[" * 3000 + b"]" * 3000 + b"}",
                                 b"\xff\xfe not utf-8"])
def test_malformed_or_unsigned_records_are_refused(raw: bytes) -> None:
    with pytest.raises(SignatureError, match="k.json"):
        signing.open_record(SECRET, "k.json", raw)


def test_an_altered_field_is_refused() -> None:
    raw = signing.seal_record(SECRET, "k", {"status": "FAILED", "at": 1.5})
    data = json.loads(raw)
    data["status"] = "SUCCEEDED"
    with pytest.raises(SignatureError, match="does not match"):
        signing.open_record(SECRET, "k", json.dumps(data).encode())


def test_blobs_are_checked_before_anyone_reads_them() -> None:
    blob = signing.seal_blob(SECRET, "tasks/t/results/000000", b"\x80\x05payload")
    assert signing.open_blob(SECRET, "tasks/t/results/000000", blob) == b"\x80\x05payload"
    for bad in (blob[:-1] + b"X", b"FLOWMAC1" + b"0" * 64 + b"\x80\x05payload", b"\x80\x05",
                blob.replace(b"FLOWMAC1", b"FLOWMAC2")):
        with pytest.raises(SignatureError, match="results/000000"):
            signing.open_blob(SECRET, "tasks/t/results/000000", bad)
    with pytest.raises(SignatureError, match="results/000001"):
        signing.open_blob(SECRET, "tasks/t/results/000001", blob)


def _raw_keyed_mac(secret: bytes, label: str, data: bytes) -> str:
    """The old scheme's MAC: HMAC-SHA256 keyed with the secret itself."""
    return hmac.new(secret, label.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def test_a_mac_keyed_with_the_secret_itself_no_longer_verifies() -> None:
    fields = {"status": "SUCCEEDED", "at": 1.5}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    record = json.dumps({**fields, "mac": _raw_keyed_mac(SECRET, "k.json", canonical)}).encode()
    with pytest.raises(SignatureError, match="does not match"):
        signing.open_record(SECRET, "k.json", record)
    blob = b"FLOWMAC1" + _raw_keyed_mac(SECRET, "r/0", b"data").encode() + b"data"
    with pytest.raises(SignatureError, match="does not match"):
        signing.open_blob(SECRET, "r/0", blob)


def test_every_purpose_has_its_own_key_and_none_is_the_secret() -> None:
    keys = {purpose: signing.derive_key(SECRET, purpose) for purpose in signing.Purpose}
    assert len(set(keys.values()) | {SECRET}) == len(keys) + 1
    assert all(len(key) == 32 for key in keys.values())
    assert keys == {purpose: signing.derive_key(SECRET, purpose) for purpose in signing.Purpose}
    assert signing.derive_key(OTHER, signing.Purpose.RECORD_MAC) != keys[
        signing.Purpose.RECORD_MAC]


def test_what_one_purpose_makes_is_refused_by_another() -> None:
    """Under one key for everything, a store handshake proof or the head job's link key was
    also a valid blob MAC (same label and data); with a key per purpose neither opens."""
    nonces = f"{'a' * 32}:{'b' * 32}".encode()
    proof = kvwire.proof(SECRET, "kv-client", "a" * 32, "b" * 32)
    assert proof != _raw_keyed_mac(SECRET, "kv-client", nonces)
    with pytest.raises(SignatureError, match="does not match"):
        signing.open_blob(SECRET, "kv-client", b"FLOWMAC1" + proof.encode() + nonces)
    link = headjob.link_key(SECRET)
    assert link != signing.derive_key(SECRET, signing.Purpose.STORE_HANDSHAKE).hex()
    with pytest.raises(SignatureError, match="does not match"):
        signing.open_blob(SECRET, "head-job-link", b"FLOWMAC1" + link.encode())


def test_a_signed_store_derives_its_key_once_and_matches_the_functions(
        tmp_path: Path) -> None:
    calls: list[int] = []

    def secret() -> bytes:
        calls.append(1)
        return SECRET

    store = signing.SignedStore(FileObjectStore(tmp_path), secret)
    assert calls == []  # not read until needed
    store.put_record("a.json", {"status": "FAILED"})
    store.put_blob("b", b"data")
    assert store.get_record("a.json") == signing.seal_record(SECRET, "a.json",
                                                             {"status": "FAILED"})
    assert signing.open_blob(SECRET, "b", (tmp_path / "b").read_bytes()) == b"data"
    assert calls == [1]


def test_a_payload_must_have_the_digest_the_signed_record_names() -> None:
    digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"  # sha256("test")
    assert signing.same_digest("payloads/x", b"test", digest) == b"test"
    with pytest.raises(SignatureError, match="payloads/x"):
        signing.same_digest("payloads/x", b"tesT", digest)


def test_signed_store_round_trip_on_a_real_file_store(tmp_path: Path) -> None:
    store = signing.SignedStore(FileObjectStore(tmp_path), SECRET)
    store.put_record("tasks/t/outcome.json", Rec("FAILED", 2.0))
    assert not store.put_record_if_absent("tasks/t/outcome.json", Rec("SUCCEEDED", 3.0))
    assert json.loads(store.get_record("tasks/t/outcome.json") or b"")["status"] == "FAILED"
    assert store.get_record("tasks/t/none.json") is None
    store.put_blob("tasks/t/results/000000", b"data")
    assert store.get_blob("tasks/t/results/000000") == b"data"
    (tmp_path / "tasks/t/results/000000").write_bytes(b"forged")
    with pytest.raises(SignatureError):
        store.get_blob("tasks/t/results/000000")


def test_the_client_keeps_the_secret_in_a_private_file(flow_home: Path) -> None:
    secret = signing.new_secret()
    tasksecrets.save_task_secret("t-1", secret)
    path = flow_home / "secrets" / "t-1.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert tasksecrets.load_task_secret("t-1") == bytes.fromhex(secret)
    with pytest.raises(TaskSecretError, match="no secret for task 't-2'"):
        tasksecrets.load_task_secret("t-2")
    path.write_text("short")
    with pytest.raises(TaskSecretError, match="64 lowercase hex digits"):
        tasksecrets.load_task_secret("t-1")


def test_local_store_files_are_private(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "store")
    store.put("tasks/t/results/000000", b"x")
    assert store.put_if_absent("tasks/t/outcome.json", b"y")
    for path in (tmp_path / "store/tasks/t/results/000000",
                 tmp_path / "store/tasks/t/outcome.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (tmp_path / "store", tmp_path / "store/tasks", tmp_path / "store/tasks/t",
                   tmp_path / "store/tasks/t/results"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_flow_home_is_tightened_to_0700_and_refused_when_another_user_owns_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "loose"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    monkeypatch.setenv("FLOW_HOME", str(home))
    assert flow_home() == home and stat.S_IMODE(home.stat().st_mode) == 0o700
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 4242, 4242)  # root here: make it another user's
    monkeypatch.setenv("FLOW_HOME", str(theirs))
    with pytest.raises(PermissionError, match="belongs to user 4242"):
        flow_home()
