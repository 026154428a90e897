"""One simulated EC2 instance: ``python -m flow_sdk.sim._instance <instance.json>``.

It plays what EC2 and the instance's OS do for a real node, and nothing more:

* the instance metadata service: an IMDSv2 emulator on loopback (``_imds``), which the node
  reaches through ``AWS_EC2_METADATA_SERVICE_ENDPOINT``, and which answers the instance's own
  processes only; it hands out the credentials of the instance profile's role
  (``_rolecreds``), the node's only AWS credentials;
* boot: after ``boot_delay_s`` (a slow image or network), the rendered user-data runs,
  unmodified, with bash as root in a mount namespace of the instance's own (``_root``), in
  the environment a cloud-init run has, plus the endpoint overrides: ``AWS_ENDPOINT_URL``
  sends the node's AWS calls (S3, CloudWatch Logs, EC2) to the simulated cloud's endpoint;
* what cannot exist on this machine, through shims on the node's PATH (``shims/``):
  ``shutdown`` asks this process to power the instance off (now, or after N minutes of
  ``minute_s`` seconds each), and an NFS mount of an EFS file system binds that file system's
  shared directory under ``<root>/efs``;
* EBS: a volume EC2 reports attached to the instance becomes a loop device over
  ``<root>/ebs/<volume id>.img`` (sparse, the volume's size), shown in the instance's
  ``/dev/disk/by-id`` under the name a Nitro instance gives it, so the bootstrap's own wait,
  ``blkid``, ``mkfs.ext4`` and ``mount`` run for real;
* power-off: the instance is terminated through EC2, as ``InstanceInitiatedShutdownBehavior=
  terminate`` does, and every process of the instance (all carry ``FLOW_SIM_INSTANCE``) is
  stopped. Code install runs offline (``PIP_NO_INDEX``), from ``wheelhouse`` when one is set.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from flow_sdk.aws_clients import make_client
from flow_sdk.system import procs
from flow_sdk.errors import ProviderError
from flow_sdk.sim._imds import ImdsEmulator
from flow_sdk.sim._instancespec import InstanceSpec
from flow_sdk.sim._rolecreds import RoleCredentials
from flow_sdk.wire import envvars

POWEROFF_FILE = "poweroff"  # its text: the epoch second to power off at
SHIMS = Path(__file__).resolve().parent / "shims"  # copied under the root at launch
_POLL_S = 0.2
_ATTACH_POLL_S = 1.0
DEVICES_FILE = "devices.json"  # volume id -> loop device, for the stop of the instance


def instance_pids(tag: str) -> list[int]:
    """Live processes of the simulated instance ``tag`` (this one excluded)."""
    return procs.pids_with_env(envvars.SIM_INSTANCE, [tag])


def boot_env(spec: InstanceSpec, imds_endpoint: str) -> dict[str, str]:
    """The user-data's environment: a cloud-init run's and the endpoint overrides. It holds
    no AWS credentials: the node's SDKs and CLI read its role's from the metadata service
    (given a few seconds and tries, on a busy machine)."""
    python_bin = str(Path(spec.python).parent)
    env = {
        "PATH": os.pathsep.join([spec.shims, python_bin, "/usr/local/sbin", "/usr/local/bin",
                                 "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
        "HOME": "/root", "LANG": "C.UTF-8",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds_endpoint,
        "AWS_METADATA_SERVICE_TIMEOUT": "5", "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "3",
        "AWS_ENDPOINT_URL": spec.endpoint_url,
        "AWS_DEFAULT_REGION": spec.region,
        "PIP_NO_INDEX": "1", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        envvars.SIM_INSTANCE: spec.tag,
        envvars.SIM_EFS_ROOT: spec.efs_root,
        envvars.SIM_MINUTE_S: repr(spec.minute_s),
    }
    if spec.wheelhouse:
        env["PIP_FIND_LINKS"] = spec.wheelhouse
    return env


class Instance:
    """The running instance: its metadata service, its boot, its power-off."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.node = Path(spec.node_dir)
        self.poweroff = self.node / "control" / POWEROFF_FILE
        self.log = open(self.node / "instance.log", "a", buffering=1, encoding="utf-8")
        self.stopped = False  # set on SIGTERM: the instance was terminated through the API

    def say(self, text: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} {self.spec.instance_id}: {text}\n")

    def power_off_at(self) -> float | None:
        """When the node asked to power off (the ``shutdown`` shim), or None."""
        if not self.poweroff.exists():
            return None
        return float(self.poweroff.read_text().strip() or "0")

    def run(self) -> int:
        credentials = RoleCredentials(self.spec.instance_id, self.spec.region,
                                      self.spec.endpoint_url)
        imds = ImdsEmulator({"instance-id": self.spec.instance_id,
                             "local-ipv4": self.spec.address,
                             "placement/region": self.spec.region},
                            peers=lambda: instance_pids(self.spec.tag),
                            credentials=credentials)
        endpoint = imds.start()
        (self.node / "control").mkdir(parents=True, exist_ok=True)
        try:  # made now, so the node's first request is answered at once
            role = credentials()
            self.say(f"role {role[0]}" if role else "no instance profile: no role credentials")
        except ProviderError as exc:
            self.say(str(exc))
        time.sleep(self.spec.boot_delay_s)
        env = boot_env(self.spec, endpoint)
        env_file = self.node / "boot-env.json"
        env_file.write_text(json.dumps(env))
        env_file.chmod(0o600)
        with open(self.node / "console.log", "ab") as console:
            boot = subprocess.Popen([sys.executable, "-m", "flow_sdk.sim._root",
                                     str(self.node / "instance.json")],
                                    stdin=subprocess.DEVNULL, stdout=console,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, envvars.SIM_INSTANCE: self.spec.tag})
        self.say(f"booting (user-data as pid {boot.pid})")
        try:
            self._watch(boot)
        finally:  # however the watch ends, nothing of the instance keeps running
            self.stop_processes()
            detach_devices(self.node)
            boot.wait()
            imds.stop()
            if imds.refused:
                self.say(f"the metadata service refused {imds.refused} request(s) from "
                         "processes that are not this instance's")
            self.say("powered off")
        return 0

    def _watch(self, boot: subprocess.Popen[bytes]) -> None:
        """Until the node powers itself off (then EC2 terminates it) or the instance is
        terminated through the API (SIGTERM): attach EBS volumes as EC2 reports them."""
        reported = False
        next_attach = 0.0
        while not self.stopped:
            attaching = self.spec.block_devices and boot.poll() is None
            if attaching and time.monotonic() >= next_attach:
                self.attach_devices()
                next_attach = time.monotonic() + _ATTACH_POLL_S
            at = self.power_off_at()
            if at is not None and time.time() >= at:
                self.terminate()
                return
            if not reported and boot.poll() is not None:
                self.say(f"user-data exited with code {boot.returncode}")
                reported = True
            time.sleep(_POLL_S)

    def terminate(self) -> None:
        """What the OS's power-off does to an instance launched with shutdown behaviour
        ``terminate``: EC2 terminates it."""
        ec2 = make_client("ec2", self.spec.region, endpoint_url=self.spec.endpoint_url)
        ec2.terminate_instances(InstanceIds=[self.spec.instance_id])
        self.say("terminated through EC2 (the node powered off)")

    def attach_devices(self) -> None:
        """Show each EBS volume EC2 reports attached to this instance as a block device."""
        ec2 = make_client("ec2", self.spec.region, endpoint_url=self.spec.endpoint_url)
        volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                                 "Values": [self.spec.instance_id]}])["Volumes"]
        devices = _devices(self.node)
        for volume in volumes:
            volume_id = volume["VolumeId"]
            if volume_id in devices:
                continue
            image = Path(self.spec.ebs_root) / f"{volume_id}.img"
            image.parent.mkdir(parents=True, exist_ok=True)
            if not image.exists():
                with open(image, "wb") as blank:
                    blank.truncate(int(volume["Size"]) * 2**30)
            loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                                  capture_output=True, text=True).stdout.strip()
            devices[volume_id] = loop
            (self.node / DEVICES_FILE).write_text(json.dumps(devices))
            by_id = self.node / "disk" / "by-id"
            by_id.mkdir(parents=True, exist_ok=True)
            name = by_id / f"nvme-Amazon_Elastic_Block_Store_{volume_id.replace('-', '')}"
            os.mknod(name, stat.S_IFBLK | 0o600, os.stat(loop).st_rdev)
            self.say(f"EBS volume {volume_id} attached as {loop} ({image})")

    def stop_processes(self) -> None:
        stopped = procs.stop_pids(instance_pids(self.spec.tag))
        if stopped:
            self.say(f"stopped {len(stopped)} process(es)")


def _devices(node: Path) -> dict[str, str]:
    path = node / DEVICES_FILE
    return dict(json.loads(path.read_text())) if path.exists() else {}


def detach_devices(node: Path) -> list[str]:
    """Detach the loop devices of the instance's EBS volumes (the kernel frees a device still
    in use once its last user, a mount of the gone namespace, is released). Idempotent."""
    detached = []
    for loop in _devices(node).values():
        if subprocess.run(["losetup", "-d", loop], capture_output=True).returncode == 0:
            detached.append(loop)
    (node / DEVICES_FILE).unlink(missing_ok=True)
    return detached


def main(argv: list[str]) -> int:
    instance = Instance(InstanceSpec.load(Path(argv[1])))

    def stop(signum: int, frame: FrameType | None) -> None:
        instance.stopped = True  # terminated through the API: stop everything, no EC2 call

    signal.signal(signal.SIGTERM, stop)
    return instance.run()


if __name__ == "__main__":
    procs.exit_now(main(sys.argv))
