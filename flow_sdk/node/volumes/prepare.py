"""The node agent's volume step: make every volume and S3 mount of the task visible to its
workers, and tell them where (``FLOW_MOUNTS``).

Called by the agent after the start barrier and before it computes the workers' environment.
See the ``flow_sdk.volumes`` docstring for the two ways paths are shown (literal paths in a
private mount namespace, or mapped paths) and how each refuses writes to S3 mounts.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Literal

from flow_sdk import lifecycle
from flow_sdk.errors import VolumeError
from flow_sdk.providers.base import NodeMount, Provider
from flow_sdk.spec import TaskSpec
from flow_sdk.system.mountns import (
    Bind,
    NamespaceUnavailable,
    enter_private_root,
    hidden_host_entries,
)
from flow_sdk.node.volumes.s3mount import materialize, set_writable
from flow_sdk.wire import envvars

Mode = Literal["namespace", "mapped"]
Log = Callable[[str], None]

# Task caches this process uses; held (flock, shared) until it exits.
_cache_users: dict[Path, IO[str]] = {}
# What this process prepared, by task: a restarted generation reuses it.
_prepared: dict[str, dict[str, str]] = {}


def cache_root(provider: Provider, workdir: Path) -> Path:
    """Where S3 mount caches live: where the provider's nodes on this machine share them,
    else on the node."""
    shared = provider.volumes.shared_mount_caches()
    return shared if shared is not None else workdir / "s3-cache"


def requested_mode() -> str:
    """``FLOW_VOLUME_MODE`` from the node's environment: auto, namespace or mapped."""
    mode = os.environ.get(envvars.VOLUME_MODE, "auto").strip().lower() or "auto"
    if mode not in ("auto", "namespace", "mapped"):
        raise VolumeError(f"{envvars.VOLUME_MODE}={mode!r} is not one of auto, namespace, mapped")
    return mode


def prepare_volumes(spec: TaskSpec, provider: Provider, workdir: Path, task_id: str,
                    log: Log, keepalive: Callable[[], None] | None = None) -> dict[str, str]:
    """Provide the task's volumes and S3 mounts on this node; returns the env additions for
    every worker (``FLOW_MOUNTS``: mount path -> path the worker uses). Empty when the task
    has neither. Raises VolumeError (a FlowError) naming the volume or mount that failed.
    Called again for the same task (a restarted generation), it returns what it prepared."""
    if not spec.volumes and not spec.mounts:
        return {}
    if task_id in _prepared:
        return dict(_prepared[task_id])
    mode = requested_mode()
    mounts = provider.volumes.node_mounts(spec, task_id, log) if spec.volumes else []
    if spec.mounts:
        mounts += _s3_mounts(spec, provider, workdir, task_id, log, keepalive)
    chosen = _expose(mounts, mode, workdir, log)
    exposed = {m.path: {"path": m.path if chosen == "namespace" or m.premounted
                        else str(m.source),
                        "read_only": m.read_only, "source": m.origin} for m in mounts}
    _prepared[task_id] = {envvars.MOUNTS: json.dumps(exposed, sort_keys=True)}
    return dict(_prepared[task_id])


def _s3_mounts(spec: TaskSpec, provider: Provider, workdir: Path, task_id: str, log: Log,
               keepalive: Callable[[], None] | None) -> list[NodeMount]:
    root = cache_root(provider, workdir)
    if provider.volumes.shared_mount_caches() is not None:
        gc_mount_caches(provider)
    task_cache = root / task_id
    _use_cache(task_cache)
    mounts = []
    for path, uri in sorted(spec.mounts.items()):
        digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
        done = materialize(uri, task_cache / digest, keepalive=keepalive, log=log)
        mib = done.total_bytes / 2**20
        log(f"mount {uri} at {path} (read-only): {done.objects} object(s), {mib:.1f} MiB; "
            f"downloaded {done.downloaded}, reused {done.reused}")
        mounts.append(NodeMount(path, done.directory, True, uri))
    return mounts


