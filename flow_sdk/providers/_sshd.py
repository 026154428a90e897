"""What runs beside every local node: its OpenSSH server and its boot-output stream.

The local provider starts one *keeper* process per node (``python -I -S _sshd.py keep ...``,
standard library only, so it starts in milliseconds and no broken package on the node can stop
it). The keeper:

* reads the node agent's stdout and stderr (a pipe) and appends every line, time-stamped as it
  arrives, to the node's ``boot.<instance id>`` log stream (the FileLogStore line format), so a
  node that dies before user code can still be debugged through ``task.logs(source="boot")``;
* runs the node's ``sshd -D -e`` as its child (its log lines go to the same stream, prefixed
  ``sshd:``), listening on the node's own loopback address with a host key made for that node;
* when the agent exits (end of the pipe) stops sshd and every process still carrying the node's
  ``FLOW_INSTANCE_ID`` (SSH sessions, anything a worker left behind), then exits itself.

SSH sessions run ``python -I -S _sshd.py session <ssh dir>`` as sshd's ``ForceCommand``: it
changes to the node's working directory, sets the node's environment (the agent's, plus the
node's rank variables read from the node records the agent publishes in the store, plus the
task's ``environment``) and runs the requested command, or an interactive shell, in the user's
shell.

Only the standard library may be imported here: the keeper and the session wrapper run this
file by path, without site-packages.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

SSHD_SEARCH = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd", "/usr/bin/sshd")
INSTANCE_ENV = "FLOW_INSTANCE_ID"  # every process of a local node carries its instance id
SESSION_FILE = "session.json"
# Variables an SSH session keeps from sshd rather than taking the node's value.
_SESSION_KEEP = ("TERM", "USER", "LOGNAME", "MAIL")
_PR_SET_PDEATHSIG = 1


def install_hint() -> str:
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
        (self.ssh_dir / SESSION_FILE).write_text(json.dumps(session))
        os.chmod(self.ssh_dir / SESSION_FILE, 0o600)
        force = " ".join(shlex.quote(part) for part in
                         (python, "-I", "-S", str(Path(__file__).resolve()), "session",
                          str(self.ssh_dir)))
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


# -- processes --------------------------------------------------------------------------------


def pids_with_env(key: str, values: Collection[str]) -> list[int]:
    """PIDs of live processes (not this one) whose environment sets ``key`` to one of
    ``values`` (Linux ``/proc``; empty elsewhere)."""
    needles = {f"{key}={value}".encode() for value in values}
    found: list[int] = []
    proc_root = Path("/proc")
    if not needles or not proc_root.is_dir():
        return found
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state not in ("Z", "X") and not needles.isdisjoint(environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def stop_pids(pids: Sequence[int], grace_s: float = 2.0) -> list[int]:
    """SIGTERM each process, SIGKILL those left after ``grace_s``; returns those signalled."""
    signalled = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        signalled.append(pid)
    deadline = time.monotonic() + grace_s
    alive = list(signalled)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if _running(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return signalled


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def stop_node_processes(instance_ids: Collection[str]) -> list[int]:
    """Stop every process that carries one of these nodes' instance ids; returns their PIDs."""
    return stop_pids(pids_with_env(INSTANCE_ENV, instance_ids))


def _die_with_parent() -> None:
    """In the child before exec: Linux sends SIGKILL when the keeper that started it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# -- the keeper -------------------------------------------------------------------------------


class _StreamFile:
    """Appends ``<epoch seconds>\\t<text>`` lines (the FileLogStore format), one write per batch."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the user's alone
        self._fh = os.fdopen(fd, "ab", buffering=0)  # closed by close()
        self._partial: dict[str, bytes] = {}

    def feed(self, source: str, chunk: bytes, prefix: str = "") -> None:
        data = self._partial.pop(source, b"") + chunk
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[source] = rest
        self._write(lines, prefix)

    def finish(self, source: str, prefix: str = "") -> None:
        rest = self._partial.pop(source, b"")
        if rest:
            self._write([rest], prefix)

    def _write(self, lines: list[bytes], prefix: str) -> None:
        if not lines:
            return
        now = f"{time.time():.6f}"
        text = "".join(f"{now}\t{prefix}{raw.decode('utf-8', errors='replace').rstrip(chr(13))}\n"
                       for raw in lines)
        self._fh.write(text.encode("utf-8", errors="replace"))

    def note(self, message: str) -> None:
        self._write([message.encode()], "flow-keeper: ")

    def close(self) -> None:
        self._fh.close()


