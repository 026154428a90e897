"""``Host`` on another machine through OpenSSH: a cluster's login node, from a laptop.

The user's own ``ssh`` runs, so their SSH config, keys, agent and ``ProxyJump`` apply. One
connection per process (``connect``) carries everything: it runs ``host.py``'s ``serve`` on
the far side (``PYTHON -c SOURCE``, nothing installed there), and is the master that other
``ssh`` calls (``command``: a shell in a job) reuse. It starts at first use and ends with
this process (at exit); when the far side closes it, the next operation starts another.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from flow_sdk.errors import ProviderError
from flow_sdk.providers import host as _host

SOURCE = Path(_host.__file__).read_text(encoding="utf-8")
CONNECT_TIMEOUT_S = 20
STOP_WAIT_S = 5.0


class SshHostError(ProviderError):
    """The SSH connection to the host failed, or an operation there did."""


def control_dir() -> Path:
    """This user's folder for connection sockets (short: a socket path has ~100 bytes)."""
    folder = Path(tempfile.gettempdir()) / f"flow-ssh-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.lstat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or folder.is_symlink():
        raise SshHostError(f"{folder} is not this user's private folder (mode "
                           f"{oct(info.st_mode & 0o777)}); remove it and try again")
    return folder


class SshHost:
    """``Host`` on ``login`` (``user@host`` or a name of the SSH config), its operations done
    by ``python`` there."""

    def __init__(self, login: str, python: str, ssh_config: str | None = None) -> None:
        self.login = login
        self.python = python
        self.ssh_config = ssh_config
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = os.getpid()
        self._errors: IO[bytes] | None = None  # what ssh and the far side said

    def ssh_argv(self, *, tty: bool = False) -> list[str]:
        """``ssh`` up to the login name, reusing this process's connection where it is up."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-o", "ServerAliveInterval=15", "-o", "ControlMaster=auto",
                "-o", f"ControlPath={control_dir()}/%C", "-o", "ControlPersist=no"]
        if self.ssh_config:
            argv += ["-F", self.ssh_config]
        return argv + (["-t"] if tty else ["-T"]) + ["--", self.login]

    def command(self, argv: list[str], *, tty: bool = False) -> list[str]:
        """``argv`` run on the host through ``ssh`` (on a terminal when ``tty``)."""
        return self.ssh_argv(tty=tty) + [shlex.join(argv)]

    def _start(self) -> subprocess.Popen[bytes]:
        self._errors = tempfile.TemporaryFile()
        proc = subprocess.Popen(self.command([self.python, "-c", SOURCE]),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self._errors, start_new_session=True)
        atexit.register(self._stop, proc)
        return proc

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        """End the connection: the far side sees its input end and exits."""
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._stop(self._proc)
                self._proc = None

    def _failed(self, proc: subprocess.Popen[bytes], what: str) -> SshHostError:
        self._stop(proc)
        self._proc = None
        said: list[str] = []
        if self._errors is not None:
            self._errors.seek(0)
            said = self._errors.read().decode(errors="replace").strip().splitlines()
        return SshHostError(
            f"ssh {self.login}: {what}: {said[-1] if said else 'no message'}; check that "
            f"`ssh {self.login} {self.python} -V` works from here without a password prompt "
            "(a key or an agent; provider_config['ssh_config'] names another SSH config "
            "file) and that provider_config['python'] is an interpreter there")

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or (
                    self._pid != os.getpid()):  # a forked child starts its own
                self._proc, self._pid = self._start(), os.getpid()
            proc = self._proc
            stdin, stdout = proc.stdin, proc.stdout
            assert stdin is not None and stdout is not None
            try:
                stdin.write(_host.request_line(op, list(args)))
                stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._failed(proc, "the connection ended") from None
            line = stdout.readline()
            if not line:
                raise self._failed(proc, "the connection ended")
        answer = json.loads(line)
        if "error" in answer:
            if answer.get("errno"):  # as it raised there: FileExistsError, ENOTEMPTY ...
                raise OSError(answer["errno"], f"on {self.login}: {answer['message']}")
            raise SshHostError(f"ssh {self.login}: {op} failed there: {answer['error']}: "
                               f"{answer['message']}")
        return _host.decode(answer["ok"])

    def read(self, path: str, offset: int = 0) -> bytes | None:
        result: bytes | None = self._call("read", path, offset)
        return result

    def write(self, path: str, data: bytes, mode: str = "replace") -> bool:
        return bool(self._call("write", path, data, mode))

    def files_under(self, path: str) -> list[str]:
        return list(self._call("files_under", path))

    def names(self, path: str) -> list[str] | None:
        result: list[str] | None = self._call("names", path)
        return result

    def kind(self, path: str) -> str | None:
        result: str | None = self._call("kind", path)
        return result

    def mkdirs(self, path: str) -> None:
        self._call("mkdirs", path)

    def rename(self, source: str, target: str) -> None:
        self._call("rename", source, target)

    def remove(self, path: str) -> None:
        self._call("remove", path)

    def run(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        code, out, err = self._call("run", argv, timeout_s)
        return int(code), str(out), str(err)

    def home(self) -> str:
        return str(self._call("home"))



_HOSTS: dict[tuple[str, str, str | None], SshHost] = {}
_HOSTS_LOCK = threading.Lock()


def connect(login: str, python: str, ssh_config: str | None = None) -> SshHost:
    """The process's one ``SshHost`` for ``login``: every provider built for it (the caller's,
    each ``Task.from_id``'s) shares its connection."""
    with _HOSTS_LOCK:
        return _HOSTS.setdefault((login, python, ssh_config),
                                 SshHost(login, python, ssh_config))
