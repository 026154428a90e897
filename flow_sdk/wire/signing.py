"""Authentication of what a task's client and nodes exchange, with keys derived per purpose.

The client makes one secret per task (:func:`new_secret`). It never enters the object store or
a node's user-data: on AWS a node reads it from an SSM SecureString parameter only that task's
node role may read (``flow_sdk.providers.aws._tasksecret``), a local node reads it from a 0600
boot file, and the client keeps it in a 0600 file under the flow data directory
(``flow_sdk.home.tasksecrets``), so ``Task.from_id`` in another process of the same user can check
what it reads. A pool's secret travels and is kept the same way.

The secret itself keys nothing. Each use gets its own key, derived from it with HKDF-SHA256
under a label of its own (:class:`Purpose`, :func:`derive_key`): the MACs of what crosses the
store, the rendezvous store's connection handshake, the head job's link, and the sealing of
secrets. A value made for one purpose is therefore never valid for another.

Every object that crosses the store carries an HMAC-SHA256 over its key and its bytes, so an
object copied to another key fails too:

- JSON records (task record, outcome, node records, launch record, restart decisions,
  cancel) keep their fields readable and add a ``mac`` field over the canonical JSON of the
  others; :func:`open_record` checks it before the caller acts on any field.
- Binary objects (results, error payloads) are ``FLOWMAC1`` + 64 hex digits + the bytes;
  :func:`open_blob` checks the MAC before the caller unpickles anything.

A pool's secret seals what its nodes accept (``flow_sdk.wire.pools``): each task's own secret
reaches a pool node encrypted and authenticated with AES-256-GCM under the pool's sealing key,
with a fresh random nonce and the store key it is written under as associated data
(:func:`seal_secret`), so it crosses the store unreadable and opens nowhere else.

Payloads stay content-addressed (shared between tasks): the signed task record names the
payload's SHA-256, and a node compares it (:func:`same_digest`) before using the payload.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flow_sdk.errors import SignatureError, TaskSecretError
import flow_sdk.wire.safejson as safejson

SECRET_BYTES = 32
MAC_FIELD = "mac"
MAX_RECORD_BYTES = 16 << 20  # no record of ours comes near it
_MAC_RE = re.compile(r"[0-9a-f]{64}")
_BLOB_MAGIC = b"FLOWMAC1"
_MAC_HEX = 64
_KEY_BYTES = 32  # HKDF output: an HMAC-SHA256 key, or an AES-256 key
_NONCE_BYTES = 12  # AES-GCM's 96-bit nonce, random per seal
_TAG_BYTES = 16
_SEALED_RE = re.compile(r"(?:[0-9a-f]{2})+")
_SEALED_AAD = b"flow-sdk/1 sealed secret\0"


class Purpose(enum.Enum):
    """What a key derived from a secret is for; each is its own HKDF ``info`` label."""

    RECORD_MAC = "record-mac"  # MACs of the records and blobs in the object store
    STORE_HANDSHAKE = "store-handshake"  # the rendezvous store's challenge-response
    HEAD_JOB_LINK = "head-job-link"  # the head job's link (given to a task's workers)
    SEALING = "secret-sealing"  # AES-256-GCM sealing of a task's secret under a pool's


def new_secret() -> str:
    """A fresh task secret, as 64 hex digits."""
    return secrets.token_hex(SECRET_BYTES)


def secret_from_hex(text: str) -> bytes:
    """The secret's bytes; raises ``TaskSecretError`` unless ``text`` is 64 hex digits."""
    if len(text) != 2 * SECRET_BYTES or any(c not in "0123456789abcdef" for c in text):
        raise TaskSecretError(f"the task secret must be {2 * SECRET_BYTES} lowercase hex digits "
                              f"(got {len(text)} characters); launch tasks through FlowApp")
    return bytes.fromhex(text)


def derive_key(secret: bytes, purpose: Purpose) -> bytes:
    """The 32-byte key for ``purpose``: HKDF-SHA256 of ``secret`` with the purpose's label."""
    return HKDF(hashes.SHA256(), _KEY_BYTES, None,
                f"flow-sdk/1 {purpose.value}".encode()).derive(secret)


