"""JSON from outside the process, parsed only once it is known to be small and shallow: a
line or object a peer, a store writer or a file sent can be refused, never crash a parser
(Python's decoder raises ``RecursionError`` on deep nesting, which no ``except ValueError``
catches)."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32  # no record or request of ours nests deeper than a few levels
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")


class BadJson(ValueError):
    """Not JSON, or larger or deeper than allowed."""


def depth(data: bytes) -> int:
    """How deep the arrays and objects of ``data`` nest (brackets inside strings aside)."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return data.count(b"[") + data.count(b"{")
    deepest = level = 0
    for match in _BRACKET.finditer(_STRING.sub(b"", data)):
        level += 1 if match[0] in b"[{" else -1
        deepest = max(deepest, level)
    return deepest


def loads(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``data``; raises ``BadJson`` when it is over ``max_bytes``, nests
    deeper than ``max_depth`` or is not JSON."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise BadJson(f"{len(raw)} bytes, more than the {max_bytes} allowed")
    if raw.count(b"[") + raw.count(b"{") > max_depth and depth(raw) > max_depth:
        raise BadJson(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadJson(f"not JSON ({exc})") from None
