"""Named volumes as directories on a filesystem the caller and the nodes share: this machine's
for the ``local`` provider, a cluster's shared filesystem for ``slurm``.

``DirectoryVolumes`` is such a provider's ``volumes``; ``VolumeDirs`` keeps the directories.

Layout, under the provider's root (``$FLOW_HOME/local`` for the local provider)::

    volumes/<name>/volume.json   name, size_gb, interface, created_at
    volumes/<name>/data/         what tasks see at the volume's mount path
    volumes/<name>/attach.lock   block volumes: held (flock) by the one node using it

A volume is created by renaming a fully written temporary directory into place, so two
nodes creating the same volume at once both end up with the one that won, and a reader
never sees half a volume. Volumes outlive tasks until ``delete`` (``flow volumes delete``).
``size_gb`` is recorded, not enforced: such a volume is a plain directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from flow_sdk import wire
from flow_sdk.home import tasksecrets
from flow_sdk.errors import RecordError, SignatureError, VolumeError, VolumeInUseError
from flow_sdk.wire import TaskRecord, signing
from flow_sdk.providers.base import Log, NodeMount, Provider, VolumeInfo, Volumes
from flow_sdk.providers.host import LOCAL, Host
from flow_sdk.spec import TaskSpec, VolumeSpec

VOLUME_FILE = "volume.json"
DATA_DIR = "data"
ATTACH_LOCK = "attach.lock"

# Block-volume locks this process holds; the kernel releases them when the process exits.
_held_locks: dict[str, IO[str]] = {}


@dataclass(frozen=True)
class DirectoryVolume:
    """One volume as recorded on disk."""

    name: str
    size_gb: int
    interface: str
    created_at: float
    root: Path

    @property
    def data(self) -> Path:
        """The directory a task sees at the volume's mount path."""
        return self.root / DATA_DIR


