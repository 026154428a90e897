"""Where a log line ends: the one rule for cutting a process's output into log records.

A line ends at ``\\r\\n``, ``\\r`` or ``\\n``, so each update a progress bar draws over the
last one with a carriage return (tqdm's) is a line of its own. A carriage return that ends
nothing (the one a progress bar writes before its first update) makes no empty line; an empty
line ended by a newline stays. A store keeps one record per line: no record's text holds a
line end.
"""

from __future__ import annotations

import re
from typing import AnyStr

MAX_LINE_BYTES = 256 * 1024  # a longer line is cut into lines of this length
_TEXT_ENDS = re.compile("(\r\n|\r|\n)")
_BYTE_ENDS = re.compile(b"(\r\n|\r|\n)")


def _ended(pieces: list[AnyStr], bare_cr: AnyStr) -> list[AnyStr]:
    """The lines of ``re.split`` pieces (text, end, text, end, ..., rest): every text that
    an end follows, but an empty one that a bare carriage return ends."""
    return [text for text, end in zip(pieces[0:-1:2], pieces[1::2])
            if text or end != bare_cr]


def split_lines(text: str) -> list[str]:
    """The lines of one record's ``text``; a text with no line end is one line (even "")."""
    pieces = _TEXT_ENDS.split(text)
    lines = _ended(pieces, "\r")
    if pieces[-1] or len(pieces) == 1:
        lines.append(pieces[-1])
    return lines


class LineSplitter:
    """Cuts a byte stream into lines as it arrives: ``feed`` each chunk read, ``finish`` at
    the end of the stream. A line comes out as soon as its end arrives; a ``\\r\\n`` cut
    between two chunks still ends one line."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._rest = b""
        # The last chunk ended in \r (None: it did not): whether the text it ended was
        # empty. A \n first in the next chunk makes it a \r\n, which ends an empty line too.
        self._cr_ended_empty: bool | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:
            return []
        lines: list[bytes] = []
        if self._cr_ended_empty is not None and chunk.startswith(b"\n"):
            chunk = chunk[1:]
            if self._cr_ended_empty:
                lines.append(b"")
        pieces = _BYTE_ENDS.split(self._rest + chunk)
        self._cr_ended_empty = pieces[-3] == b"" if chunk.endswith(b"\r") else None
        lines += [part for line in _ended(pieces, b"\r") for part in self._cut(line)]
        *cut, self._rest = self._cut(pieces[-1])
        return lines + cut

    def _cut(self, line: bytes) -> list[bytes]:
        """``line`` in pieces of at most ``max_line_bytes``."""
        return [line[i:i + self._max] for i in range(0, len(line), self._max)] or [line]

    def finish(self) -> list[bytes]:
        """The last line when the stream ended without a line end."""
        rest, self._rest = self._rest, b""
        return [rest] if rest else []
