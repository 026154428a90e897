"""The Slurm provider from another machine: ``login=`` reaches the cluster through a real
OpenSSH server on loopback standing in for its login node (the test runner's cluster behind
it). The caller's own ``SLURM_CONF`` names no cluster, so a Slurm command run here would
fail; and an audit hook shows this process never opens, lists or writes a path of
``shared_dir`` itself: every file and command goes through the one SSH connection."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flow_sdk import FlowApp
from flow_sdk.volumes import create_volume, delete_volume, list_volumes
from flow_sdk.errors import ProviderError
from flow_sdk.providers import sshhost
from flow_sdk.system import procs
from flow_sdk.wire import TaskStatus
from flow_testing import run_on_terminal, wait_until
from slurm_cluster import SlurmCluster
import slurm_login
from slurm_login import LoginNode

pytestmark = pytest.mark.slow
_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")
# what touches a path, as the interpreter's audit events name it
_FILE_EVENTS = ("open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.replace",
                "os.remove", "os.rmdir", "os.link", "os.chmod", "shutil.rmtree")
_SEEN: list[tuple[str, str]] = []
_WATCHED: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _WATCHED and event in _FILE_EVENTS and args:
        path = os.fsdecode(args[0]) if isinstance(args[0], str | bytes | os.PathLike) else ""
        if any(path.startswith(root) for root in _WATCHED):
            _SEEN.append((event, path))


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def login_node(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[LoginNode]:
    with slurm_login.running(tmp_path_factory.mktemp("login"), slurm.conf, jump=True) as node:
        yield node


@pytest.fixture
def laptop(login_node: LoginNode, slurm_clean: SlurmCluster, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowApp]:
    """A ``FlowApp`` on the cluster through the login node, from a caller whose own
    ``SLURM_CONF`` names no cluster; the audit of ``shared_dir`` armed."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-cluster-here.conf"))
    shared = tmp_path / "shared"
    app = FlowApp("slurm-login", provider="slurm", provider_config={
        "login": login_node.name, "ssh_config": str(login_node.ssh_config),
        "python": sys.executable, "shared_dir": str(shared)})
    _SEEN.clear()
    _WATCHED[:] = [str(shared)]
    try:
        yield app
    finally:
        _WATCHED.clear()
        _close(login_node)


def _close(login_node: LoginNode, name: str | None = None) -> None:
    """End this process's connection to the login node (it lasts as long as the process),
    by the name it was reached by (``name``, else its own)."""
    sshhost.connect(name or login_node.name, sys.executable, str(login_node.ssh_config)).close()


def _ranks() -> dict[str, str]:
    return {"rank": os.environ["RANK"], "node": os.environ["SLURMD_NODENAME"]}


def test_a_task_runs_from_another_machine_through_the_login_node(laptop: FlowApp) -> None:
    f = laptop.function(num_instances=2, max_run_time_hours=0.1)(_ranks)
    assert f.remote()["rank"] == "0"
    task = f.spawn()
    results = task.results(timeout=120)
    assert [r["rank"] for r in results] == ["0", "1"]
    assert len({r["node"] for r in results}) == 2
    assert _SEEN == []


def test_a_task_is_watched_and_cancelled_through_the_login_node(laptop: FlowApp) -> None:
    def chatty() -> None:
        import time
        print("step 1", flush=True)
        time.sleep(300)

    task = laptop.function(num_instances=2, max_run_time_hours=0.1)(chatty).spawn()
    wait_until(lambda: sum("step 1" in line for line in task.logs()) == 2, 120,
               "the first step's line of both nodes")
    shell = task.ssh(node=1, command="echo $SLURMD_NODENAME; pwd")
    assert shell.exit_code == 0 and shell.stdout.split()[1].endswith(
        "/" + task.instances()[1].instance_id)
    task.cancel()
    assert task.wait(timeout=60) == TaskStatus.CANCELLED
    assert _SEEN == []


def _sleeps() -> None:
    import time
    time.sleep(300)


def _flow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLOW, *args], capture_output=True, text=True, timeout=180,
                          check=False, stdin=subprocess.DEVNULL)