def mac(key: bytes, label: str, data: bytes) -> str:
    """HMAC-SHA256 under ``key`` (a key from :func:`derive_key`, never a secret itself) of
    ``label`` (an object key or a handshake role) and ``data``, as hex."""
    return hmac.new(key, label.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def seal_record(secret: bytes, key: str, fields: dict[str, Any]) -> bytes:
    """``fields`` as JSON with a ``mac`` field that binds them to ``key``."""
    return _seal_record(derive_key(secret, Purpose.RECORD_MAC), key, fields)


def open_record(secret: bytes, key: str, raw: bytes) -> bytes:
    """``raw`` unchanged once its ``mac`` checks out; raises ``SignatureError`` otherwise.
    The records' ``from_json`` readers ignore the ``mac`` field."""
    return _open_record(derive_key(secret, Purpose.RECORD_MAC), key, raw)


def seal_blob(secret: bytes, key: str, data: bytes) -> bytes:
    """``data`` behind a header carrying its MAC (bound to ``key``)."""
    return _seal_blob(derive_key(secret, Purpose.RECORD_MAC), key, data)


def open_blob(secret: bytes, key: str, blob: bytes) -> bytes:
    """The bytes inside a sealed blob once its MAC checks out; raises ``SignatureError``
    before anything else looks at them."""
    return _open_blob(derive_key(secret, Purpose.RECORD_MAC), key, blob)


def _seal_record(mac_key: bytes, key: str, fields: dict[str, Any]) -> bytes:
    return _canonical({**fields, MAC_FIELD: mac(mac_key, key, _canonical(fields))})


def _open_record(mac_key: bytes, key: str, raw: bytes) -> bytes:
    try:
        data = safejson.loads(raw, max_bytes=MAX_RECORD_BYTES)
    except safejson.BadJson as exc:
        raise SignatureError(key, f"not a record: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get(MAC_FIELD), str):
        raise SignatureError(key, "the record carries no MAC")
    claimed = data.pop(MAC_FIELD)
    if not _MAC_RE.fullmatch(claimed):  # checked before compare_digest, which wants ASCII
        raise SignatureError(key, "the record's MAC is not 64 hex digits")
    if not hmac.compare_digest(claimed.encode(), mac(mac_key, key, _canonical(data)).encode()):
        raise SignatureError(key, "the record's MAC does not match the task's secret")
    return raw


def _seal_blob(mac_key: bytes, key: str, data: bytes) -> bytes:
    return _BLOB_MAGIC + mac(mac_key, key, data).encode() + data


def _open_blob(mac_key: bytes, key: str, blob: bytes) -> bytes:
    head = len(_BLOB_MAGIC) + _MAC_HEX
    if len(blob) < head or not blob.startswith(_BLOB_MAGIC):
        raise SignatureError(key, "the object carries no MAC header")
    claimed = blob[len(_BLOB_MAGIC):head]
    data = blob[head:]
    if not hmac.compare_digest(claimed, mac(mac_key, key, data).encode()):
        raise SignatureError(key, "the object's MAC does not match the task's secret")
    return data


def seal_secret(secret: bytes, label: str, plain: bytes) -> str:
    """``plain`` encrypted and authenticated with AES-256-GCM under ``secret``'s sealing key,
    a fresh random nonce, and ``label`` (the store key it is written under) as associated
    data, as hex (nonce, then ciphertext and tag): what carries a task's secret to a pool node
    through the store."""
    nonce = secrets.token_bytes(_NONCE_BYTES)
    sealed = AESGCM(derive_key(secret, Purpose.SEALING)).encrypt(nonce, plain,
                                                                   _SEALED_AAD + label.encode())
    return (nonce + sealed).hex()


def open_secret(secret: bytes, label: str, sealed: str) -> bytes:
    """The bytes :func:`seal_secret` sealed under ``secret`` for ``label``; raises
    ``SignatureError`` when ``sealed`` is not such a value, was sealed with another secret or
    for another label, or was altered."""
    least = 2 * (_NONCE_BYTES + _TAG_BYTES)
    if not isinstance(sealed, str) or len(sealed) < least or not _SEALED_RE.fullmatch(sealed):
        raise SignatureError(label, f"the sealed secret is not hex of at least {least} digits")
    body = bytes.fromhex(sealed)
    try:
        return AESGCM(derive_key(secret, Purpose.SEALING)).decrypt(
            body[:_NONCE_BYTES], body[_NONCE_BYTES:], _SEALED_AAD + label.encode())
    except InvalidTag:
        raise SignatureError(label, "the sealed secret was not sealed with the pool's secret "
                                    "for this key, or was altered") from None


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
    ``secret`` may be a function that returns it, called when first needed; its MAC key is
    derived once, then kept."""

    def __init__(self, store: _Store, secret: bytes | Callable[[], bytes]) -> None:
        self.raw = store
        self._source = secret
        self._known: bytes | None = None

    @property
    def _mac_key(self) -> bytes:
        if self._known is None:
            secret = self._source if isinstance(self._source, bytes) else self._source()
            self._known = derive_key(secret, Purpose.RECORD_MAC)
        return self._known

    def put_record(self, key: str, record: Any) -> None:
        """Store a dataclass record (or a dict) under ``key``, sealed."""
        self.raw.put(key, _seal_record(self._mac_key, key, _fields(record)))

    def put_record_if_absent(self, key: str, record: Any) -> bool:
        return self.raw.put_if_absent(key, _seal_record(self._mac_key, key, _fields(record)))

    def get_record(self, key: str) -> bytes | None:
        """The record's JSON once checked; None when absent; ``SignatureError`` when forged."""
        raw = self.raw.get(key)
        return None if raw is None else self.check_record(key, raw)

    def check_record(self, key: str, raw: bytes) -> bytes:
        """``raw`` (read from ``key``) once its MAC checks out."""
        return _open_record(self._mac_key, key, raw)

    def put_blob(self, key: str, data: bytes) -> None:
        self.raw.put(key, _seal_blob(self._mac_key, key, data))

    def get_blob(self, key: str) -> bytes | None:
        raw = self.raw.get(key)
        return None if raw is None else _open_blob(self._mac_key, key, raw)

    def list(self, prefix: str) -> list[str]:
        return self.raw.list(prefix)


def _fields(record: Any) -> dict[str, Any]:
    return dict(record) if isinstance(record, dict) else asdict(record)
