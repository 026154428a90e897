"""A login node for a test Slurm cluster: a real OpenSSH server on loopback whose sessions
reach the cluster (``SetEnv SLURM_CONF``, as a login node's shell has the site's
configuration), with a key of its own and a client config that names it ``flow-login``
(``ssh -F CONFIG flow-login``). Used by the Slurm login tests and ``bench/slurm.py``;
``running`` stops the server by PID.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from flow_sdk.providers.local._sshd import find_sshd, generate_keys
from flow_sdk.system import procs

NAME = "flow-login"
JUMPED = "flow-login-jumped"  # the same login node, reached through a jump host
UP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LoginNode:
    name: str  # the Host of ``ssh_config``
    ssh_config: Path
    pid: int  # its sshd
    jump_log: Path | None = None  # the jump host's sshd log, with ``jump``


@dataclass(frozen=True)
class _Server:
    port: int
    user_key: Path
    known_hosts: Path
    log: Path
    process: subprocess.Popen[bytes]


def _host_block(name: str, server: _Server, *extra: str) -> list[str]:
    return [f"Host {name}", "  HostName 127.0.0.1", f"  Port {server.port}", "  User root",
            f"  IdentityFile {server.user_key}", "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {server.known_hosts}", "  StrictHostKeyChecking yes",
            *extra]


@contextmanager
def _sshd(root: Path, *settings: str) -> Iterator[_Server]:
    """An OpenSSH server on loopback with keys of its own under ``root`` (its log:
    ``root/sshd.log``), until the block ends."""
    root.mkdir(parents=True, exist_ok=True)
    sshd = find_sshd()
    if sshd is None:
        raise RuntimeError("no OpenSSH server: run `bash scripts/setup.sh --dev`")
    host_key, user_key = root / "host_key", root / "user_key"
    host_public, user_public = generate_keys("ssh-keygen", [host_key, user_key], "flow-test")
    (root / "authorized_keys").write_text(user_public + "\n")
    port = procs.free_port()
    (root / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
        f"PidFile {root / 'sshd.pid'}", f"AuthorizedKeysFile {root / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", *settings, ""]))
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_public}\n")
    with open(root / "sshd.log", "wb") as log:
        process = subprocess.Popen([sshd, "-D", "-e", "-f", str(root / "sshd_config")],
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        yield _Server(port, user_key, root / "known_hosts", root / "sshd.log", process)
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answering(config: Path, name: str, server: _Server) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", name, "true"],
                         capture_output=True, timeout=30, check=False).returncode != 0:
        if time.monotonic() > deadline or server.process.poll() is not None:
            raise RuntimeError(f"{name}'s sshd did not answer; see {server.log}")
        time.sleep(0.1)


@contextmanager
def running(root: Path, slurm_conf: Path, *, jump: bool = False) -> Iterator[LoginNode]:
    """The login node's sshd, its keys and configs under ``root``, until the block ends. With
    ``jump``, the client config also names it ``flow-login-jumped``: reached through a jump
    host (``ProxyJump``, another sshd under ``root/jump``, which logs each connection)."""
    with _sshd(root, f"SetEnv SLURM_CONF={slurm_conf}") as login, ExitStack() as jumps:
        via = jumps.enter_context(_sshd(root / "jump")) if jump else None
        lines = _host_block(NAME, login)
        if via is not None:
            lines += _host_block("flow-jump", via) + _host_block(
                JUMPED, login, "  ProxyJump flow-jump")
        config = root / "ssh_config"
        config.write_text("\n".join([*lines, ""]))
        _answering(config, NAME, login)
        if via is not None:
            _answering(config, JUMPED, via)
        yield LoginNode(NAME, config, login.process.pid, via.log if via is not None else None)
