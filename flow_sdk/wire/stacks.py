"""Stacks and stalls: the records a stacks request, each rank's dump and a stall leave in the
task's store, and reading the dumps: which ranks stand apart from the rest.

A request (``StacksRequest``, numbered from 1, claimed with ``put_if_absent``) is written by
``task.stacks()`` or by the leader's agent when a rank stalls; every node's agent answers with
one ``StackDump`` per worker (Python's ``faulthandler`` text of every thread and its frames as
data, py-spy's native frames where installed). A ``StallRecord`` says what the leader saw and
did. The dumps stay in the task's store, sealed, after the task ends: ``flow stacks`` shows an
ended task's last ones. ``flow_sdk.wire.tracebacks`` renders them, as it renders a traceback.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flow_sdk.errors import RecordError
from flow_sdk.wire.keys import task_prefix
from flow_sdk.wire.records import _fields_of

STALL_ACTIONS = ("warn", "fail")
MAX_COUNT = 2**31 - 1  # ranks, nodes and request numbers
MAX_EPOCH_S = 253402300800.0  # 10000-01-01: later times are no clock's
_NUMBER_RE = re.compile(r"0|[1-9][0-9]{0,9}")
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')
# Frames of torch.distributed's collectives: a rank inside one waits for its peers.
_COLLECTIVE_FILES = ("torch/distributed/",)


def stacks_prefix(task_id: str) -> str:
    return f"{task_prefix(task_id)}stacks/"


def stacks_request_key(task_id: str, number: int) -> str:
    return f"{stacks_prefix(task_id)}{number}/request.json"


def stack_dump_key(task_id: str, number: int, rank: int) -> str:
    return f"{stacks_prefix(task_id)}{number}/rank-{rank}.json"


def stall_key(task_id: str, number: int) -> str:
    return f"{task_prefix(task_id)}stalls/{number}.json"


def stalls_prefix(task_id: str) -> str:
    return f"{task_prefix(task_id)}stalls/"


def request_numbers(keys: list[str]) -> list[int]:
    """The request numbers among keys listed under ``stacks_prefix`` (any other key, junk
    included, names none)."""
    found = []
    for key in keys:
        part = key.rstrip("/").split("/")
        if len(part) >= 2 and part[-1] == "request.json" and _NUMBER_RE.fullmatch(part[-2]):
            found.append(int(part[-2]))
    return sorted(found)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(_count(v) for v in value)


def _seconds(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0 <= value < MAX_EPOCH_S)  # NaN compares false: refused too


def _typed(cls: type[Any], data: bytes, kinds: dict[str, tuple[Callable[[Any], bool], str]]
           ) -> dict[str, Any]:
    """``_fields_of``, and each field of ``kinds`` of the kind it names (else RecordError)."""
    raw = _fields_of(cls, data)
    for name, (fits, kind) in kinds.items():
        if name in raw and not fits(raw[name]):
            shown = repr(raw[name])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise RecordError(f"{cls.__name__}.{name} is {shown}, not {kind}; run the same "
                              "flow-sdk version on the client and the nodes")
    return raw


_COUNT = (_count, "a whole number from 0")
_COUNTS = (_counts, "a list of whole numbers from 0")
_SECONDS = (_seconds, "a number of seconds from 0")
_TEXT = (lambda v: isinstance(v, str), "a string")


@dataclass(frozen=True)
class StacksRequest:
    number: int
    node: int | None  # only this node's workers; None: every node's
    reason: str
    requested_at: float

    @classmethod
    def from_json(cls, data: bytes) -> StacksRequest:
        return cls(**_typed(cls, data, {
            "number": _COUNT, "node": (lambda v: v is None or _count(v), "a node index"),
            "reason": _TEXT, "requested_at": _SECONDS}))


def _frame(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 5 and isinstance(value[0], str)
            and _count(value[1]) and isinstance(value[2], str) and isinstance(value[3], str)
            and isinstance(value[4], bool))


def _threads(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, list) and all(_frame(f) for f in t) for t in value)


@dataclass(frozen=True)
class StackDump:
    rank: int
    node: int
    text: str  # faulthandler's dump of every thread; "" when the worker could not answer
    taken_at: float
    how: str  # "faulthandler", "faulthandler+py-spy", or why there is no dump
    # The dump's threads, Python's main thread first, each a list of frames outermost first:
    # [file (the caller's, for code shipped by value), line, function, source line on the
    # node, whether the frame is the SDK's own] (``flow_sdk.wire.tracebacks`` renders them).
    threads: list[list[list[Any]]] = field(default_factory=list)
    native: str = ""  # py-spy's native frames, where it is installed

    @classmethod
    def from_json(cls, data: bytes) -> StackDump:
        return cls(**_typed(cls, data, {
            "rank": _COUNT, "node": _COUNT, "text": _TEXT, "taken_at": _SECONDS, "how": _TEXT,
            "threads": (_threads, "a list of threads of [file, line, function, source, sdk]"),
            "native": _TEXT}))

    def main_frames(self) -> list[tuple[str, int, str]]:
        """The frames of Python's main thread, innermost first: (file, line, function)."""
        if self.threads:
            return [(f[0], f[1], f[2]) for f in reversed(self.threads[0])]
        found = threads(self.text)
        return found[0] if found else []

    def in_collective(self) -> bool:
        return any(any(part in f for part in _COLLECTIVE_FILES) for f, _, _ in
                   self.main_frames())


