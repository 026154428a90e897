"""Runs a simulated instance's user-data the way its OS would, as root in a mount namespace of
its own: ``python -m flow_sdk.sim._root <instance.json>`` (started by
``_instance``).

The namespace shows the host's files (``flow_sdk.system.mountns``) except the node's own state:
``/var/lib/flow``, ``/opt/flow``, the control directory the ``shutdown`` shim writes to,
``/dev/disk`` (where its EBS volumes appear), and one empty directory per task mount path,
each a directory of this instance's; ``/opt/flow/envs``, the SDK environments by wheel
digest, is shared by all instances, as if their image carried it. ``/dev/console`` is the
instance's console file (what EC2's GetConsoleOutput would show). Then it replaces itself
with ``bash <user-data>`` in the environment ``_instance`` prepared: the script runs
unmodified, and nothing it or its children mount reaches the host.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from flow_sdk.system.mountns import Bind, bind_file, enter_private_root
from flow_sdk.sim._instancespec import CONTROL_DIR, InstanceSpec


def private_binds(spec: InstanceSpec) -> list[Bind]:
    """The node's own directories and where they appear in its namespace."""
    node = Path(spec.node_dir)
    binds = [Bind("/var/lib/flow", node / "state", False),
             Bind("/opt/flow", node / "opt", False),
             # the SDK environments the image carries, by wheel digest: shared, like a disk
             # image's files, by every instance of this simulated cloud
             Bind("/opt/flow/envs", Path(spec.envs_root), False),
             Bind(CONTROL_DIR, node / "control", False),
             Bind("/dev/disk", node / "disk", False)]
    for i, path in enumerate(spec.mount_paths):
        binds.append(Bind(path, node / "mountpoints" / str(i), False))
    for bind in binds:
        bind.source.mkdir(parents=True, exist_ok=True)
    (node / "opt" / "envs").mkdir(exist_ok=True)  # where the shared one is shown
    return binds


def main(argv: list[str]) -> NoReturn:
    spec = InstanceSpec.load(Path(argv[1]))
    node = Path(spec.node_dir)
    env = json.loads((node / "boot-env.json").read_text())
    console = node / "console.log"
    console.touch()
    enter_private_root(private_binds(spec), node / "root")
    bind_file(console, "/dev/console")
    os.chdir("/")
    os.execve("/bin/bash", ["bash", str(node / "user-data")], env)


if __name__ == "__main__":
    main(sys.argv)
