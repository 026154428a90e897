"""Errors of volumes and mounts; they live in ``flow_sdk.errors`` (the providers raise them
too) and are re-exported here."""

from flow_sdk.errors import ReadOnlyMountError, VolumeError, VolumeInUseError

__all__ = ["ReadOnlyMountError", "VolumeError", "VolumeInUseError"]
