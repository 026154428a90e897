"""The key-value store's wire format: limits, the connect handshake, request validation.

One JSON object per line each way. A connection starts with a challenge-response that proves
to each side that the other holds the task's secret (the secret never crosses the wire). K is
the store's handshake key, derived from the secret (``signing.Purpose.STORE_HANDSHAKE``):

    server -> {"hello": "flow-kv/3", "nonce": SN}
    client -> {"auth": HMAC(K, "kv-client", SN CN), "nonce": CN}
    server -> {"ok": true, "auth": HMAC(K, "kv-server", SN CN)}

A client that fails it is dropped before any request is read.
"""

from __future__ import annotations

import secrets
from typing import Any

from flow_sdk.wire import signing

VERSION = "flow-kv/3"  # 3: the handshake proves the derived key, not the secret
NONCE_HEX = 32
MAX_HELLO_LINE = 1024  # a line before authentication
MAX_LINE = 4 << 20  # a request line after authentication
MAX_KEY = 512
MAX_VALUE = 1 << 20
MAX_KEYS = 65536  # keys in one check / multi_get
MAX_WAIT_S = 60.0  # the longest one blocking wait may last on the server
MAX_TOTAL_BYTES = 256 << 20  # everything the store holds
HANDSHAKE_S = 10.0  # an unauthenticated connection is dropped after this
OPS = ("set", "get", "add", "check", "multi_get", "wait", "time")


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX // 2)


def proof(secret: bytes, role: str, server_nonce: str, client_nonce: str) -> str:
    """What ``role`` ("kv-client" or "kv-server") sends to prove it holds the secret."""
    return signing.mac(signing.derive_key(secret, signing.Purpose.STORE_HANDSHAKE), role,
                       f"{server_nonce}:{client_nonce}".encode())


def is_nonce(value: Any) -> bool:
    return (isinstance(value, str) and len(value) == NONCE_HEX
            and all(c in "0123456789abcdef" for c in value))


def _is_key(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_KEY


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 53


def problem(request: Any) -> str | None:
    """Why ``request`` is not a well-formed operation, or None when it is."""
    if not isinstance(request, dict):
        return "a request must be a JSON object"
    op = request.get("op")
    if op not in OPS:
        return f"unknown operation {op!r}; one of {', '.join(OPS)}"
    if op in ("set", "get", "add", "wait") and not _is_key(request.get("key")):
        return f"{op}: 'key' must be a string of 1 to {MAX_KEY} characters"
    if op == "set" and not (isinstance(request.get("value"), str)
                            and len(request["value"]) <= MAX_VALUE):
        return f"set: 'value' must be a string of at most {MAX_VALUE} characters"
    if op == "add" and not _is_int(request.get("amount")):
        return "add: 'amount' must be an integer"
    if op == "wait":
        timeout = request.get("timeout_s")
        if not _is_int(request.get("at_least")):
            return "wait: 'at_least' must be an integer"
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                and 0 <= timeout <= MAX_WAIT_S):
            return f"wait: 'timeout_s' must be a number from 0 to {MAX_WAIT_S:.0f}"
    if op in ("check", "multi_get"):
        keys = request.get("keys")
        if not (isinstance(keys, list) and len(keys) <= MAX_KEYS
                and all(_is_key(k) for k in keys)):
            return f"{op}: 'keys' must be a list of at most {MAX_KEYS} keys"
    return None


def as_count(value: str | None) -> int | None:
    """A stored counter's value (None for an absent key or one that holds no integer)."""
    if value is None:
        return None
    text = value[1:] if value.startswith("-") else value
    return int(value) if text.isascii() and text.isdigit() and len(text) < 16 else None