def test_the_flow_command_reaches_a_task_through_the_login_node(laptop: FlowApp) -> None:
    """Another process finds the task's login in its record: status, a shell on a node's
    terminal, cancel and gc, each process with a connection of its own."""
    task = laptop.function(num_instances=2, max_run_time_hours=0.1)(_sleeps).spawn()
    try:
        wait_until(lambda: task.status == TaskStatus.RUNNING, 120, "the task running")
        shown = _flow("status", task.task_id, "--json")
        assert json.loads(shown.stdout)["status"] == "RUNNING", shown.stderr
        code, typed = run_on_terminal(
            [FLOW, "ssh", task.task_id, "--node", "1"], timeout=60,
            answers=[(b"", b"echo shell-on-$SLURMD_NODENAME; exit 4\n")])
        node = task.instances()[1].instance_id
        assert code == 4 and "shell-on-n" in typed and f"/{node}# " in typed, typed
        cancelled = _flow("cancel", task.task_id)
        assert cancelled.returncode == 0, cancelled.stderr
        assert task.wait(timeout=60) == TaskStatus.CANCELLED
    finally:
        task.cancel()
    swept = _flow("gc")
    assert swept.returncode == 0, swept.stderr
    assert _SEEN == []


def _write_to(path: str) -> list[str]:
    import time
    Path(path, os.environ["RANK"]).write_text("seen")
    deadline = time.monotonic() + 60
    while len(os.listdir(path)) < 2 and time.monotonic() < deadline:  # the other node's
        time.sleep(0.1)
    return sorted(os.listdir(path))


def test_volumes_are_made_listed_and_deleted_through_the_login_node(laptop: FlowApp) -> None:
    config = laptop.provider().config()
    assert create_volume("ckpt", 10, provider="slurm", provider_config=config).name == "ckpt"
    f = laptop.function(num_instances=2, max_run_time_hours=0.1, volumes={"/ckpt": "ckpt"})(
        _write_to)
    assert f.remote("/ckpt") == ["0", "1"]
    [listed] = list_volumes(provider="slurm", provider_config=config)
    assert (listed.name, listed.interface, listed.size_gb) == ("ckpt", "file", 10)
    assert listed.in_use_by == ()
    assert delete_volume("ckpt", provider="slurm", provider_config=config)
    assert list_volumes(provider="slurm", provider_config=config) == []
    assert _SEEN == []


def test_a_login_node_behind_a_jump_host_is_reached_through_it(
        login_node: LoginNode, slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    """The user's SSH config says ``ProxyJump``: the partition check, the submit and the
    result all go through the jump host, whose sshd logs the connection."""
    assert login_node.jump_log is not None
    accepted = "Accepted publickey for root"
    before = login_node.jump_log.read_text().count(accepted)
    app = FlowApp("slurm-login", provider="slurm", provider_config={
        "login": slurm_login.JUMPED, "ssh_config": str(login_node.ssh_config),
        "python": sys.executable, "shared_dir": str(tmp_path / "shared")})
    try:
        assert app.function(max_run_time_hours=0.1)(_ranks).remote()["rank"] == "0"
    finally:
        _close(login_node, slurm_login.JUMPED)
    assert login_node.jump_log.read_text().count(accepted) > before


def test_an_unreachable_login_node_is_named_before_anything_is_submitted(
        login_node: LoginNode, slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(login_node.ssh_config.read_text().replace(
        "Port ", f"Port {procs.free_port()}\n  # was Port "))
    app = FlowApp("slurm-login", provider="slurm", provider_config={
        "login": login_node.name, "ssh_config": str(config), "python": sys.executable,
        "shared_dir": str(tmp_path / "shared")})
    with pytest.raises(ProviderError, match=r"ssh flow-login: .*Connection refused.*check "
                                            r"that `ssh flow-login .* -V` works"):
        app.function(num_instances=2, max_run_time_hours=0.1)(_ranks)  # checks the partition
    assert slurm_clean.jobs_left(within_s=1) == ""
    assert not (tmp_path / "shared").exists()


def test_the_nodes_get_the_config_without_the_login(
        login_node: LoginNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flow_sdk.providers.slurm import SlurmProvider

    monkeypatch.setenv("HOME", str(tmp_path))  # this machine's home is not the login node's
    provider = SlurmProvider.from_config({
        "login": login_node.name, "ssh_config": str(login_node.ssh_config),
        "python": sys.executable})
    try:  # ~ is the home of the login node's user, as its sshd sets it
        assert provider.root == Path(pwd.getpwuid(os.getuid()).pw_dir) / ".flow-slurm"
        assert provider.root != Path.home() / ".flow-slurm"
        assert provider.config()["login"] == "flow-login"
        assert json.dumps(provider.node_config()).count("login") == 0
    finally:
        _close(login_node)