def keep(stream_path: Path, instance_id: str, sshd_argv: Sequence[str]) -> int:
    """Copy stdin (the agent's output) to the boot stream and run sshd until stdin ends;
    then stop sshd and everything else of the node."""
    out = _StreamFile(stream_path)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "node")
    sshd: subprocess.Popen[bytes] | None = None
    if sshd_argv:
        read_end, write_end = os.pipe()
        try:
            sshd = subprocess.Popen(list(sshd_argv), stdin=subprocess.DEVNULL, stdout=write_end,
                                    stderr=write_end,
                                    preexec_fn=_die_with_parent)  # the keeper has no threads
        except OSError as exc:
            out.note(f"could not start sshd ({' '.join(sshd_argv)}): {exc}")
            os.close(read_end)
        else:
            selector.register(read_end, selectors.EVENT_READ, "sshd")
        finally:
            os.close(write_end)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        _pump(selector, out, until="node", deadline=None)
    except Exception as exc:  # the keeper's stderr goes nowhere: its own failure goes here
        for line in "".join(traceback.format_exception(exc)).splitlines():
            out.note(line)
        code = 70
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish cleaning up (SIGKILL still ends it)
        if sshd is not None and sshd.poll() is None:
            sshd.terminate()
            try:
                sshd.wait(2.0)
            except subprocess.TimeoutExpired:
                sshd.kill()
                sshd.wait()
        left = stop_node_processes([instance_id])  # SSH sessions, leftovers of the workers
        _pump(selector, out, until="sshd", deadline=time.monotonic() + 1.0)
        out.finish("node")
        out.finish("sshd", "sshd: ")
        if left:
            out.note(f"stopped {len(left)} process(es) the node left behind: {left}")
        out.close()
    return code


def _pump(selector: selectors.BaseSelector, out: _StreamFile, *, until: str,
          deadline: float | None) -> None:
    """Copy from the registered pipes until ``until`` ends (or ``deadline`` passes)."""
    while any(key.data == until for key in selector.get_map().values()):
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return
        for key, _ in selector.select(timeout):
            chunk = os.read(key.fd, 65536)
            prefix = "sshd: " if key.data == "sshd" else ""
            if chunk:
                out.feed(key.data, chunk, prefix)
            else:
                selector.unregister(key.fd)
                os.close(key.fd)


# -- an SSH session ---------------------------------------------------------------------------


def session_env(settings: dict[str, object], login_env: dict[str, str]) -> dict[str, str]:
    """The environment of an SSH session on a node: the node agent's environment, the
    session variables sshd set (``SSH_*``, ``TERM``, ...), the node's ``FLOW_*`` rank
    variables from the node records in the store, then the task's ``environment``."""
    env = {str(k): str(v) for k, v in dict(settings["env"]).items()}  # type: ignore[call-overload]
    env.update({k: v for k, v in login_env.items() if k.startswith("SSH_") or k in _SESSION_KEEP})
    instance_id = str(settings["instance_id"])
    records = []
    nodes_dir = Path(str(settings["nodes_dir"]))
    if nodes_dir.is_dir():
        for path in sorted(nodes_dir.glob("*.json")):
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # a record being replaced right now; the others still count
    mine = [r for r in records if r.get("instance_id") == instance_id]
    if mine:
        leader = [r for r in records if r.get("node") == 0]
        env["FLOW_TASK_ID"] = str(settings["task_id"])
        env["FLOW_NODE_RANK"] = str(mine[0]["node"])
        env["FLOW_NUM_NODES"] = str(len(records))
        if leader:
            env["FLOW_MAIN_IP"] = str(leader[0]["address"])
    task_file = Path(str(settings["task_file"]))
    if task_file.is_file():
        spec = json.loads(task_file.read_text()).get("spec", {})
        env.update({str(k): str(v) for k, v in (spec.get("environment") or {}).items()})
    return env


def session(ssh_dir: Path) -> NoReturn:
    """Run the SSH client's command (or a shell) in the node's directory and environment."""
    settings = json.loads((ssh_dir / SESSION_FILE).read_text())
    env = session_env(settings, dict(os.environ))
    workdir = str(settings["workdir"])
    try:
        os.chdir(workdir)
    except OSError as exc:
        print(f"flow: node working directory {workdir} is gone ({exc}); the node has ended",
              file=sys.stderr)
        sys.exit(1)
    shell = os.environ.get("SHELL") or pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    if command:
        argv = [shell, "-c", command]
    else:
        argv = [shell, "-i"] if os.isatty(0) else [shell]
    os.execve(shell, argv, env)


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 3 and argv[0] == "keep":
        sshd_argv = list(argv[3:])
        if sshd_argv[:1] == ["--"]:
            sshd_argv = sshd_argv[1:]
        return keep(Path(argv[1]), argv[2], sshd_argv)
    if len(argv) == 2 and argv[0] == "session":
        session(Path(argv[1]))
    print("usage: _sshd.py keep STREAM_FILE INSTANCE_ID [-- SSHD_ARGV...] | "
          "session SSH_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
