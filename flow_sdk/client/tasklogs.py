"""Reading a task's logs: which streams a request selects, their ``[Node i]`` labels, and
the merge of every stream in time order, once or following them as they are written."""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from flow_sdk import wire
from flow_sdk.wire import StreamKind
from flow_sdk.wire.keys import rank_stream_place
from flow_sdk.providers.base import LogRecord, Provider

LogSource = Literal["workers", "agent", "boot", "all"]
LOG_SOURCES: tuple[LogSource, ...] = ("workers", "agent", "boot", "all")
_FOLLOW_POLL_MIN_S = 0.05  # a follow reads again this soon after it found lines
_FOLLOW_POLL_MAX_S = 0.5  # ... and backs off to this while none come (each read is a
# request per stream on a cloud's log service, which limits them)
_FOLLOW_STATUS_S = 0.5  # how often a follow asks whether the task ended
# What a terminal acts on instead of showing: C0 but tab, DEL, C1, the Unicode line and
# paragraph separators, and the bidirectional embeddings, overrides and isolates.
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")
_SGR = re.compile("\x1b\\[[0-9;:]{0,32}m")  # colour and style: ESC [ params m
_RESET = "\x1b[0m"


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str, color: bool = False) -> str:
    """``text`` as a terminal or page may show it: every control character written as
    visible, inert text (ESC as ``\\x1b``, so ``ESC [2K`` reads ``\\x1b[2K``); a line cannot
    move the cursor, erase its label, set a title or open a link. With ``color``, colour and
    style sequences (``ESC [ ... m``) stay, and a line that used one ends with a reset, so it
    cannot colour (or hide) the next line's label."""
    if not color:
        return _CONTROLS.sub(_escaped, text)
    parts, start = [], 0
    for sgr in _SGR.finditer(text):
        parts += [_CONTROLS.sub(_escaped, text[start:sgr.start()]), sgr.group()]
        start = sgr.end()
    parts.append(_CONTROLS.sub(_escaped, text[start:]))
    return "".join(parts) + (_RESET if start else "")


def shown_lines(text: str) -> str:
    """A message of several lines (``\\n`` between them), each ``shown``."""
    return "\n".join(shown(line) for line in text.split("\n"))


@dataclass(frozen=True)
class Line:
    record: LogRecord
    label: str  # "[Node i]" + NUL + what follows the clock (" [rank r]", " [agent]", ...)
    stream: str = ""
    node: int | None = None


def _ts(line: Line) -> float:
    return line.record.ts


def _kind(stream: str) -> str:
    """"node" (a worker's stream ``node-i.rank-r``), "agent" or "boot" (see StreamKind)."""
    return StreamKind.NODE if stream.startswith("node-") else stream.partition(".")[0]