class VolumeDirs:
    """The volumes under one provider root, on ``host`` (this machine unless given)."""

    def __init__(self, provider_root: Path, host: Host = LOCAL) -> None:
        self.root = Path(provider_root) / "volumes"
        self.host = host

    def path(self, name: str) -> Path:
        """Where volume ``name`` lives (whether or not it exists); the name is checked."""
        VolumeSpec(name=name)  # the safe alphabet: never a path outside self.root
        return self.root / name

    def get(self, name: str) -> DirectoryVolume | None:
        """The volume ``name``, or None when there is none."""
        folder = self.path(name)
        data = self.host.read(str(folder / VOLUME_FILE))
        if data is None:
            return None
        meta = json.loads(data)
        return DirectoryVolume(meta["name"], int(meta["size_gb"]), meta["interface"],
                           float(meta["created_at"]), folder)

    def list(self) -> list[DirectoryVolume]:
        """Every volume, sorted by name."""
        found = []
        for name in self.host.names(str(self.root)) or []:
            if name.startswith("."):
                continue
            volume = self.get(name)
            if volume is not None:
                found.append(volume)
        return found

    def ensure(self, spec: VolumeSpec) -> tuple[DirectoryVolume, bool]:
        """The volume ``spec.name``, created when missing; True when this call created it.

        Raises VolumeError when a volume of that name exists with another interface.
        """
        existing = self.get(spec.name)
        if existing is not None:
            return self._compatible(existing, spec), False
        temp = self.root / f".new-{spec.name}-{secrets.token_hex(4)}"
        self.host.mkdirs(str(temp / DATA_DIR))
        meta = {"name": spec.name, "size_gb": spec.size_gb, "interface": spec.interface,
                "created_at": time.time()}
        self.host.write(str(temp / VOLUME_FILE), json.dumps(meta, sort_keys=True).encode())
        try:
            self.host.rename(str(temp), str(self.path(spec.name)))
        except OSError as exc:
            self.host.remove(str(temp))
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise VolumeError(f"could not create volume {spec.name!r} under "
                                  f"{self.root}: {exc}") from exc
            raced = self.get(spec.name)  # another node created it first: use that one
            if raced is None:
                raise VolumeError(f"{self.path(spec.name)} exists but is not a flow volume "
                                  f"(no {VOLUME_FILE}); move it away") from exc
            return self._compatible(raced, spec), False
        created = self.get(spec.name)
        assert created is not None
        return created, True

    @staticmethod
    def _compatible(volume: DirectoryVolume, spec: VolumeSpec) -> DirectoryVolume:
        if volume.interface != spec.interface:
            raise VolumeError(
                f"volume {spec.name!r} exists as a {volume.interface} volume, not "
                f"interface={spec.interface!r}; use interface={volume.interface!r} or another "
                "name")
        return volume

    def delete(self, name: str) -> bool:
        """Delete the volume and everything in it; False when there was none.

        Raises VolumeInUseError while a node holds a block volume.
        """
        volume = self.get(name)
        if volume is None:
            return False
        holder = self.attached_to(name)
        if holder is not None:
            raise VolumeInUseError(f"block volume {name!r} is attached to a running node of "
                                   f"task {holder}; cancel that task first")
        doomed = self.root / f".deleting-{name}-{secrets.token_hex(4)}"
        self.host.rename(str(volume.root), str(doomed))  # the name is free at once
        self.host.remove(str(doomed))
        return True

    # -- block volumes: one node at a time ------------------------------------------------

    def attach(self, name: str, task_id: str) -> None:
        """Hold the block volume ``name`` for this process's lifetime (a node agent).

        Raises VolumeInUseError when another process holds it.
        """
        path = self.path(name) / ATTACH_LOCK
        if str(path) in _held_locks:
            return
        handle = open(path, "a+")  # noqa: SIM115 - held open for the process's lifetime
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another task"
            handle.close()
            raise VolumeInUseError(
                f"block volume {name!r} is attached to a node of task {holder}; a block volume "
                "attaches to one node at a time: wait for that task, or use interface='file' "
                "for a volume several tasks share") from None
        handle.truncate(0)
        handle.write(task_id)
        handle.flush()
        _held_locks[str(path)] = handle

    def attached_to(self, name: str) -> str | None:
        """The task id holding block volume ``name``, or None when no process holds it."""
        path = self.path(name) / ATTACH_LOCK
        if self.host is not LOCAL or not path.exists():  # never attached (a lock is local)
            return None
        with open(path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return handle.read().strip() or "unknown"
            fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def running_tasks_using(provider: Provider, launched: Path, name: str,
                        host: Host = LOCAL) -> tuple[str, ...]:
    """Tasks of ``provider`` (``launched`` holds a folder per task it launched) with a live
    node that use volume ``name``, or may: a task counts while any node of it runs (the
    provider's own view; never the store's say-so, which a store writer could forge), unless
    its record, sealed with its secret that this machine holds, shows it does not name the
    volume. A task whose record is missing, junk, forged, or not checkable here may use it."""
    ids = {name for name in host.names(str(launched)) or [] if not name.startswith(".")}
    ids.update(key.split("/")[1] for key in provider.store.list("tasks/")
               if key.endswith("/task.json") and key.count("/") == 2)
    return tuple(task_id for task_id in sorted(ids)
                 if any(i.state != "terminated" for i in provider.list_instances(task_id))
                 and _names_volume(provider, task_id, name) is not False)


def _names_volume(provider: Provider, task_id: str, name: str) -> bool | None:
    """Whether the task's sealed record names volume ``name``; None when no record sealed
    with a secret this machine holds says (missing, junk, forged, or another machine's)."""
    if not tasksecrets.has_task_secret(task_id):
        return None
    store = signing.SignedStore(provider.store, tasksecrets.load_task_secret(task_id))
    try:
        raw = store.get_record(wire.task_key(task_id))
        spec = None if raw is None else TaskRecord.from_json(raw).spec
    except (SignatureError, RecordError):
        return None
    volumes = spec.get("volumes") if isinstance(spec, dict) else None
    if not isinstance(volumes, dict):
        return None
    return any(isinstance(v, dict) and v.get("name") == name for v in volumes.values())


class DirectoryVolumes(Volumes):
    """A provider's ``volumes`` as directories under its ``root``. ``launched`` holds one
    folder per task the provider launched (what it asks about a volume's users); ``caches``
    is where the nodes of a task share their S3 mount caches (the local provider's, on one
    machine), None where each node keeps its own."""

    def __init__(self, provider: Provider, root: Path, launched: Path,
                 caches: Path | None = None, host: Host = LOCAL) -> None:
        self.provider = provider
        self.root = Path(root)
        self.launched = launched
        self.caches = caches
        self.host = host
        self.dirs = VolumeDirs(self.root, host)

    def _users(self, name: str) -> tuple[str, ...]:
        return running_tasks_using(self.provider, self.launched, name, self.host)

    def _info(self, volume: DirectoryVolume) -> VolumeInfo:
        return VolumeInfo(volume.name, volume.interface, volume.size_gb, self.provider.name,
                          str(volume.data), None, volume.created_at, self._users(volume.name))

    def list(self) -> list[VolumeInfo]:
        return [self._info(v) for v in self.dirs.list()]

    def ensure(self, spec: VolumeSpec, *, zone: str | None = None) -> VolumeInfo:
        volume, _created = self.dirs.ensure(spec)
        return self._info(volume)

    def delete(self, name: str, *, force: bool = False) -> bool:
        if not force:
            users = self._users(name)
            if users:
                raise VolumeInUseError(f"volume {name!r} is used by running task(s) "
                                       f"{', '.join(users)}; cancel them or pass force=True")
        return self.dirs.delete(name)

    def node_mounts(self, spec: TaskSpec, task_id: str, log: Log) -> list[NodeMount]:
        """Each volume's directory, created when missing; a block volume is held by this
        node (process) until it exits."""
        mounts = []
        for path, volume in sorted(spec.volumes.items()):
            found, created = self.dirs.ensure(volume)
            if volume.interface == "block":
                self.dirs.attach(volume.name, task_id)
            log(f"volume {volume.name!r} ({volume.interface}) at {path}: "
                f"{'created' if created else 'existing'} {found.data}")
            mounts.append(NodeMount(path, found.data, False,
                                    f"volume {volume.name} ({volume.interface})"))
        return mounts

    def local_path(self, name: str) -> Path | None:
        return self.dirs.path(name) / DATA_DIR if self.host is LOCAL else None

    def shared_mount_caches(self) -> Path | None:
        return self.caches
