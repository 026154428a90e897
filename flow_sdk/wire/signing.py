"""HMAC-SHA256 authentication of what a task's client and nodes exchange (stdlib only).

The client makes one secret per task (:func:`new_secret`). It never enters the object store:
nodes get it in their launch configuration (``BootConfig.secret``: user-data on EC2, a 0600
file for local nodes) and the client keeps it in a 0600 file under the flow data directory
(``flow_sdk.tasksecrets``), so ``Task.from_id`` in another process of the same user can
check what it reads.

Every object that crosses the store carries a MAC over its key and its bytes, so an object
copied to another key fails too:

- JSON records (task record, outcome, node records, launch record, restart decisions,
  cancel) keep their fields readable and add a ``mac`` field over the canonical JSON of the
  others; :func:`open_record` checks it before the caller acts on any field.
- Binary objects (results, error payloads) are ``FLOWMAC1`` + 64 hex digits + the bytes;
  :func:`open_blob` checks the MAC before the caller unpickles anything.

A pool's secret seals what its nodes accept (``flow_sdk.wire.pools``): each task's own secret
reaches a pool node encrypted and authenticated under it (:func:`seal_secret`), so it crosses
the store without being readable there.

Payloads stay content-addressed (shared between tasks): the signed task record names the
payload's SHA-256, and a node compares it (:func:`same_digest`) before using the payload.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from flow_sdk.errors import SignatureError, TaskSecretError
import flow_sdk.wire.safejson as safejson

SECRET_BYTES = 32
MAC_FIELD = "mac"
MAX_RECORD_BYTES = 16 << 20  # no record of ours comes near it
_MAC_RE = re.compile(r"[0-9a-f]{64}")
_BLOB_MAGIC = b"FLOWMAC1"
_MAC_HEX = 64


def new_secret() -> str:
    """A fresh task secret, as 64 hex digits."""
    return secrets.token_hex(SECRET_BYTES)


def secret_from_hex(text: str) -> bytes:
    """The secret's bytes; raises ``TaskSecretError`` unless ``text`` is 64 hex digits."""
    if len(text) != 2 * SECRET_BYTES or any(c not in "0123456789abcdef" for c in text):
        raise TaskSecretError(f"the task secret must be {2 * SECRET_BYTES} lowercase hex digits "
                              f"(got {len(text)} characters); launch tasks through FlowApp")
    return bytes.fromhex(text)


