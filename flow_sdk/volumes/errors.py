"""Errors of volumes and mounts (stdlib only: ``flow_sdk.current`` raises one of them)."""

from __future__ import annotations

import errno

from flow_sdk.errors import FlowError


class VolumeError(FlowError):
    """A volume or mount could not be created, found, attached, mounted or deleted."""


class VolumeInUseError(VolumeError):
    """The volume is used by a running task (or, for a block volume, attached elsewhere)."""


class ReadOnlyMountError(VolumeError, OSError):
    """A write to a read-only S3 mount. ``errno`` is ``EROFS``, like the kernel's own error."""

    def __init__(self, mount_path: str, source: str, path: str) -> None:
        message = (f"{mount_path} is a read-only mount of {source}; S3 mounts cannot be "
                   "written: write to a volume (volumes={...}) instead")
        OSError.__init__(self, errno.EROFS, message, path)
        self.mount_path = mount_path
        self.source = source

    def __reduce__(self) -> tuple[type[ReadOnlyMountError], tuple[str, str, str]]:
        return (type(self), (self.mount_path, self.source, str(self.filename)))

    def __str__(self) -> str:
        return f"[Errno {errno.EROFS}] {self.strerror}: {self.filename!r}"
