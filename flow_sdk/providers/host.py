"""The machine a provider's shared folder and commands live on, as a small set of file and
command operations: ``LocalHost`` does them here; ``sshhost.SshHost`` asks a ``LocalHost``
on another machine (a cluster's login node) through one SSH connection.

This module imports only the standard library: its source is what ``SshHost`` runs on the far
side (``sshhost.BOOTSTRAP``), where ``serve`` answers one JSON request per line. Files are
written whole or not at all (a temporary file, then a rename or a link), 0600 in 0700
folders: other users of the machine read nothing of a task's.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Protocol

WRITE_MODES = ("replace", "new", "if_absent", "append")


class Host(Protocol):
    """File and command operations on one machine (paths are absolute, on that machine)."""

    def read(self, path: str, offset: int = 0) -> bytes | None:
        """The file's bytes from ``offset`` on; None when it does not exist."""

    def write(self, path: str, data: bytes, mode: str = "replace") -> bool:
        """Write ``data`` to a private file, its missing folders made 0700. ``mode``:
        ``replace`` (whole, atomically), ``new`` (refused when the file exists),
        ``if_absent`` (atomically; False when it exists) or ``append``."""

    def files_under(self, path: str) -> list[str]:
        """Every file below the folder (relative, ``/``-separated; dot-names left out)."""

    def names(self, path: str) -> list[str] | None:
        """The entries of a folder; None when it is not one."""

    def kind(self, path: str) -> str | None:
        """``dir``, ``file`` (or anything else that is not a folder), or None when absent."""

    def mkdirs(self, path: str) -> None:
        """The folder and its missing parents, made 0700."""

    def rename(self, source: str, target: str) -> None: ...

    def remove(self, path: str) -> None:
        """The file or the whole folder; nothing when it is gone."""

    def run(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        """Run a command; its exit code (127: not found, 124: timed out) and output."""

    def home(self) -> str:
        """The user's home folder there."""


class LocalHost:
    """``Host`` on this machine."""

    def read(self, path: str, offset: int = 0) -> bytes | None:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(self, path: str, data: bytes, mode: str = "replace") -> bool:
        if mode not in WRITE_MODES:
            raise ValueError(f"write mode {mode!r} is none of {', '.join(WRITE_MODES)}")
        target = Path(path)
        self.mkdirs(str(target.parent))
        if mode == "append":
            with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                           "ab") as fh:
                fh.write(data)
            return True
        if mode == "new":
            with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                           "wb") as fh:
                fh.write(data)
            return True
        temp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            fh.write(data)
        if mode == "replace":
            os.replace(temp, target)
            return True
        try:
            os.link(temp, target)  # atomic: fails when the file exists
        except FileExistsError:
            return False
        finally:
            temp.unlink()
        return True

    def files_under(self, path: str) -> list[str]:
        found = []
        for folder, _dirs, files in os.walk(path):
            for name in files:
                if not name.startswith("."):
                    found.append((Path(folder) / name).relative_to(path).as_posix())
        return sorted(found)

    def names(self, path: str) -> list[str] | None:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def kind(self, path: str) -> str | None:
        if os.path.isdir(path):
            return "dir"
        return "file" if os.path.lexists(path) else None

    def mkdirs(self, path: str) -> None:
        missing = []
        folder = Path(path)
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for each in reversed(missing):
            each.mkdir(mode=0o700, exist_ok=True)

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)

    def remove(self, path: str) -> None:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=_gone_is_removed)
            else:
                os.unlink(path)
        except FileNotFoundError:
            return  # already gone (another remover was first): what was asked

    def run(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        if shutil.which(argv[0]) is None:
            return 127, "", f"{argv[0]}: command not found"
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]} did not answer within {timeout_s:.0f}s"
        return done.returncode, done.stdout, done.stderr

    def home(self) -> str:
        return str(Path.home())


def _gone_is_removed(_func: Any, _path: str, info: Any) -> None:
    """``rmtree``'s error handler: an entry that went meanwhile is removed; else it raises."""
    if not isinstance(info[1], FileNotFoundError):
        raise info[1]


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    """A value of a request or an answer as ``_encode`` wrote it (bytes travel as base64)."""
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def request_line(op: str, args: list[Any], number: int = 0) -> bytes:
    """Request ``number``: ``{"id": number, "op": ..., "args": [...]}`` on one line."""
    return json.dumps({"id": number, "op": op, "args": _encode(args)}).encode() + b"\n"


def answer_to(line: bytes, number: int) -> dict[str, Any] | None:
    """The answer to request ``number`` that ``line`` holds; None when it holds none (another
    request's, or what a login's start-up files printed)."""
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) and answer.get("id") == number else None


def serve(host: LocalHost, requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer each request line with one line: ``{"id": its id, "ok": value}``, or
    ``{"id": ..., "error": type, "message": ..., "errno": ...}`` when the operation raised.
    Ends when ``requests`` does."""
    operations = {name: getattr(host, name) for name in Host.__dict__
                  if not name.startswith("_")}
    for line in requests:
        number = None
        try:
            request = json.loads(line)
            number = request["id"]
            answer = {"ok": _encode(operations[request["op"]](*decode(request["args"])))}
        except Exception as exc:  # one refused request, told to the caller; the next goes on
            answer = {"error": type(exc).__name__, "message": str(exc),
                      "errno": exc.errno if isinstance(exc, OSError) else None}
        answers.write(json.dumps({"id": number, **answer}).encode() + b"\n")
        answers.flush()


LOCAL = LocalHost()  # this machine

if __name__ == "__main__":
    serve(LocalHost(), sys.stdin.buffer, sys.stdout.buffer)
