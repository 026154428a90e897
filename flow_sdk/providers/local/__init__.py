"""The ``local`` provider: every node is a set of processes on this machine.

Its parts, one job each: ``_provider`` (the Provider), ``_node`` (a node's agent and keeper
processes), ``_keeper`` (boot output and sshd beside each agent), ``_sshd`` (keys and the
node's OpenSSH server), ``_session`` (an SSH session on a node), ``_gpus`` (disjoint GPU
slices), ``_volumes`` (named volumes as directories); its objects and logs are files
(``flow_sdk.providers.files``).
"""

from __future__ import annotations

from flow_sdk.providers.local._provider import LocalProvider

__all__ = ["LocalProvider"]
