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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flow_sdk.providers.local._sshd import find_sshd, generate_keys
from flow_sdk.system import procs

NAME = "flow-login"
UP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LoginNode:
    name: str  # the Host of ``ssh_config``
    ssh_config: Path
    pid: int  # its sshd


@contextmanager
def running(root: Path, slurm_conf: Path) -> Iterator[LoginNode]:
    """The login node's sshd, its keys and configs under ``root``, until the block ends."""
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
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        f"SetEnv SLURM_CONF={slurm_conf}", ""]))
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_public}\n")
    config = root / "ssh_config"
    config.write_text("\n".join([
        f"Host {NAME}", "  HostName 127.0.0.1", f"  Port {port}", "  User root",
        f"  IdentityFile {user_key}", "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {root / 'known_hosts'}", "  StrictHostKeyChecking yes", ""]))
    with open(root / "sshd.log", "wb") as log:
        server = subprocess.Popen([sshd, "-D", "-e", "-f", str(root / "sshd_config")],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", NAME, "true"],
                             capture_output=True, timeout=30, check=False).returncode != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the login node's sshd did not answer; see {root}/sshd.log")
            time.sleep(0.1)
        yield LoginNode(NAME, config, server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
