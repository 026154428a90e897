"""A local node's processes: its agent and its keeper, started side by side, found again by
their instance records, and stopped with everything they started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flow_sdk.system import procs
from flow_sdk.providers.launch import NodeLaunch
from flow_sdk.providers.local import _keeper
from flow_sdk.wire import envvars, runtimecap

KEEPER_EXIT_WAIT_S = 3.0  # after the agent stops, how long its keeper may take to drain and exit
PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the folder that holds flow_sdk

_children: dict[int, subprocess.Popen[bytes]] = {}  # agents and keepers this process started


def reap() -> None:
    """Collect the exit status of the nodes' processes this process started."""
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]


def _boot_file(text: str, path: Path) -> Path:
    """A new 0600 file at ``path`` holding the encoded boot configuration: it carries the
    task's secret, which stays out of argv and environment dumps."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def node_env(launch: NodeLaunch, instance_id: str, address: str, workdir: Path, gpus: str,
             nodes: int) -> dict[str, str]:
    """The environment of the node's agent and keeper, this provider's render of ``launch``
    (one of ``nodes`` nodes sharing this machine); writes the boot file into ``workdir``."""
    env = dict(os.environ)
    env.update(launch.agent_env(instance_id, address,
                                _boot_file(launch.boot_text(), workdir / "boot.json")))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH"))
                                        if p)
    env["CUDA_VISIBLE_DEVICES"] = gpus
    # Workers share this machine's cores with every other local node of the task.
    env[envvars.NODE_CORES] = str(max(1, len(os.sched_getaffinity(0)) // nodes))
    deadline = launch.backstop(runtimecap.KEEPER, time.time())
    if deadline is not None:
        env[envvars.NODE_DEADLINE] = repr(deadline)
    return env


def without_boot(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the boot file's name: only the agent reads it (and removes it)."""
    return {k: v for k, v in env.items() if k != envvars.BOOT_FILE}


def spawn(env: Mapping[str, str], workdir: Path, stream: Path, instance_id: str,
          sshd_argv: Sequence[str], module: str) -> dict[str, Any]:
    """Start the node's keeper, then its agent (``python -m module``: the task's agent, or a
    pool's daemon) writing into the keeper's stdin; returns the instance record's fields for
    both."""
    read_end, write_end = os.pipe()
    try:
        keeper = subprocess.Popen(
            _keeper.keeper_argv(sys.executable, stream, instance_id, sshd_argv), cwd=workdir,
            env=without_boot(env), stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        _children[keeper.pid] = keeper
        fields: dict[str, Any] = {"keeper_pid": keeper.pid,
                                  "keeper_ticks": procs.start_ticks(keeper.pid)}
        agent = subprocess.Popen(
            [sys.executable, "-m", module], cwd=workdir, env=env,
            stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end,
            start_new_session=True)
    finally:
        os.close(read_end)
        os.close(write_end)
    _children[agent.pid] = agent
    fields.update(pid=agent.pid, ticks=procs.start_ticks(agent.pid), launched_at=time.time())
    return fields


def launcher_fields() -> dict[str, Any]:
    """The fields of a node's record before its processes start: who is starting it, and
    since when."""
    return {"launcher_pid": os.getpid(), "launcher_ticks": procs.start_ticks(os.getpid()),
            "launched_at": time.time()}


def launching(record: Mapping[str, Any]) -> bool:
    """Whether a node whose processes are not recorded yet counts as running: while its
    launcher lives, or (a launcher killed mid-launch) while any process carries its instance
    id, until ``stop`` ends them."""
    if "pid" in record:
        return False
    return procs.is_alive(record["launcher_pid"], record["launcher_ticks"]) or bool(
        procs.pids_with_env(envvars.INSTANCE_ID, [record["instance_id"]]))


def agent_alive(record: Mapping[str, Any]) -> bool:
    return "pid" in record and procs.is_alive(record["pid"], record["ticks"])


def keeper_alive(record: Mapping[str, Any]) -> bool:
    return "keeper_pid" in record and procs.is_alive(record["keeper_pid"],
                                                      record["keeper_ticks"])


def _worker_pgids(workdir: Path) -> list[int]:
    pids_file = workdir / procs.WORKER_PGIDS_FILE
    return [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []


def stop(records: Sequence[Mapping[str, Any]]) -> None:
    """Stop agents and workers, let each keeper write the last boot output and stop its
    sshd, then stop whatever still carries the nodes' instance ids (SSH sessions,
    processes workers left behind)."""
    # every node's agent at once (each stops its own workers), then the workers left
    procs.kill_groups([rec["pid"] for rec in records if agent_alive(rec)], reap=reap)
    procs.kill_groups([pgid for rec in records for pgid in _worker_pgids(Path(rec["workdir"]))],
                      reap=reap)
    deadline = time.monotonic() + KEEPER_EXIT_WAIT_S
    for rec in records:
        while keeper_alive(rec) and time.monotonic() < deadline:
            reap()
            time.sleep(0.02)
        if keeper_alive(rec):
            procs.kill_group(rec["keeper_pid"], reap=reap)
    _keeper.stop_node_processes([rec["instance_id"] for rec in records])
    reap()


def node_pids(records: Sequence[Mapping[str, Any]]) -> list[int]:
    """Every live process of these nodes: agents, workers, keepers, sshd, SSH sessions and
    what they started (Linux; agents and keepers elsewhere)."""
    pids = set(procs.pids_with_env(envvars.INSTANCE_ID, [r["instance_id"] for r in records]))
    pids.update(r["pid"] for r in records if agent_alive(r))
    pids.update(r["keeper_pid"] for r in records if keeper_alive(r))
    return sorted(pids)