def _expose(mounts: list[NodeMount], mode: str, workdir: Path, log: Log) -> Mode:
    """Show the mounts at their literal paths (private namespace) or leave them mapped."""
    binds = [Bind(m.path, m.source, m.read_only) for m in mounts if not m.premounted]
    if not binds or mode == "mapped":
        if binds:
            log(f"mount paths are mapped ({envvars.VOLUME_MODE}=mapped): code finds them with "
                "flow_sdk.current.path(...) or $FLOW_MOUNTS")
        return "mapped"
    covered = _covered_node_paths([b.path for b in binds], workdir)
    if covered:
        if mode == "namespace":
            raise VolumeError(f"mount path {covered[0][0]} would cover {covered[0][1]}, which "
                              "this node needs; choose another mount path")
        log(f"mount paths are mapped: {covered[0][0]} would cover {covered[0][1]}, which this "
            "node needs; code finds them with flow_sdk.current.path(...) or $FLOW_MOUNTS")
        return "mapped"
    premounted = [m.path for m in mounts if m.premounted]
    hidden = hidden_host_entries([b.path for b in binds], mounted=premounted)
    if hidden and mode == "auto":
        log(f"mount paths are mapped: showing them literally would hide host entries "
            f"({', '.join(hidden[:3])}{' ...' if len(hidden) > 3 else ''}); code finds them "
            "with flow_sdk.current.path(...) or $FLOW_MOUNTS")
        return "mapped"
    try:
        skipped = enter_private_root(binds, workdir / "root")
    except NamespaceUnavailable as exc:
        if mode == "namespace":
            raise VolumeError(f"{envvars.VOLUME_MODE}=namespace but this node cannot have a "
                              f"private mount namespace: {exc}") from exc
        log(f"mount paths are mapped (no private mount namespace here: {exc.strerror or exc}); "
            "code finds them with flow_sdk.current.path(...) or $FLOW_MOUNTS")
        return "mapped"
    except OSError as exc:
        if mode == "namespace":
            raise VolumeError(f"could not build the private root for the mounts: {exc}") from exc
        log(f"mount paths are mapped (building the private root failed: {exc}); code finds "
            "them with flow_sdk.current.path(...) or $FLOW_MOUNTS")
        return "mapped"
    if skipped:
        log(f"private root: special files not shown: {', '.join(skipped[:5])}")
    log(f"mount paths are literal in this node's private mount namespace: "
        f"{', '.join(b.path for b in binds)}")
    return "namespace"


def _covered_node_paths(paths: list[str], workdir: Path) -> list[tuple[str, str]]:
    """(mount path, node path) pairs where a mount would hide what the node itself runs
    from: its working directory, the flow data dir, Python and its import path."""
    needed = [workdir, Path(__file__).resolve().parents[1], Path(sys.prefix), Path(sys.executable),
              *(Path(p) for p in sys.path if p and os.path.isabs(p))]
    home = os.environ.get(envvars.HOME)
    if home:
        needed.append(Path(home))
    found = []
    for path in paths:
        for node_path in needed:
            text = str(node_path.absolute())
            if text == path or text.startswith(path + "/"):
                found.append((path, text))
                break
    return found


# -- S3 caches: one per task and machine, removed when its last user is gone ---------------


def _use_cache(task_cache: Path) -> None:
    """Mark this process as a user of ``task_cache`` until it exits; the last user to leave
    removes it."""
    if task_cache in _cache_users:
        return
    task_cache.mkdir(parents=True, exist_ok=True)
    handle = open(task_cache.parent / f".{task_cache.name}.users", "a+")  # noqa: SIM115
    fcntl.flock(handle, fcntl.LOCK_SH)
    _cache_users[task_cache] = handle
    atexit.register(_leave_cache, task_cache)


def _leave_cache(task_cache: Path) -> None:
    handle = _cache_users.pop(task_cache, None)
    if handle is None:
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # only when no other node uses it
    except BlockingIOError:
        handle.close()
        return
    remove_cache(task_cache)
    Path(handle.name).unlink(missing_ok=True)
    handle.close()


def remove_cache(task_cache: Path) -> None:
    """Delete a task's S3 caches (they are read-only: make them writable first)."""
    if task_cache.exists():
        set_writable(task_cache, True)
        shutil.rmtree(task_cache)


def gc_mount_caches(provider: Provider) -> int:
    """Remove the S3 caches of ended tasks that no process uses any more (a node killed with
    SIGKILL cannot clean up after itself), where the provider's nodes share caches on this
    machine. A task has ended when its outcome is sealed with its secret and this machine
    holds that secret (``lifecycle.ended_here``); any other task may be live and keeps its
    cache. Returns how many task caches were removed."""
    root = provider.volumes.shared_mount_caches()
    if root is None or not root.is_dir():
        return 0
    removed = 0
    for task_cache in sorted(p for p in root.iterdir() if p.is_dir()):
        if task_cache in _cache_users:
            continue
        if lifecycle.ended_here(provider.store, task_cache.name) is None:
            continue  # the task may still be running
        users = root / f".{task_cache.name}.users"
        with open(users, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            remove_cache(task_cache)
        users.unlink(missing_ok=True)
        removed += 1
    return removed

