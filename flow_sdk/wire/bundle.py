"""A script task's code as it travels inside the payload: built by ``flow_sdk.client.scripts``,
run by ``flow_sdk.node.scripts``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScriptBundle:
    """A script (or directory) to run on the nodes, with its command-line arguments."""

    name: str  # the task's name: the entry point's file name without ``.py``
    entrypoint: str  # the script's path inside the archive, POSIX style
    args: tuple[str, ...]
    archive: bytes  # a zip of the file or directory
