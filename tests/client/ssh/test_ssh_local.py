"""SSH to local nodes: a real OpenSSH server per node on its own loopback address, host keys
pinned at launch, sessions in the node's directory and environment, stopped with the task."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from flow_testing import node_ssh_dir, node_workdir, processes_with_env, wait_until

from flow_sdk import FlowApp, Task, TaskStatus
from flow_sdk.providers.local import _sshd
from flow_sdk.providers.local import LocalProvider
from flow_sdk.errors import HostKeyMismatchError, SshError, SshUnavailableError
from flow_sdk.client.ssh import SshResult, fingerprint

pytestmark = pytest.mark.slow

app = FlowApp("ssh-tests")


@app.function(num_instances=2, environment={"USER_MARK": "from-spec"})
def hold() -> None:
    import time
    print("holding", flush=True)
    time.sleep(300)


@pytest.fixture(scope="module", autouse=True)
def _sshd_installed() -> None:
    if _sshd.find_sshd() is None:
        pytest.fail("these tests need an OpenSSH server: " + _sshd.sshd_install_hint())


def _running(task: Task) -> LocalProvider:
    wait_until(lambda: len(task.nodes()) == 2 and all(n.phase == "running" for n in task.nodes()),
               60, "both nodes to run")
    provider = task.provider
    assert isinstance(provider, LocalProvider)
    return provider


def _instance(task: Task, node: int) -> str:
    return next(n.instance_id for n in task.nodes() if n.node == node)


def test_ssh_command_answers_from_node_1_in_its_directory_and_environment(
        flow_home: Path) -> None:
    task = hold.spawn()
    provider = _running(task)
    result = task.ssh(node=1, command="pwd; echo $FLOW_NODE_RANK")
    workdir = node_workdir(provider, task.task_id, _instance(task, 1))
    assert result == SshResult(0, f"{workdir}\n1\n", "")

    # the rest of the node's environment, stderr and the exit code come back too
    code, out, err = task.ssh(node=1, command="echo $FLOW_NUM_NODES $FLOW_TASK_ID $USER_MARK "
                              "$FLOW_MAIN_IP; echo to-stderr >&2; exit 7")
    leader = next(n.address for n in task.nodes() if n.node == 0)
    assert (code, out, err) == (7, f"2 {task.task_id} from-spec {leader}\n", "to-stderr\n")
    assert task.ssh(node=0, command="echo $FLOW_NODE_RANK").stdout == "0\n"

    # each node has its own server on its own loopback address; keys pinned at launch
    endpoints = [task.ssh_endpoint(n) for n in (0, 1)]
    for n, endpoint in enumerate(endpoints):
        instance = _instance(task, n)
        assert endpoint.host == next(r.address for r in task.nodes() if r.node == n)
        host_pub = (node_ssh_dir(provider, task.task_id, instance) / "host_ed25519.pub")
        assert host_pub.read_text().split()[:2] == endpoint.host_key.split()
        assert stat.S_IMODE(os.stat(endpoint.key_path).st_mode) == 0o600
    assert endpoints[0].host != endpoints[1].host

    # a process started over SSH outlives its session but not the task
    started = task.ssh(node=1, command="sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    assert started.exit_code == 0, started
    background = int(started.stdout)
    wait_until(lambda: background in processes_with_env("FLOW_HOME", str(flow_home)), 10,
               f"the background sleep {background} to be listed (mid-exec it reads empty)")
    task.cancel()
    assert processes_with_env("FLOW_HOME", str(flow_home)) == []  # the sleep included
    with pytest.raises(SshUnavailableError, match="ended"):
        task.ssh(node=1, command="true")


def test_a_changed_host_key_is_refused(flow_home: Path) -> None:
    task = hold.spawn()
    provider = _running(task)
    pinned = task.ssh_endpoint(0)
    assert task.ssh(node=0, command="true").exit_code == 0
    # the node's server now presents another key (as an impostor would): new key, SIGHUP
    ssh_dir = node_ssh_dir(provider, task.task_id, _instance(task, 0))
    for name in ("host_ed25519", "host_ed25519.pub"):
        (ssh_dir / name).unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(ssh_dir / "host_ed25519")], check=True)
    new_key = " ".join((ssh_dir / "host_ed25519.pub").read_text().split()[:2])
    os.kill(int((ssh_dir / "sshd.pid").read_text()), signal.SIGHUP)  # sshd re-reads its keys

    refused: list[HostKeyMismatchError] = []

    def refused_now() -> bool:
        try:
            task.ssh(node=0, command="true")
        except HostKeyMismatchError as exc:
            refused.append(exc)
            return True
        except SshError:  # the server is restarting
            return False
        return False

    wait_until(refused_now, 15, "the changed host key to be refused")
    message = str(refused[0])
    assert fingerprint(new_key) in message and fingerprint(pinned.host_key) in message
    assert task.ssh(node=1, command="echo $FLOW_NODE_RANK").stdout == "1\n"  # node 1 unchanged
    task.cancel()
    assert task.status is TaskStatus.CANCELLED


def test_without_sshd_the_task_runs_and_ssh_says_how_to_install_it(flow_home: Path) -> None:
    no_sshd = FlowApp("no-sshd", provider_config={"sshd": str(flow_home / "missing" / "sshd")})
    quick = no_sshd.function(num_instances=1)(_sleep_briefly)
    task = quick.spawn()
    wait_until(lambda: any(n.phase == "running" for n in task.nodes()), 60, "the node to run")
    with pytest.raises(SshUnavailableError) as info:
        task.ssh(node=0, command="true")
    assert "apt-get install openssh-server" in str(info.value)
    assert task.result(timeout=60) == "done"


def _sleep_briefly() -> str:
    import time
    time.sleep(2)
    return "done"