def mac(secret: bytes, label: str, data: bytes) -> str:
    """HMAC-SHA256 of ``label`` (an object key or a handshake role) and ``data``, as hex."""
    return hmac.new(secret, label.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def seal_record(secret: bytes, key: str, fields: dict[str, Any]) -> bytes:
    """``fields`` as JSON with a ``mac`` field that binds them to ``key``."""
    return _canonical({**fields, MAC_FIELD: mac(secret, key, _canonical(fields))})


def open_record(secret: bytes, key: str, raw: bytes) -> bytes:
    """``raw`` unchanged once its ``mac`` checks out; raises ``SignatureError`` otherwise.
    The records' ``from_json`` readers ignore the ``mac`` field."""
    try:
        data = safejson.loads(raw, max_bytes=MAX_RECORD_BYTES)
    except safejson.BadJson as exc:
        raise SignatureError(key, f"not a record: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get(MAC_FIELD), str):
        raise SignatureError(key, "the record carries no MAC")
    claimed = data.pop(MAC_FIELD)
    if not _MAC_RE.fullmatch(claimed):  # checked before compare_digest, which wants ASCII
        raise SignatureError(key, "the record's MAC is not 64 hex digits")
    if not hmac.compare_digest(claimed.encode(), mac(secret, key, _canonical(data)).encode()):
        raise SignatureError(key, "the record's MAC does not match the task's secret")
    return raw


def seal_blob(secret: bytes, key: str, data: bytes) -> bytes:
    """``data`` behind a header carrying its MAC (bound to ``key``)."""
    return _BLOB_MAGIC + mac(secret, key, data).encode() + data


def open_blob(secret: bytes, key: str, blob: bytes) -> bytes:
    """The bytes inside a sealed blob once its MAC checks out; raises ``SignatureError``
    before anything else looks at them."""
    head = len(_BLOB_MAGIC) + _MAC_HEX
    if len(blob) < head or not blob.startswith(_BLOB_MAGIC):
        raise SignatureError(key, "the object carries no MAC header")
    claimed = blob[len(_BLOB_MAGIC):head]
    data = blob[head:]
    if not hmac.compare_digest(claimed, mac(secret, key, data).encode()):
        raise SignatureError(key, "the object's MAC does not match the task's secret")
    return data


def _derived(secret: bytes, purpose: bytes) -> bytes:
    return hmac.new(secret, b"flow-seal\0" + purpose, hashlib.sha256).digest()


def _keystream(key: bytes, nonce: bytes, length: int) -> bytes:
    """HMAC-SHA256 in counter mode: a pseudo-random pad as long as ``length``."""
    blocks = (length + 31) // 32
    return b"".join(hmac.new(key, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest()
                    for i in range(blocks))[:length]


def seal_secret(secret: bytes, label: str, plain: bytes) -> str:
    """``plain`` encrypted (HMAC-SHA256 counter-mode pad, a fresh nonce) and authenticated
    (HMAC over ``label``, nonce and ciphertext) under ``secret``, as hex: what carries a
    task's secret to a pool node through the store."""
    nonce = secrets.token_bytes(16)
    pad = _keystream(_derived(secret, b"encrypt"), nonce, len(plain))
    body = nonce + bytes(a ^ b for a, b in zip(plain, pad))
    return body.hex() + mac(_derived(secret, b"mac"), label, body)


def open_secret(secret: bytes, label: str, sealed: str) -> bytes:
    """The bytes :func:`seal_secret` sealed under ``secret`` for ``label``; raises
    ``SignatureError`` when they were sealed with another secret, for another label, or
    altered."""
    try:
        body, claimed = bytes.fromhex(sealed[:-_MAC_HEX]), sealed[-_MAC_HEX:]
    except ValueError:
        raise SignatureError(label, "the sealed secret is not hex") from None
    if len(body) < 16 or not hmac.compare_digest(claimed, mac(_derived(secret, b"mac"), label,
                                                              body)):
        raise SignatureError(label, "the sealed secret was not sealed with the pool's secret")
    nonce, cipher = body[:16], body[16:]
    pad = _keystream(_derived(secret, b"encrypt"), nonce, len(cipher))
    return bytes(a ^ b for a, b in zip(cipher, pad))


def same_digest(key: str, data: bytes, expected: str) -> bytes:
    """``data`` when its SHA-256 is ``expected`` (a digest from a signed record)."""
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), expected):
        raise SignatureError(key, "its SHA-256 does not match the digest the signed task "
                                  "record names")
    return data


class _Store(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, data: bytes) -> None: ...
    def put_if_absent(self, key: str, data: bytes) -> bool: ...
    def list(self, prefix: str) -> list[str]: ...


class SignedStore:
    """An object store seen through a task's secret: writes are sealed, reads are checked.
    ``secret`` may be a function that returns it, called when first needed."""

    def __init__(self, store: _Store, secret: bytes | Callable[[], bytes]) -> None:
        self.raw = store
        self._source = secret
        self._known: bytes | None = None

    @property
    def _secret(self) -> bytes:
        if self._known is None:
            self._known = self._source if isinstance(self._source, bytes) else self._source()
        return self._known

    def put_record(self, key: str, record: Any) -> None:
        """Store a dataclass record (or a dict) under ``key``, sealed."""
        self.raw.put(key, seal_record(self._secret, key, _fields(record)))

    def put_record_if_absent(self, key: str, record: Any) -> bool:
        return self.raw.put_if_absent(key, seal_record(self._secret, key, _fields(record)))

    def get_record(self, key: str) -> bytes | None:
        """The record's JSON once checked; None when absent; ``SignatureError`` when forged."""
        raw = self.raw.get(key)
        return None if raw is None else self.check_record(key, raw)

    def check_record(self, key: str, raw: bytes) -> bytes:
        """``raw`` (read from ``key``) once its MAC checks out."""
        return open_record(self._secret, key, raw)

    def put_blob(self, key: str, data: bytes) -> None:
        self.raw.put(key, seal_blob(self._secret, key, data))

    def get_blob(self, key: str) -> bytes | None:
        raw = self.raw.get(key)
        return None if raw is None else open_blob(self._secret, key, raw)

    def list(self, prefix: str) -> list[str]:
        return self.raw.list(prefix)


def _fields(record: Any) -> dict[str, Any]:
    return dict(record) if isinstance(record, dict) else asdict(record)
