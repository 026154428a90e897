"""SSH to a task's nodes through paramiko, with host keys pinned at launch.

The provider reports each node's endpoint with the host key it pinned when it launched the
node (``SshEndpoint.host_key``). The client trusts exactly that key: it is added to the
client's host keys explicitly and any other key is refused (a ``RejectPolicy`` that raises
``HostKeyMismatchError``); nothing is ever auto-accepted or written to ``known_hosts``.

    result = run_command(endpoint, "nvidia-smi")    # SshResult(exit_code, stdout, stderr)
    code = interactive_shell(endpoint)              # a shell on this terminal
"""

from __future__ import annotations

import base64
import hashlib
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, NamedTuple

from flow_sdk.errors import (
    install_hint,
    HostKeyMismatchError,
    SshError,
)
from flow_sdk.providers.base import SshEndpoint

if TYPE_CHECKING:
    import paramiko

CONNECT_RETRY_S = 10.0  # a node's sshd may still be starting: retry refused connections this long


class SshResult(NamedTuple):
    """What a remote command left: its exit code and its output, decoded as UTF-8."""

    exit_code: int
    stdout: str
    stderr: str


def _require_paramiko() -> None:
    try:
        import paramiko  # noqa: F401
    except ImportError as exc:
        raise SshError(install_hint("SSH", "paramiko")) from exc


def fingerprint(host_key: str) -> str:
    """``SHA256:...`` of a ``"<type> <base64>"`` public key, as OpenSSH prints it."""
    data = base64.b64decode(host_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def _known_name(endpoint: SshEndpoint) -> str:
    return endpoint.host if endpoint.port == 22 else f"[{endpoint.host}]:{endpoint.port}"


def _check_key_file(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as exc:
        raise SshError(f"the task's SSH key {path} is gone (the task's nodes were torn down)"
                       ) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SshError(f"the SSH key {path} is readable by others (mode {oct(mode & 0o777)}); "
                       f"run `chmod 600 {path}`")


def connect(endpoint: SshEndpoint, *, timeout: float = 10.0,
            retry_s: float = CONNECT_RETRY_S) -> paramiko.SSHClient:
    """An authenticated client for the node, its host key checked against the pinned one.

    Refused connections are retried for ``retry_s`` (the node's sshd may still be starting).
    """
    _require_paramiko()
    import paramiko

    _check_key_file(endpoint.key_path)
    kind, data = endpoint.host_key.split()[:2]
    pinned = paramiko.PKey.from_type_string(kind, base64.b64decode(data))
    pkey = paramiko.PKey.from_path(endpoint.key_path)
    deadline = time.monotonic() + retry_s
    while True:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_reject_unpinned(endpoint))
        client.get_host_keys().add(_known_name(endpoint), pinned.get_name(), pinned)
        try:
            client.connect(endpoint.host, endpoint.port, username=endpoint.user, pkey=pkey,
                           look_for_keys=False, allow_agent=False, timeout=timeout,
                           banner_timeout=timeout, auth_timeout=timeout)
            return client
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyMismatchError(
                f"{_known_name(endpoint)} presented host key {fingerprint(_key_line(exc.key))}"
                f" but {fingerprint(endpoint.host_key)} was pinned when the node launched; "
                "refusing to connect. If the node was really replaced, re-attach to the task "
                "so its new key is read from the provider") from exc
        except HostKeyMismatchError:
            client.close()
            raise
        except paramiko.AuthenticationException as exc:
            client.close()
            raise SshError(f"{endpoint.user}@{_known_name(endpoint)} refused the task's key "
                           f"{endpoint.key_path}: {exc}") from exc
        except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError,
                TimeoutError, paramiko.SSHException, EOFError) as exc:
            client.close()
            if time.monotonic() >= deadline:
                raise SshError(f"could not connect to {endpoint.user}@{_known_name(endpoint)}: "
                               f"{exc}; the node's boot log (task.logs(source='boot')) shows "
                               "whether its SSH server started") from exc
            time.sleep(0.1)


def _key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def _reject_unpinned(endpoint: SshEndpoint) -> paramiko.MissingHostKeyPolicy:
    """A RejectPolicy that raises HostKeyMismatchError: the server offered no key of the
    pinned key's type, so it cannot be the node that was launched."""
    import paramiko

    class RejectUnpinned(paramiko.RejectPolicy):  # type: ignore[misc]
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            raise HostKeyMismatchError(
                f"{hostname} presented a {key.get_name()} host key "
                f"{fingerprint(_key_line(key))}, but {fingerprint(endpoint.host_key)} "
                f"({endpoint.host_key.split()[0]}) was pinned when the node launched; "
                "refusing to connect")

    return RejectUnpinned()