@dataclass(frozen=True)
class StallRecord:
    number: int
    ranks: list[int]  # the ranks without progress for the timeout
    odd_ranks: list[int]  # the ranks whose stacks stand apart from the rest
    idle_s: float  # how long the first of them made no progress
    timeout_s: float
    stacks_request: int
    action: str  # one of STALL_ACTIONS
    message: str
    at: float
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: bytes) -> StallRecord:
        raw = _typed(cls, data, {
            "number": _COUNT, "ranks": _COUNTS, "odd_ranks": _COUNTS, "idle_s": _SECONDS,
            "timeout_s": _SECONDS, "stacks_request": _COUNT, "message": _TEXT, "at": _SECONDS,
            "extra": (lambda v: isinstance(v, dict), "a JSON object")})
        if raw["action"] not in STALL_ACTIONS:
            raise RecordError(f"StallRecord.action is {raw['action']!r}, not one of "
                              f"{list(STALL_ACTIONS)}")
        return cls(**raw)

    def summary(self) -> str:
        return f"{self.message} ({self.action})"


def threads(text: str) -> list[list[tuple[str, int, str]]]:
    """faulthandler's dump as threads of frames (innermost first), Python's main thread
    first. faulthandler lists the newest thread first, so the main thread is the last
    one (the thread marked ``Current thread`` is whichever one took the signal)."""
    found: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            found.append([])
            continue
        match = _FRAME_RE.match(line)
        if match and found:
            found[-1].append((match["file"], int(match["line"]), match["func"]))
    return found[::-1]


def odd_ranks(dumps: list[StackDump]) -> list[int]:
    """The ranks whose main thread stands apart: the smallest group of identical stacks when
    one group is smaller than every other, and ranks outside a collective when every other
    rank waits in one. A rank that could not dump (stopped, gone) stands apart too."""
    if len(dumps) < 2:
        return []
    silent = sorted(d.rank for d in dumps if not d.text)
    answered = [d for d in dumps if d.text]
    waiting = [d for d in answered if d.in_collective()]
    outside = sorted(d.rank for d in answered if not d.in_collective())
    if waiting and outside and len(outside) < len(waiting):
        return sorted(silent + outside)
    groups = Counter(tuple(d.main_frames()) for d in answered)
    if len(groups) >= 2:
        sizes = sorted(groups.values())
        if sizes[0] < sizes[1]:
            smallest = min(groups, key=lambda k: groups[k])
            return sorted(silent + [d.rank for d in answered
                                    if tuple(d.main_frames()) == smallest])
    return silent
