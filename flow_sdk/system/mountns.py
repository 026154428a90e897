"""A private root for the calling thread and its children: the host's root plus bind mounts.

Used by the node agent to show volumes at their literal paths (``flow_sdk.volumes``) and by the
simulated cloud to give each simulated instance its own ``/var/lib/flow`` and ``/opt/flow``.

Linux only, and only with ``CAP_SYS_ADMIN`` (root on a node, or a privileged container). The
calling thread leaves the host's mount namespace (``unshare(CLONE_NEWNS)``, which a thread of
a multi-threaded process may do for itself), stops mount propagation back to the host, builds
a new root on a small tmpfs, and ``chroot``s into it:

* every entry of ``/`` is mirrored (directories bind-mounted recursively, files and device
  nodes bind-mounted, symlinks copied), so the node's programs, ``/proc``, ``/dev``,
  ``/tmp``, home and data dirs are the host's own;
* each mount path is an empty directory on the tmpfs with its source bind-mounted over it,
  read-only where asked (the kernel then refuses every write with ``EROFS``, root included);
* directories on the way to a mount path that do not exist on the host live on the tmpfs,
  which ends read-only: ``/shared`` holds only the task's mounts, nothing else can be created
  there.

Nothing on the host changes: the mounts exist only in the namespace, which the kernel drops
when the last process in it exits. Processes the thread starts afterwards (the workers)
inherit the namespace and the root.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MNT_DETACH = 0x2
# statvfs f_flag bits that a remount must repeat (the kernel refuses to drop locked ones).
_KEEP_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
               (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
               (os.ST_RELATIME, MS_RELATIME))


@dataclass(frozen=True)
class Bind:
    """``source`` (a host directory) shown at ``path`` inside the private root."""

    path: str
    source: Path
    read_only: bool


class NamespaceUnavailable(OSError):
    """This process cannot have a private mount namespace (no Linux, no ``CAP_SYS_ADMIN``)."""


def _libc() -> ctypes.CDLL:
    if not sys.platform.startswith("linux"):
        raise NamespaceUnavailable(f"private mount namespaces need Linux (this is {sys.platform})")
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "unshare"):
        raise NamespaceUnavailable("this C library has no unshare()")
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source or ''} on {target}")


def _remount_read_only(libc: ctypes.CDLL, target: str) -> None:
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY
    current = os.statvfs(target).f_flag
    for st_flag, ms_flag in _KEEP_FLAGS:
        if current & st_flag:
            flags |= ms_flag
    _mount(libc, None, target, None, flags)


def needed_tree(paths: Sequence[str]) -> dict[str, dict]:  # type: ignore[type-arg]
    """The mount paths as a tree of components; a leaf (a mount path) is an empty dict."""
    tree: dict[str, dict] = {}  # type: ignore[type-arg]
    for path in paths:
        node = tree
        for part in Path(path).parts[1:]:
            node = node.setdefault(part, {})
    return tree


def hidden_host_entries(paths: Sequence[str], host_root: Path = Path("/"),
                        mounted: Sequence[str] = ()) -> list[str]:
    """Host entries the private root would stop showing as they are: the other entries of an
    existing host directory (other than ``/``) on the way to one of ``paths``. In the private
    root such a directory is a read-only mirror, so nothing new can be created directly in it.
    Entries that are (or lead to) ``mounted`` paths, already mounted on the host, do not
    count. Empty means the private root shows the host exactly, plus the mounts."""
    hidden: list[str] = []
    spared = {str(p) for m in mounted for p in [Path(m), *Path(m).parents]}

    def walk(logical: Path, tree: dict[str, dict], top: bool) -> None:  # type: ignore[type-arg]
        if not tree:  # a mount path: whatever is there is covered, as by any mount
            return
        real = host_root / logical.relative_to("/")
        if not top and real.is_dir():
            hidden.extend(str(real / name) for name in sorted(os.listdir(real))
                          if name not in tree and str(logical / name) not in spared)
        for name, sub in tree.items():
            walk(logical / name, sub, False)

    walk(Path("/"), needed_tree(paths), True)
    return hidden


def _mirror(libc: ctypes.CDLL, entry: os.DirEntry[str], target: Path,
            skipped: list[str]) -> None:
    if entry.is_symlink():
        os.symlink(os.readlink(entry.path), target)
    elif entry.is_dir(follow_symlinks=False):
        target.mkdir()
        _mount(libc, entry.path, str(target), None, MS_BIND | MS_REC)
    else:  # files, and the device nodes, sockets and fifos of a directory like /dev
        target.touch()
        try:
            _mount(libc, entry.path, str(target), None, MS_BIND)
        except OSError:
            target.unlink()
            skipped.append(entry.path)


def _populate(libc: ctypes.CDLL, stage: Path, real: Path, tree: dict[str, dict],  # type: ignore[type-arg]
              skipped: list[str]) -> None:
    if real.is_dir():
        for entry in sorted(os.scandir(real), key=lambda e: e.name):
            if entry.name not in tree:
                _mirror(libc, entry, stage / entry.name, skipped)
    for name, sub in tree.items():
        (stage / name).mkdir()
        if sub:
            _populate(libc, stage / name, real / name, sub, skipped)


def enter_private_root(binds: Sequence[Bind], staging: Path) -> list[str]:
    """Move the calling thread into a private root showing the host plus ``binds``.

    ``staging`` is an empty directory the new root is built on (it stays empty on the host).
    Returns host entries that could not be mirrored (special files on the way to a mount
    path that refused a bind mount). Raises NamespaceUnavailable when no private mount
    namespace can be had; any other OSError means the namespace exists but was not completed (the thread's root is unchanged).
    """
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise NamespaceUnavailable(code, f"unshare(CLONE_NEWNS): {os.strerror(code)} "
                                         "(needs CAP_SYS_ADMIN)")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    staging.mkdir(parents=True, exist_ok=True)
    _mount(libc, "flow-root", str(staging), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    skipped: list[str] = []
    _populate(libc, staging, Path("/"), needed_tree([b.path for b in binds]), skipped)
    for bind in binds:
        target = str(staging / bind.path.lstrip("/"))
        _mount(libc, str(bind.source), target, None, MS_BIND | MS_REC)
        if bind.read_only:
            _remount_read_only(libc, target)
    _remount_read_only(libc, str(staging))
    cwd = os.getcwd()
    os.chroot(staging)
    os.chdir(cwd)
    # The recursive binds copied the staging mount into the tree it sits in: drop that copy.
    copy = str(staging)
    if os.path.ismount(copy):
        _check(libc.umount2(os.fsencode(copy), MNT_DETACH), f"umount {copy}")
    return skipped


def bind_file(source: Path, target: str) -> None:
    """Show the file ``source`` at ``target`` (an existing file) in this namespace only; call
    after ``enter_private_root``, whose namespace propagates nothing back to the host."""
    _mount(_libc(), str(source), target, None, MS_BIND)
