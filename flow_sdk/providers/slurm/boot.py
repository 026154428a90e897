"""The Slurm node bootstrap: standard library only, run by path on each node of the job
(``srun python -I -S boot.py LAUNCH_FILE``), before anything of the SDK is importable there.

It reads the launch file the provider wrote on the shared filesystem (``_batch.
render_launch_file``), checks that this interpreter runs the caller's Python ``major.minor``
and that every wheel has the SHA-256 the launch shipped, then builds the node environment once
per set of digests (the wheels unpacked into a folder on the shared filesystem, moved into
place whole, so the nodes of later jobs reuse it), and replaces itself with the agent
(``python -m MODULE``) on that folder, with its instance id (``SLURM_NODEID`` of this job), its
address (this node's ``NodeAddr``), its 0600 boot file and its cores.

What it says, and why it failed when it does, goes to the job's output and to the node's boot
stream in the task's log store (``task.logs(source="boot")``), in the store's
``<epoch seconds>\t<text>`` lines: a node whose agent never started is debugged from there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any


class BootLog:
    """The node's boot stream: a file of the task's log store (``FileLogStore``), appended."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            now = time.time()
            fh.write("".join(f"{now:.6f}\t{line}\n" for line in text.splitlines() or [""]))


def _fail(message: str) -> None:
    raise SystemExit(f"slurm boot: {message}")


def _checked(wheel: dict[str, str]) -> bytes:
    data = Path(wheel["path"]).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != wheel["sha256"]:
        _fail(f"{wheel['filename']} has SHA-256 {digest}, but the launch shipped "
              f"{wheel['sha256']}; nothing was installed")
    return data


def _unpack(data: bytes, site: Path, filename: str) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in archive.namelist():
            path = PurePosixPath(name)
            if path.is_absolute() or ".." in path.parts:
                _fail(f"{filename} holds the path {name!r} outside its folder; nothing more "
                      "was installed")
        archive.extractall(site)


def environment(wheels: list[dict[str, str]], envs: Path) -> Path:
    """The folder holding ``wheels`` unpacked: built once per set of digests, by whichever
    node gets there first; the others (and later jobs) find it whole."""
    key = hashlib.sha256("".join(w["sha256"] for w in wheels).encode()).hexdigest()[:24]
    site = envs / key
    if site.is_dir():
        return site
    checked = [(wheel["filename"], _checked(wheel)) for wheel in wheels]
    envs.mkdir(mode=0o700, parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=envs))
    for filename, data in checked:
        _unpack(data, building, filename)
    try:
        building.rename(site)
    except OSError:  # another node moved its copy in first
        shutil.rmtree(building, ignore_errors=True)
        if not site.is_dir():
            raise
    return site


def node_address(node_name: str) -> str:
    """This node's ``NodeAddr``, as the controller knows it."""
    shown = subprocess.run(["scontrol", "-o", "show", "node", node_name], capture_output=True,
                           text=True, timeout=60, check=False)
    for word in shown.stdout.split():
        if word.startswith("NodeAddr="):
            return word.partition("=")[2]
    _fail(f"`scontrol show node {node_name}` names no NodeAddr: {shown.stderr.strip()}")
    raise AssertionError("unreachable")


def main(launch_file: str) -> None:
    # the time limit's warning reaches every process of the job: not fatal to this one, nor
    # (ignored across exec) to the agent before it installs its own handler
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    launch = json.loads(Path(launch_file).read_text(encoding="utf-8"))
    job, node = os.environ["SLURM_JOB_ID"], int(os.environ["SLURM_NODEID"])
    instance = launch["instance_id"].format(job=job, node=node)
    log = BootLog(Path(launch["boot_log"].replace("{instance}", instance)))
    try:
        boot(launch, job, node, instance, log)
    except SystemExit as exc:
        log.say(str(exc.code))
        raise
    except Exception as exc:  # what the node's boot stream must show before it goes
        log.say(f"slurm boot: failed on node {node} of job {job} ({instance}):\n"
                + "".join(traceback.format_exception(exc)).rstrip())
        raise SystemExit(70) from exc


def boot(launch: dict[str, Any], job: str, node: int, instance: str, log: BootLog) -> None:
    """Check this node, build (or find) its environment, and become the agent."""
    mine = "%d.%d" % sys.version_info[:2]
    if mine != launch["python"]:
        _fail(f"this node runs Python {mine} ({sys.executable}), but the caller runs Python "
              f"{launch['python']}; set the provider's python to an interpreter of that "
              "version that the nodes can run")
    site = environment(launch["wheels"], Path(launch["envs"]))
    workdir = Path(launch["nodes_dir"]) / instance
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    names = launch["names"]
    env = {**os.environ, "PYTHONPATH": str(site),
           names["boot_file"]: str(Path(launch["boot_files"]) / f"{node}.json"),
           names["instance_id"]: instance,
           names["address"]: node_address(os.environ["SLURMD_NODENAME"]),
           names["cores"]: os.environ.get("SLURM_CPUS_ON_NODE", "0")}
    log.say(f"slurm boot: node {node} of job {job} is {instance}; agent from {site}")
    os.chdir(workdir)
    os.execve(sys.executable, [sys.executable, "-m", launch["module"]], env)


if __name__ == "__main__":
    main(sys.argv[1])
