"""Signals during a launch. Ctrl-C (SIGINT) already raises ``KeyboardInterrupt``; while a
launch runs, SIGTERM and SIGHUP raise ``LaunchInterrupted`` instead of ending the process on
the spot, so the launch can roll back what it started (a handler the program installed itself
is left in place). While it rolls back, these signals are held, then handed to the handlers in
place once the rollback is done, so a second Ctrl-C cannot cut it short.

Python delivers signals to the main thread only: a launch on another thread leaves every
handler as it is (a Ctrl-C still interrupts the main thread, not the launch).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

RAISED = (signal.SIGTERM, signal.SIGHUP)  # left at their default, they end the process at once
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LaunchInterrupted(BaseException):
    """A signal ended the launch (a ``BaseException``, like ``KeyboardInterrupt``: it is not
    an error of the launch and no ``except Exception`` may swallow it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"the launch was interrupted by {signal.Signals(signum).name}")


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise(signum: int, frame: FrameType | None) -> None:
    raise LaunchInterrupted(signum)


@contextmanager
def raising() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise ``LaunchInterrupted`` where they would have ended the
    process (a handler the program installed itself is left alone)."""
    if not _on_main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    for signum in RAISED:
        if signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, _raise)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def held() -> Iterator[list[int]]:
    """Within: SIGINT, SIGTERM and SIGHUP are noted (the list yielded), not acted on. On
    leaving, the handlers are restored; ``deliver`` hands them what arrived."""
    arrived: list[int] = []
    if not _on_main_thread():
        yield arrived
        return

    def note(signum: int, frame: FrameType | None) -> None:
        if not arrived:
            sys.stderr.write("still removing what the interrupted launch started; "
                             "it ends in a moment\n")
        arrived.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in HELD}
    try:
        yield arrived
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def deliver(arrived: list[int]) -> None:
    """Hand each signal ``held`` noted, once and in order, to the handler now in place
    (Python's Ctrl-C handler raises ``KeyboardInterrupt``; a default one ends the process)."""
    for signum in dict.fromkeys(arrived):
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)
