"""Plain-text tables, times and JSON for the ``flow`` command line."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned on the widest cell; no borders (``kubectl get`` style)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row]
                                           for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in cells)


def pairs(items: Sequence[tuple[str, object]]) -> str:
    """``key   value`` lines, keys aligned."""
    width = max(len(k) for k, _ in items)
    return "\n".join(f"{k.ljust(width)}  {'' if v is None else v}" for k, v in items)


def when(epoch: float | None, now: float | None = None) -> str:
    """``2024-05-01 12:00:01 (3m ago)``."""
    if epoch is None:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
    return f"{stamp} ({ago(epoch, now)})"


def ago(epoch: float, now: float | None = None) -> str:
    seconds = max(0.0, (time.time() if now is None else now) - epoch)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
