"""What one simulated instance is (``InstanceSpec``), saved as JSON by the simulated cloud and
read by the instance's processes: ``_instance``, and ``_root``, which runs the user-data as
root. Standard library only, so that ``_root`` starts without the SDK's AWS side."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

CONTROL_DIR = "/run/flow-sim"  # in the instance's namespace: where ``shutdown`` writes

__all__ = ["CONTROL_DIR", "InstanceSpec"]


@dataclass(frozen=True)
class InstanceSpec:
    """What one simulated instance is and where its files live."""

    instance_id: str
    task_id: str
    address: str  # its private address as the other nodes reach it (loopback)
    region: str
    endpoint_url: str  # the simulated cloud's AWS endpoint (a moto server)
    node_dir: str  # the instance's own files: user-data, state, console, control
    efs_root: str  # <root>/efs: one shared directory per EFS file system
    ebs_root: str  # <root>/ebs: one sparse image file per EBS volume
    envs_root: str  # <root>/envs: the SDK environments by wheel digest (/opt/flow/envs)
    block_devices: bool  # the user-data waits for EBS volumes: watch EC2 for attachments
    shims: str  # the directory of the shims, first on the node's PATH
    mount_paths: tuple[str, ...]  # the task's volume and mount paths
    minute_s: float  # how long one minute of ``shutdown -h +N`` lasts
    boot_delay_s: float
    wheelhouse: str | None  # where pip finds wheels (no index is ever reached)
    python: str  # the image's python3

    @property
    def tag(self) -> str:
        return f"{self.task_id}/{self.instance_id}"

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), sort_keys=True))

    @classmethod
    def load(cls, path: Path) -> InstanceSpec:
        data = json.loads(path.read_text())
        data["mount_paths"] = tuple(data["mount_paths"])
        return cls(**data)
