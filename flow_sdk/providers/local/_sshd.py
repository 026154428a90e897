"""A local node's OpenSSH server: finding sshd and ssh-keygen, the keys (the task's client
key, a host key per node, pinned at launch) and the node's ``sshd_config``.

The node's keeper (``_keeper.py``) runs sshd on the node's own loopback address; every session
runs ``_session.py`` as sshd's ``ForceCommand``.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flow_sdk.system import procs
from flow_sdk.providers.local import _session

SSHD_SEARCH = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd", "/usr/bin/sshd")


def sshd_install_hint() -> str:
    """How to get an OpenSSH server onto this machine."""
    return ("install the OpenSSH server: `sudo apt-get install openssh-server` (Debian, "
            "Ubuntu), `sudo dnf install openssh-server` (Fedora, RHEL), or run "
            "`bash scripts/setup.sh --dev` in a flow-sdk checkout; then launch the task again "
            "(or point provider_config['sshd'] at the sshd binary)")


def find_sshd(configured: str | None = None) -> str | None:
    """The absolute path of the sshd binary: ``configured`` when given (None if it is not an
    executable file), else the first of PATH and the usual places."""
    candidates = [configured] if configured else [shutil.which("sshd"), *SSHD_SEARCH]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def find_keygen(sshd: str) -> str | None:
    """``ssh-keygen`` from PATH, else next to sshd's prefix (``/usr/sbin/sshd`` -> ``/usr/bin``)."""
    found = shutil.which("ssh-keygen")
    if found:
        return os.path.abspath(found)
    prefix = Path(sshd).resolve().parent.parent
    for folder in ("bin", "sbin"):
        path = prefix / folder / "ssh-keygen"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def generate_keys(keygen: str, paths: Sequence[Path], comment: str) -> list[str]:
    """Write one ed25519 key pair per path (private key mode 0600, public key at ``.pub``),
    running the ``ssh-keygen`` calls side by side. Returns each public key as
    ``"ssh-ed25519 AAAA..."`` (type and data, no comment)."""
    procs = [subprocess.Popen([keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment,
                               "-f", str(path)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for path in paths]
    keys = []
    for path, proc in zip(paths, procs):
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired as exc:
            for other in procs:
                other.kill()
                other.wait()
            raise OSError(f"ssh-keygen did not finish within 60s for {path}") from exc
        if proc.returncode != 0:
            raise OSError(f"ssh-keygen failed for {path}: {out.decode(errors='replace').strip()}")
        os.chmod(path, 0o600)
        kind, data = Path(f"{path}.pub").read_text().split()[:2]
        keys.append(f"{kind} {data}")
    return keys


def strict_modes_safe(path: Path, uid: int | None = None) -> bool:
    """True when sshd's ``StrictModes`` would accept ``path``: it and every directory above
    it (up to the user's home or ``/``) belong to root or the user and are not writable by
    group or others (what OpenSSH's ``safe_path`` checks)."""
    uid = os.getuid() if uid is None else uid
    home = pwd.getpwuid(uid).pw_dir
    current = Path(path).resolve()
    while True:
        info = current.stat()
        if (info.st_uid not in (0, uid)) or (info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            return False
        if str(current) == home or current.parent == current:
            return True
        current = current.parent


def _config_value(value: str) -> str:
    return f'"{value}"' if any(c.isspace() for c in value) else value


@dataclass(frozen=True)
class NodeSsh:
    """The files of one node's OpenSSH server, all under ``ssh_dir`` (mode 0700)."""

    ssh_dir: Path
    address: str
    port: int
    user: str

    @property
    def host_key(self) -> Path:
        return self.ssh_dir / "host_ed25519"

    @property
    def config(self) -> Path:
        return self.ssh_dir / "sshd_config"

    @property
    def authorized_keys(self) -> Path:
        return self.ssh_dir / "authorized_keys"

    def sshd_argv(self, sshd: str) -> list[str]:
        return [sshd, "-D", "-e", "-f", str(self.config)]

    def write(self, *, client_public_key: str, python: str, session: dict[str, object]) -> None:
        """Write ``authorized_keys``, the session settings and ``sshd_config``."""
        self.authorized_keys.write_text(client_public_key + " flow-sdk-client\n")
        os.chmod(self.authorized_keys, 0o600)
        (self.ssh_dir / _session.SESSION_FILE).write_text(json.dumps(session))
        os.chmod(self.ssh_dir / _session.SESSION_FILE, 0o600)
        force = " ".join(shlex.quote(part) for part in _session.command(python, self.ssh_dir))
        strict = "yes" if strict_modes_safe(self.authorized_keys) else "no"
        lines = [
            "# flow-sdk: the OpenSSH server of one local node (written at launch)",
            f"ListenAddress {self.address}:{self.port}",
            f"HostKey {_config_value(str(self.host_key))}",
            f"PidFile {_config_value(str(self.ssh_dir / 'sshd.pid'))}",
            f"AuthorizedKeysFile {_config_value(str(self.authorized_keys))}",
            f"AllowUsers {self.user}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "PermitUserEnvironment no",
            "UsePAM no",
            # The key files are 0600 in a 0700 directory; the directories above them (such as
            # a temporary FLOW_HOME under /tmp) may be writable by others, which StrictModes
            # rejects, so it is on only where the whole path is safe.
            f"StrictModes {strict}",
            "X11Forwarding no",
            "PrintMotd no",
            "UseDNS no",
            "LogLevel INFO",
            f"ForceCommand {force}",
        ]
        self.config.write_text("\n".join(lines) + "\n")


def check_config(sshd: str, config: Path) -> str | None:
    """Test the config with ``sshd -t``; create a missing privilege-separation directory
    when running as root. Returns None when sshd accepts it, else sshd's complaint."""
    message = ""
    for _ in range(2):
        try:
            proc = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True,
                                  text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return f"`{sshd} -t` did not answer within 30s"
        if proc.returncode == 0:
            return None
        message = (proc.stderr or proc.stdout).strip()
        marker = "Missing privilege separation directory:"
        if marker in message and os.geteuid() == 0:
            folder = message.split(marker, 1)[1].split()[0]
            os.makedirs(folder, mode=0o755, exist_ok=True)
            continue
        return message
    return message


# -- a task's servers ----------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSsh:
    """What every node of a task needs to run its OpenSSH server."""

    sshd: str
    keygen: str
    key_path: Path  # the client's private key (0600); the public key is beside it
    public_key: str
    user: str


@dataclass(frozen=True)
class NodeServer:
    """One node's sshd files, its task's SSH settings and the node's pinned host key."""

    node: NodeSsh
    task: TaskSsh
    host_key: str


def task_ssh(folder: Path, task_id: str, *, enabled: bool, sshd: str | None) -> TaskSsh | str:
    """The task's SSH settings (its client key made in ``folder`` on first use), or why nodes
    of this task run without SSH. ``sshd`` is the configured binary (None: search)."""
    if not enabled:
        return "SSH is off for this provider (provider_config ssh=False)"
    found = find_sshd(sshd)
    if found is None:
        where = f" at {sshd}" if sshd else ""
        return f"no OpenSSH server (sshd) was found on this machine{where}; {sshd_install_hint()}"
    keygen = find_keygen(found)
    if keygen is None:
        return ("no ssh-keygen was found to make the node's host key; install the OpenSSH "
                "client (`sudo apt-get install openssh-client`) and launch again")
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    key_path = folder / "client_ed25519"
    if key_path.exists():
        kind, data = Path(f"{key_path}.pub").read_text().split()[:2]
        public_key = f"{kind} {data}"
    else:
        public_key = generate_keys(keygen, [key_path], f"flow-client-{task_id}")[0]
    return TaskSsh(found, keygen, key_path, public_key, pwd.getpwuid(os.getuid()).pw_name)


def prepare_nodes(settings: TaskSsh | str, task_id: str, folders: Sequence[Path],
                  addresses: Sequence[str]) -> list[NodeServer | str]:
    """Per node (its SSH folder and address): its server, or why it runs without SSH. Host
    keys are made side by side."""
    if isinstance(settings, str):
        return [settings] * len(folders)
    nodes = []
    for folder, address in zip(folders, addresses):
        folder.mkdir(parents=True)
        os.chmod(folder, 0o700)
        nodes.append(NodeSsh(folder, address, procs.free_port(address), settings.user))
    host_keys = generate_keys(settings.keygen, [n.host_key for n in nodes],
                              f"flow-node-{task_id}")
    return [NodeServer(node, settings, key) for node, key in zip(nodes, host_keys)]


def configure(server: NodeServer | str, *, python: str, session: dict[str, object],
              accepted: set[str]) -> tuple[list[str], dict[str, Any]]:
    """Write the node's sshd files; returns sshd's command line (empty: no sshd) and the
    instance record's fields: ``ssh`` (the endpoint) or ``ssh_unavailable`` (why not).
    ``accepted`` holds the sshd binaries that took a node config already (every node's
    config has the same shape, so each binary checks one)."""
    if isinstance(server, str):
        return [], {"ssh_unavailable": server}
    node, settings = server.node, server.task
    node.write(client_public_key=settings.public_key, python=python, session=session)
    problem = None if settings.sshd in accepted else check_config(settings.sshd, node.config)
    if problem is not None:
        return [], {"ssh_unavailable": f"sshd rejected the node's configuration: {problem}"}
    accepted.add(settings.sshd)
    return node.sshd_argv(settings.sshd), {"ssh": {
        "host": node.address, "port": node.port, "user": settings.user,
        "host_key": server.host_key, "key_path": str(settings.key_path)}}
