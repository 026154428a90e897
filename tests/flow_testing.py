"""Helpers shared by the test modules (importable as ``flow_testing``)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flow_sdk.system import procs
from flow_sdk.system.procs import pids_with_env
from flow_sdk.providers.local import LocalProvider


def files_longest_first(names: Sequence[str], seconds: dict[str, float]) -> list[str]:
    """``names`` (test ids) grouped by file, each file's tests in their own order, the files
    longest first by the sum of their tests' ``seconds`` (0 for a name it lacks; ties keep
    their order): the suite's order for ``--dist loadfile --no-loadscope-reorder``, which
    hands a runner one whole file at a time, in this order, whenever it runs dry. A file's
    tests thus run one after another in one runner, and its module-scoped fixtures (a live
    task, a browser, a moto server) are set up once."""
    files: dict[str, list[str]] = {}
    for name in names:
        files.setdefault(name.split("::", 1)[0], []).append(name)
    total = {file: sum(seconds.get(name, 0.0) for name in tests) for file, tests in files.items()}
    return [name for file in sorted(files, key=total.__getitem__, reverse=True)
            for name in files[file]]


def merged_durations(listed: dict[str, float], timed: dict[str, float]) -> dict[str, float]:
    """A durations file after a run: the seconds ``timed`` in place of what ``listed`` said of
    those tests, rounded to 0.1 s, sorted by name, and only tests of at least a second."""
    seconds = {**listed, **{name: round(s, 1) for name, s in timed.items()}}
    return {name: s for name, s in sorted(seconds.items()) if s >= 1.0}


def listed_node_ids(text: str) -> list[str]:
    """The test ids a list file names: one per line; blank lines and "#" comments left out."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def unknown_node_ids(listed: Sequence[str], collected: Sequence[str],
                     narrowed: Collection[str] = ()) -> list[str]:
    """The ids of ``listed`` that name no test of ``collected``, among the listed ids whose
    file was collected whole (a run of some files checks the lines of those files only; a
    file in ``narrowed``, named as ``FILE::TEST``, had only some of its tests collected)."""
    files = {nodeid.split("::", 1)[0] for nodeid in collected} - set(narrowed)
    known = set(collected)
    return [nodeid for nodeid in listed
            if nodeid.split("::", 1)[0] in files and nodeid not in known]


# Each test that ``extended.txt`` lists and this runner collected, and whether it is marked
# ``slow``: ``tests/conftest.py`` keeps it in ``config.stash``, ``test_suite_order.py`` reads it.
TIER_LISTED = pytest.StashKey[dict[str, bool]]()


def processes_with_env(key: str, value: str) -> list[int]:
    """PIDs of live processes (other than this one) whose environment has ``key=value``."""
    return pids_with_env(key, [value])


def process_traces(pid: int, file_bytes: int = 1 << 20) -> str:
    """What another process could read of ``pid``: its environment, command line, the names
    of its open files and the first ``file_bytes`` of each open regular file."""
    proc = Path(f"/proc/{pid}")
    try:
        seen = [(proc / "environ").read_bytes().decode(errors="replace"),
                (proc / "cmdline").read_bytes().decode(errors="replace")]
        fds = list((proc / "fd").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return ""  # the process is gone
    for fd in fds:
        try:
            seen.append(os.readlink(fd))
            if fd.is_file():
                with open(fd, "rb") as opened:
                    seen.append(opened.read(file_bytes).decode(errors="replace"))
        except FileNotFoundError:
            continue  # closed meanwhile
    return "\n".join(seen)


def fake_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials and no real AWS configuration in this process's environment (local
    nodes inherit it), so nothing can reach a real account."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


# torch's C++ side logs a warning as "[W1204 17:53:45.408788061 socket.cpp:207] ...".
_CPP_WARNING = re.compile(r"\[W\d{4} \d\d:\d\d:\d\d")
_UNNAMED_CLIENT = "The hostname of the client socket cannot be retrieved"


def loopback_names_resolve() -> bool:
    """Whether a reverse lookup of a loopback address like a local node's answers (a name, or
    the number itself). Where no name server can be reached it fails with EAI_AGAIN, and
    torch's TCP store then warns, once per connection, that it cannot name the client."""
    try:
        socket.getnameinfo(("127.42.0.3", 0), socket.NI_NUMERICSERV)
    except socket.gaierror:
        return False
    return True


def warning_lines(output: str) -> list[str]:
    """The lines of a job's output that warn: Python's warnings and torch's C++ ones, except
    the TCP store's unnamed client where this machine has no name server (not the job's
    flaw)."""
    lines = [line for line in output.splitlines()
             if "warn" in line.lower() or _CPP_WARNING.search(line)]
    if lines and not loopback_names_resolve():
        lines = [line for line in lines if _UNNAMED_CLIENT not in line]
    return lines


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def run_on_terminal(argv: list[str], timeout: float = 120,
                    answers: Sequence[tuple[bytes, bytes]] = ()) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as its stdin, stdout and stderr (as a user's shell
    would); returns (exit code, everything it wrote). ``answers``: (prompt, reply) pairs in
    order: each reply is typed once its prompt has appeared (an empty prompt: at once)."""
    import os
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        os.execvp(argv[0], argv)
    output = b""
    pending = list(answers)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while pending and pending[0][0] in output:
                os.write(fd, pending.pop(0)[1])
            ready, _, _ = select.select([fd], [], [], 0.2)
            if fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal closed: the command exited
                    break
                if not chunk:
                    break
                output += chunk
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto server over HTTP on 127.0.0.1 (a free port); yields its URL."""
    from moto.server import ThreadedMotoServer

    from flow_sdk.sim._gaps import list_services_once

    list_services_once()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def results_or_cancel(task: Any, timeout: float) -> list[Any]:
    """Every rank's result; a task still running when that fails (a timeout, an error) is
    cancelled, so no test leaves its nodes behind."""
    try:
        return list(task.results(timeout=timeout))
    finally:
        if not task.status.is_terminal:
            task.cancel()


# -- the local provider's nodes, as its records on disk describe them -------------------------


def local_node(provider: LocalProvider, task_id: str, instance_id: str) -> dict[str, Any]:
    """The record the local provider wrote when it started the node (pids, workdir, ssh)."""
    path = provider.root / "instances" / task_id / f"{instance_id}.json"
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def agent_pid(provider: LocalProvider, task_id: str, instance_id: str) -> int:
    return int(local_node(provider, task_id, instance_id)["pid"])


def node_workdir(provider: LocalProvider, task_id: str, instance_id: str) -> Path:
    """The node's working directory (where its workers and SSH sessions start)."""
    return Path(local_node(provider, task_id, instance_id)["workdir"])


def worker_pids(provider: LocalProvider, task_id: str, instance_id: str) -> list[int]:
    """PIDs of the node's worker processes, once its agent started them."""
    pids = node_workdir(provider, task_id, instance_id) / procs.WORKER_PGIDS_FILE
    return [int(p) for p in pids.read_text().split()] if pids.exists() else []


def node_ssh_dir(provider: LocalProvider, task_id: str, instance_id: str) -> Path:
    """The node's sshd files: host key, ``sshd_config``, ``authorized_keys``, ``sshd.pid``."""
    return provider.root / "ssh" / task_id / instance_id