def run_command(endpoint: SshEndpoint, command: str, *, timeout: float | None = None
                ) -> SshResult:
    """Run ``command`` on the node (in its working directory and environment) and return
    its exit code, stdout and stderr. ``timeout`` bounds the whole run in seconds: past it
    the session is closed and SshError raised."""
    client = connect(endpoint)
    try:
        transport = client.get_transport()
        assert transport is not None
        channel = transport.open_session(timeout=10.0)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            channel.close()

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        channel.exec_command(command)
        channel.shutdown_write()  # the command reads an empty stdin
        if timer is not None:
            timer.start()
        err: list[bytes] = []
        stderr_file = channel.makefile_stderr("rb")
        reader = threading.Thread(target=lambda: err.append(stderr_file.read()), daemon=True)
        reader.start()
        out = channel.makefile("rb").read()
        reader.join()
        if timer is not None:
            timer.cancel()
        if expired.is_set():
            raise SshError(f"`{command}` on {_known_name(endpoint)} ran longer than "
                               f"{timeout}s; its session was closed")
        code = int(channel.recv_exit_status())
    finally:
        client.close()
    return SshResult(code, out.decode("utf-8", errors="replace"),
                     b"".join(err).decode("utf-8", errors="replace"))


def interactive_shell(endpoint: SshEndpoint, stdin_fd: int | None = None,
                      stdout_fd: int | None = None) -> int:
    """A shell on the node wired to this terminal (a pty when stdin is a terminal, raw mode
    while it runs); returns the shell's exit code. Without a terminal, stdin is sent as is."""
    in_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    out_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    client = connect(endpoint)
    try:
        transport = client.get_transport()
        assert transport is not None
        channel = transport.open_session(timeout=10.0)
        is_tty = os.isatty(in_fd)
        if is_tty:
            size = shutil.get_terminal_size()
            channel.get_pty(term=os.environ.get("TERM", "xterm"), width=size.columns,
                            height=size.lines)
        channel.invoke_shell()
        if is_tty:
            return _with_raw_terminal(in_fd, lambda: _shuttle(channel, in_fd, out_fd), channel)
        return _shuttle(channel, in_fd, out_fd)
    finally:
        client.close()


def _with_raw_terminal(fd: int, run: object, channel: paramiko.Channel) -> int:
    import termios
    import tty

    saved = termios.tcgetattr(fd)

    def on_resize(signum: int, frame: FrameType | None) -> None:
        size = shutil.get_terminal_size()
        channel.resize_pty(width=size.columns, height=size.lines)

    previous = signal.signal(signal.SIGWINCH, on_resize)
    tty.setraw(fd, termios.TCSADRAIN)  # keep what was typed before the shell started
    try:
        code: int = run()  # type: ignore[operator]
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
    return code


def _shuttle(channel: paramiko.Channel, in_fd: int, out_fd: int) -> int:
    """Copy stdin to the channel and the channel's output to stdout until the shell exits."""
    watching = [channel, in_fd]
    while True:
        readable, _, _ = select.select(watching, [], [], 0.5)
        if channel in readable:
            data = channel.recv(65536) if channel.recv_ready() else b""
            errors = channel.recv_stderr(65536) if channel.recv_stderr_ready() else b""
            if data:
                _write_all(out_fd, data)
            if errors:
                _write_all(out_fd, errors)
            if not data and not errors and (channel.eof_received or channel.closed):
                break
        if in_fd in readable:
            chunk = os.read(in_fd, 4096)
            if chunk:
                channel.sendall(chunk)
            else:  # stdin ended: tell the shell, keep reading its output
                channel.shutdown_write()
                watching.remove(in_fd)
        if channel.exit_status_ready() and not channel.recv_ready() \
                and not channel.recv_stderr_ready() and channel.eof_received:
            break
    return int(channel.recv_exit_status())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def run_local(argv: list[str], command: str | None, timeout: float | None) -> int | SshResult:
    """Run a provider's ``shell_command`` here: wired to this terminal for a shell (its exit
    code), captured for a command (``SshResult``; past ``timeout`` it is stopped and
    SshError raised)."""
    if command is None:
        return subprocess.call(argv)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise SshError(f"`{command}` ran longer than {timeout}s; it was stopped") from None
    return SshResult(done.returncode, done.stdout, done.stderr)
