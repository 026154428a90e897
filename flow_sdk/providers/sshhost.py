"""``Host`` on another machine through OpenSSH: a cluster's login node, from a laptop.

The user's own ``ssh`` runs, so their SSH config, keys, agent and ``ProxyJump`` apply. One
connection per process (``connect``) carries everything: it runs ``host.py``'s ``serve`` on
the far side (``PYTHON -c BOOTSTRAP``, the module's source; nothing installed there), and is
the master that this process's other ``ssh`` calls (``command``: a shell in a job) reuse. It
starts at first use and ends with the process (or ``close``); a call cut short, or a far side
that went away, ends it, and the next operation starts another. A forked child starts its
own.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import os
import shlex
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import IO, Any

from flow_sdk.errors import ProviderError
from flow_sdk.providers import host as _host

# the far side runs this module's source: one line, as any login shell (csh too) takes it
BOOTSTRAP = "exec(__import__('base64').b64decode('{}').decode())".format(
    base64.b64encode(Path(_host.__file__).read_bytes()).decode("ascii"))
CONNECT_TIMEOUT_S = 20
CLOSE_WAIT_S = 5.0  # for the far side to see its input end and exit
NOISE_LINES = 100  # lines a login's start-up files may print before the first answer


def _close_input(pipe: IO[bytes]) -> None:
    """Close the pipe to ``ssh``. Closing flushes what is still buffered; where ``ssh`` has
    gone (a refused connection, before it read the request), those bytes have no reader and
    the flush's BrokenPipeError is dropped with them: the pipe is closed either way, and the
    caller reports the ended connection with what ``ssh`` said."""
    try:
        pipe.close()
    except BrokenPipeError:
        return


class SshHostError(ProviderError):
    """The SSH connection to the host failed, or an operation there did."""


def control_dir() -> Path:
    """This user's folder for connection sockets: under /tmp, as a socket's path has at
    most about 100 bytes (macOS's own temporary folder alone takes half of them)."""
    folder = Path("/tmp") / f"flow-ssh-{os.getuid()}"
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
        self._errors: IO[bytes] | None = None  # what ssh and the far side said
        self._asked = 0  # requests sent: each answer carries its request's number
        atexit.register(self.close)
        _EVERY.add(self)

    def _control_path(self) -> str:
        """This process's connection's socket (one master per process: another process's
        exit never cuts this one's sessions)."""
        which = hashlib.sha256(f"{self.login}\0{self.ssh_config}".encode()).hexdigest()[:12]
        return f"{control_dir()}/{os.getpid()}-{which}"

    def _ssh(self, master: bool, tty: bool) -> list[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-o", "ServerAliveInterval=15", "-o", f"ControlPath={self._control_path()}",
                "-o", f"ControlMaster={'yes' if master else 'no'}", "-o", "ControlPersist=no"]
        if self.ssh_config:
            argv += ["-F", self.ssh_config]
        return argv + (["-t"] if tty else ["-T"]) + ["--", self.login]

    def command(self, argv: list[str], *, tty: bool = False) -> list[str]:
        """``argv`` run on the host through ``ssh`` (on a terminal when ``tty``), over this
        process's connection where it is up."""
        return self._ssh(False, tty) + [shlex.join(argv)]

    def _start(self) -> subprocess.Popen[bytes]:
        self._errors = tempfile.TemporaryFile()
        return subprocess.Popen(self._ssh(True, False) + [shlex.join(
            [self.python, "-c", BOOTSTRAP])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._errors, start_new_session=True)

    def _drop(self) -> None:
        """End the connection (the far side sees its input end and exits) and forget it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        if proc.poll() is None:
            _close_input(proc.stdin)
            try:
                proc.wait(timeout=CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _close_input(proc.stdin)
        proc.stdout.close()

    def close(self) -> None:
        """End this process's connection now (else it ends when the process does); the next
        operation starts another."""
        with self._lock:
            self._drop()

    def after_fork(self) -> None:
        """In a forked child: leave the parent's connection to the parent (the child's copies
        of its pipes closed, so the far side still sees the parent's exit)."""
        self._lock = threading.Lock()
        if self._proc is not None:
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
            self._proc = None

    def _failed(self, what: str) -> SshHostError:
        self._drop()
        said: list[str] = []
        if self._errors is not None:
            self._errors.seek(0)
            said = self._errors.read().decode(errors="replace").strip().splitlines()
        return SshHostError(
            f"ssh {self.login}: {what}: {said[-1] if said else 'no message'}; check that "
            f"`ssh {self.login} {self.python} -V` works from here without a password prompt "
            "(a key or an agent; provider_config['ssh_config'] names another SSH config "
            "file) and that provider_config['python'] is an interpreter there")

    def _exchange(self, op: str, args: list[Any]) -> dict[str, Any]:
        """Send one request and read its answer: lines that are not it (what a login's
        start-up files print) are passed over."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None and stdout is not None
        self._asked += 1
        try:
            stdin.write(_host.request_line(op, args, self._asked))
            stdin.flush()
        except OSError:
            raise self._failed("the connection ended") from None
        for _ in range(NOISE_LINES):
            line = stdout.readline()
            if not line:
                raise self._failed("the connection ended")
            answer = _host.answer_to(line, self._asked)
            if answer is not None:
                return answer
        raise self._failed(f"no answer to {op} in {NOISE_LINES} lines")

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            try:
                answer = self._exchange(op, list(args))
            except BaseException:  # cut short (Ctrl-C, a signal): its answer is unread
                self._drop()
                raise
        if "error" in answer:
            if answer.get("errno"):  # as it raised there: FileExistsError, ENOTEMPTY ...
                raise OSError(answer["errno"], f"on {self.login}: {answer['message']}")
            raise SshHostError(f"ssh {self.login}: {op} failed there: {answer['error']}: "
                               f"{answer['message']} (the interpreter there is "
                               f"{self.python}: provider_config['python'])")
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
_EVERY: weakref.WeakSet[SshHost] = weakref.WeakSet()  # for a forked child to let go of
_HOSTS_LOCK = threading.Lock()


def connect(login: str, python: str, ssh_config: str | None = None) -> SshHost:
    """The process's one ``SshHost`` for ``login``: every provider built for it (the caller's,
    each ``Task.from_id``'s) shares its connection."""
    with _HOSTS_LOCK:
        key = (login, python, ssh_config)
        if key not in _HOSTS:
            _HOSTS[key] = SshHost(login, python, ssh_config)
        return _HOSTS[key]


def _after_fork_in_child() -> None:
    global _HOSTS_LOCK
    _HOSTS_LOCK = threading.Lock()
    for host in list(_EVERY):
        host.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