class TaskLogs:
    """The log streams of one task. ``slots_per_node``, ``node_of_instances`` and ``ended``
    ask the task (workers per node; instance id -> node index; whether it has ended)."""

    def __init__(self, task_id: str, provider: Provider, *,
                 slots_per_node: Callable[[], int],
                 node_of_instances: Callable[[], dict[str, int]],
                 ended: Callable[[], bool]) -> None:
        self.task_id = task_id
        self.provider = provider
        self._slots_per_node = slots_per_node
        self._node_of_instances = node_of_instances
        self._ended = ended
        self._clock: tuple[int, str] = (-1, "")

    def _label(self, stream: str, node_of: dict[str, int] | None
               ) -> tuple[int | None, str] | None:
        """(node, label) of a stream, or None for a stream of no known kind."""
        if stream.startswith("node-"):
            place = rank_stream_place(stream)
            if place is None:
                return None
            n, rank = place
            extra = f" [rank {rank}]" if self._slots_per_node() > 1 else ""
            return n, f"[Node {n}]\0{extra}"
        kind, _, instance = stream.partition(".")
        if kind not in (StreamKind.AGENT, StreamKind.BOOT):
            return None
        index = node_of.get(instance) if node_of is not None else None
        head = f"[Node {index}]" if index is not None else f"[{shown(instance)}]"
        return index, f"{head}\0 [{kind}]"

    def _streams(self, node: int | None, source: LogSource,
                 known: dict[str, tuple[int | None, str]], rank: int | None = None
                 ) -> dict[str, tuple[int | None, str]]:
        """stream name -> (node, label) for the streams selected; ``known`` caches labels
        whose node is settled, so a follow reads the node records only for new streams.
        The workers' source includes the agents' streams for their event lines."""
        kinds = {"workers": (StreamKind.NODE, StreamKind.AGENT), "agent": (StreamKind.AGENT,),
                 "boot": (StreamKind.BOOT,), "all": tuple(StreamKind)}[source]
        names = [s for s in self.provider.logs.streams(self.task_id) if _kind(s) in kinds
                 and (rank is None or not s.startswith("node-") or s.endswith(f".rank-{rank}"))]
        node_of = None
        if any(s not in known and not s.startswith("node-") for s in names):
            node_of = self._node_of_instances()
        chosen = {}
        for stream in names:
            entry = known.get(stream) or self._label(stream, node_of)
            if entry is None:
                continue
            if entry[0] is not None:
                known[stream] = entry
            if node is None or entry[0] == node:
                chosen[stream] = entry
        return chosen

    def format(self, line: Line, color: bool = False) -> str:
        """``[Node i] [HH:MM:SS] text``: the label from the stream's name, the text ``shown``
        (with ``color``, its colour sequences kept)."""
        head, _, extra = line.label.partition("\0")
        second = int(line.record.ts)
        if second != self._clock[0]:
            self._clock = (second, time.strftime("%H:%M:%S", time.localtime(second)))
        return f"{head} [{self._clock[1]}]{extra} {shown(line.record.text, color)}"

    def entries(self, node: int | None = None, tail: int | None = None,
                    follow: bool = False, since: float | None = None,
                    source: LogSource = "workers", rank: int | None = None,
                    color: bool = False) -> Iterator[dict[str, Any]]:
        """The lines of ``lines()`` as dicts: ``ts`` (epoch), ``node``, ``rank`` (None for
        agent, boot and event lines), ``kind`` ("worker", "flow", "agent" or "boot") and
        ``text`` (as written), and ``line``, the labelled line ``logs()`` gives (``format``,
        with ``color``)."""
        for line in self.lines(node, tail, follow, since, source, rank):
            kind = _kind(line.stream)
            place = rank_stream_place(line.stream)
            if place is not None:
                worker_rank: int | None = place[1]
                kind = "worker"
            else:
                worker_rank = None
                kind = "flow" if "[flow]" in line.label else kind
            yield {"ts": line.record.ts, "node": line.node, "rank": worker_rank, "kind": kind,
                   "text": line.record.text, "line": self.format(line, color)}

    def lines(self, node: int | None, tail: int | None, follow: bool, since: float | None,
              source: LogSource, rank: int | None) -> Iterator[Line]:
        """The selected lines in time order; ``tail`` keeps the last lines, ``follow``
        yields new ones as they are written until the task ends."""
        if source not in LOG_SOURCES:
            raise ValueError(f"source must be one of {', '.join(LOG_SOURCES)}, not {source!r}")
        if follow:
            return self._follow(node, tail, since, source, rank)
        lines = self._read_new(node, since, source, {}, {}, rank)
        lines.sort(key=_ts)
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        return iter(lines)

    def _read_new(self, node: int | None, since: float | None, source: LogSource,
                  cursors: dict[str, int], known: dict[str, tuple[int | None, str]],
                  rank: int | None = None) -> list[Line]:
        """Lines written since ``cursors`` (which it advances). For the workers' source, an
        agent's stream contributes only its event lines, labelled ``[flow]``."""
        lines: list[Line] = []
        for stream, (at, label) in self._streams(node, source, known, rank).items():
            records, cursors[stream] = self.provider.logs.read(self.task_id, stream,
                                                               cursors.get(stream, 0))
            events_only = source == "workers" and _kind(stream) == "agent"
            for r in records:
                if since is not None and r.ts < since:
                    continue
                if events_only:
                    if not r.text.startswith(wire.EVENT_MARK):
                        continue
                    r = LogRecord(r.ts, r.text[len(wire.EVENT_MARK):])
                    lines.append(Line(r, label.replace("[agent]", "[flow]"), stream, at))
                else:
                    lines.append(Line(r, label, stream, at))
        return lines

    def _follow(self, node: int | None, tail: int | None, since: float | None,
                source: LogSource, rank: int | None) -> Iterator[Line]:
        """Yield lines as they are written, in time order across streams: a line comes out
        once every line stamped before it must have been read, i.e. when it is older than
        the start of the latest read by the log store's ``write_delay_s``."""
        settle = self.provider.logs.write_delay_s
        cursors: dict[str, int] = {}
        known: dict[str, tuple[int | None, str]] = {}
        pending = self._read_new(node, since, source, cursors, known, rank)
        pending.sort(key=_ts)
        if tail is not None:
            pending = pending[-tail:] if tail > 0 else []
        yield from pending
        pending = []
        ended = False
        next_status = 0.0
        delay = _FOLLOW_POLL_MIN_S
        while True:
            if time.monotonic() >= next_status:  # asked BEFORE the read: nothing is missed
                ended = self._ended()
                next_status = time.monotonic() + _FOLLOW_STATUS_S
            if ended:  # lines written just as the task ended are still on their way
                time.sleep(settle)
            read_at = time.time()
            new = self._read_new(node, since, source, cursors, known, rank)
            if new:
                pending.extend(new)
                pending.sort(key=_ts)  # nearly sorted already: linear
            delay = _FOLLOW_POLL_MIN_S if new else min(delay * 1.5, _FOLLOW_POLL_MAX_S)
            cut = len(pending) if ended else bisect.bisect_right(
                pending, read_at - settle, key=_ts)
            yield from pending[:cut]
            del pending[:cut]
            if ended:
                return
            time.sleep(delay)
