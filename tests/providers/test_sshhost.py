"""``SshHost``'s own connection handling, with a stand-in ``ssh`` first on ``PATH`` that runs
the remote command here after printing a login banner (as a site's start-up files may):
the banner is passed over, a call cut short ends the connection instead of leaving its
answer for the next call, and a forked child gets a connection of its own. The Slurm login
tests run the same class over a real OpenSSH server."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flow_sdk.providers.sshhost import SshHost, SshHostError

FAKE_SSH = """#!/bin/sh
echo "Welcome to the login node"
echo "$@" >> "$(dirname "$0")/calls"
for last; do :; done
exec sh -c "$last"
"""


def _ssh_first_on_path(script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(script)
    (bin_dir / "ssh").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    _ssh_first_on_path(FAKE_SSH, tmp_path, monkeypatch)
    connected = SshHost("me@login", sys.executable)
    yield connected
    connected.close()


class _CutShort:
    """A pipe whose next ``readline`` is interrupted, as Ctrl-C would."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def readline(self) -> bytes:
        raise KeyboardInterrupt

    def close(self) -> None:
        self.pipe.close()


def test_a_banner_is_passed_over_and_a_call_cut_short_ends_the_connection(
        host: Any, tmp_path: Path) -> None:
    assert host.kind(str(tmp_path)) == "dir"
    first = host._proc
    first.stdout = _CutShort(first.stdout)
    with pytest.raises(KeyboardInterrupt):
        host.write(str(tmp_path / "f"), b"data")
    assert host._proc is None and first.poll() is not None  # its answer goes with it
    assert host.read(str(tmp_path / "f")) == b"data"  # the right answer to the next call
    assert host.names(str(tmp_path)) == ["bin", "f"]
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert len(calls) == 2 and all("ControlMaster=yes" in call for call in calls)
    shell = host.command(["squeue", "--me"])
    assert shell[-2:] == ["me@login", "squeue --me"] and "ControlMaster=no" in shell
    master = next(o for o in calls[-1].split() if o.startswith("ControlPath="))
    assert master in shell  # a shell rides on this process's connection


def test_a_forked_child_opens_its_own_connection(host: Any, tmp_path: Path) -> None:
    assert host.home() == str(Path.home())
    parent = host._proc
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's connection is not its to use
        ok = host._proc is None and host.kind(str(tmp_path)) == "dir"
        os.write(write, b"1" if ok and host._proc is not parent else b"0")
        host.close()
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert host._proc is parent and host.kind(str(tmp_path / "bin")) == "dir"


REFUSED_SSH = """#!/bin/sh
echo "ssh: connect to host login port 22: Connection refused" >&2
exit 255
"""


def test_a_refused_connection_is_one_error_naming_what_ssh_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _ssh_first_on_path(REFUSED_SSH, tmp_path, monkeypatch)
    refused = SshHost("me@login", sys.executable)
    with pytest.raises(SshHostError, match=r"^ssh me@login: the connection ended: ssh: connect "
                                           r"to host login port 22: Connection refused; check"):
        refused.kind(str(tmp_path))
    assert refused._proc is None


def test_closing_a_connection_whose_ssh_left_a_request_unread_raises_nothing() -> None:
    """As when ``ssh`` exits (a refused connection) before the request it was sent is
    flushed: the bytes still buffered for it have no reader, and closing drops them."""
    host = SshHost("me@login", sys.executable)
    gone = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    gone.wait()
    assert gone.stdin is not None
    gone.stdin.write(b"a request line\n")  # buffered, never flushed: nobody reads it
    host._proc = gone
    host.close()
    assert host._proc is None and gone.stdin.closed and gone.stdout is not None \
        and gone.stdout.closed
