"""The caller's own SDK, packaged for the nodes: a wheel built from the installed package.

A cloud node must run the exact ``flow_sdk`` the caller runs, never whatever a package index
serves under a name. At launch the client packs the files of its installed ``flow_sdk``
package into a wheel, byte-for-byte reproducible (sorted entries, fixed timestamps), so the
same code always has the same SHA-256 and is stored once, content-addressed. The wheel's
metadata pins the SDK's dependencies to the versions installed beside the caller, so a node
resolves the same versions. A node checks the digest it was given in its launch
configuration before it installs anything (``verify``).

A provider plugged in from another distribution ships that distribution beside the SDK
(``build_distribution``): its packages, its entry points (so a node's registry finds it by
name) and its pinned requirements, packed the same way.

Wheels are cached in ``<flow home>/wheels/<source digest>.whl``: building again for unchanged
sources reads the cache and packs nothing.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import io
import os
import re
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flow_sdk._config import flow_home
from flow_sdk.errors import PayloadError, install_hint

DIST_NAME = "flow-gang-sdk"  # the distribution name; free on the public index (see README)
PACKAGE = "flow_sdk"
# Dependencies the nodes need besides the core ones: the aws extra. Torch and xgboost are not
# pinned: the node image brings them (a Deep Learning AMI), and reinstalling torch on every
# boot would cost minutes.
NODE_EXTRAS = ("aws",)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")
_REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class CodeIntegrityError(PayloadError):
    """The SDK wheel a node fetched is not the one the caller shipped."""


class PythonMismatchError(PayloadError):
    """The node runs another Python minor version than the caller."""


def require_python(caller: str) -> None:
    """Raise PythonMismatchError unless this interpreter's ``major.minor`` is ``caller``'s
    (a record without one, from an older client, is not checked)."""
    mine = python_version()
    if caller and caller != mine:
        raise PythonMismatchError(
            f"the task was launched from Python {caller}, but this node runs Python {mine}; "
            "the function and its arguments were pickled by cloudpickle, which does not work "
            f"across Python minor versions. Launch from Python {mine}, or run the nodes on "
            f"an image with Python {caller} (provider_config ami_id and image_python, or "
            "the task's image=)")


@dataclass(frozen=True)
class Wheel:
    """One packed distribution (the SDK, or a plug-in's): the wheel's file name, bytes and
    SHA-256, and what it pins."""

    filename: str
    data: bytes
    sha256: str
    requirements: tuple[str, ...]
    python: str  # "3.11": the caller's Python minor version; the node must run the same


def python_version() -> str:
    """The running interpreter's ``major.minor``."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def package_dir() -> Path:
    """The directory of the installed ``flow_sdk`` package this process runs (the package
    this module is part of)."""
    return Path(__file__).resolve().parents[1]


def package_files(root: Path, package: str = PACKAGE) -> list[tuple[str, bytes]]:
    """Every file of the package ``package`` whose folder is ``root`` as (archive path,
    bytes), sorted; compiled files and caches are left out."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            if name.endswith(_SKIP_SUFFIXES):
                continue
            path = Path(dirpath, name)
            arcname = f"{package}/{path.relative_to(root).as_posix()}"
            files.append((arcname, path.read_bytes()))
    return sorted(files)


def source_digest(files: Iterable[tuple[str, bytes]], requirements: Sequence[str],
                  version: str) -> str:
    """SHA-256 over the package's files, its pinned requirements and version."""
    h = hashlib.sha256()
    for arcname, data in files:
        h.update(arcname.encode() + b"\0" + hashlib.sha256(data).digest())
    h.update("\n".join([version, *requirements]).encode())
    return h.hexdigest()


def installed_version(dist: str = DIST_NAME) -> str:
    """The installed version of ``dist``; "0" when the package runs from a plain checkout."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "0"


def pinned_requirements(requires: Sequence[str], extras: Sequence[str] = NODE_EXTRAS
                        ) -> tuple[str, ...]:
    """``name==version`` for every requirement in ``requires`` (the SDK's Requires-Dist lines)
    that applies to the core or to ``extras`` and is installed here, sorted. Requirements of
    other extras are left out; one that applies but is not installed is an error, since the
    nodes could not resolve what the caller runs."""
    pins: dict[str, str] = {}
    for line in requires:
        spec, _, marker = line.partition(";")
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
        if extra is not None and extra.group(1) not in extras:
            continue
        if marker.strip() and extra is None:
            continue  # environment markers (python_version...) do not apply to the nodes' pins
        match = _REQ_NAME_RE.match(spec)
        if match is None:
            continue
        name = match.group(1).split("[")[0]
        if name.lower().replace("_", "-") == DIST_NAME:
            continue
        try:
            pins[name.lower()] = f"{name}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            raise PayloadError(install_hint("pinning the nodes' packages", name) + " (the "
                               "nodes install this machine's version of each)") from None
    return tuple(sorted(pins.values()))


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def pack(files: Sequence[tuple[str, bytes]], version: str, requirements: Sequence[str], *,
         dist_name: str = DIST_NAME, top_level: Sequence[str] = (PACKAGE,),
         info_files: Sequence[tuple[str, bytes]] = ()) -> tuple[str, bytes]:
    """A reproducible wheel of ``files``: (file name, bytes). ``info_files`` go into its
    dist-info folder as they are (a plug-in's ``entry_points.txt``)."""
    info = f"{_normal(dist_name)}-{version}.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {dist_name}", f"Version: {version}",
        f"Requires-Python: =={python_version()}.*",
        *(f"Requires-Dist: {r}" for r in requirements), "", ""])
    wheel = "\n".join(["Wheel-Version: 1.0", f"Generator: {PACKAGE}.sdkwheel",
                       "Root-Is-Purelib: true", "Tag: py3-none-any", "", ""])
    entries = [*files, (f"{info}/METADATA", metadata.encode()),
               (f"{info}/WHEEL", wheel.encode()),
               (f"{info}/top_level.txt", "".join(f"{t}\n" for t in top_level).encode()),
               *((f"{info}/{name}", data) for name, data in info_files)]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            item.compress_type = zipfile.ZIP_DEFLATED
            item.external_attr = 0o644 << 16
            archive.writestr(item, data)
    return wheel_name(version, dist_name), out.getvalue()


def _normal(dist_name: str) -> str:
    """The distribution's name as wheel file names spell it."""
    return re.sub(r"[-_.]+", "_", dist_name)


def wheel_name(version: str, dist_name: str = DIST_NAME) -> str:
    """The wheel's file name for ``version`` (pip reads name and version from it)."""
    return f"{_normal(dist_name)}-{version}-py3-none-any.whl"


def default_cache_dir() -> Path:
    """``<flow home>/wheels`` (``$FLOW_HOME``, else ``~/.flow``)."""
    return flow_home(create=False) / "wheels"


def build(cache_dir: Path | None = None, root: Path | None = None) -> Wheel:
    """The caller's SDK as a wheel, from the cache when its sources are unchanged."""
    files = package_files(root or package_dir())
    try:
        requires = importlib.metadata.requires(DIST_NAME) or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    return _cached(files, installed_version(), pinned_requirements(requires), cache_dir)


def build_distribution(dist_name: str, packages: Sequence[str],
                       cache_dir: Path | None = None) -> Wheel:
    """The installed distribution ``dist_name`` (a provider plug-in) as a wheel of its
    top-level ``packages`` (each a package folder or a single module, wherever it is
    installed from, an editable install too), its entry points and its requirements pinned to
    the versions installed here (the SDK's own left to the SDK's wheel); from the cache when
    unchanged."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise PayloadError(f"the distribution {dist_name!r} is not installed here, so its "
                           "wheel cannot be built for the nodes") from None
    files: list[tuple[str, bytes]] = []
    for package in sorted(set(packages)):
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None and not spec.submodule_search_locations:
            raise PayloadError(f"{dist_name} names the package {package!r}, which is not "
                               "importable here; reinstall the distribution")
        if spec.submodule_search_locations:
            files += package_files(Path(list(spec.submodule_search_locations)[0]), package)
        else:
            files.append((f"{package}.py", Path(str(spec.origin)).read_bytes()))
    entry_points = (dist.read_text("entry_points.txt") or "").encode()
    name = dist.metadata["Name"] or dist_name
    return _cached(sorted(files), dist.version, pinned_requirements(dist.requires or [], ()),
                   cache_dir, dist_name=name, top_level=sorted(set(packages)),
                   info_files=(("entry_points.txt", entry_points),))


def _cached(files: Sequence[tuple[str, bytes]], version: str, requirements: Sequence[str],
            cache_dir: Path | None, *, dist_name: str = DIST_NAME,
            top_level: Sequence[str] = (PACKAGE,),
            info_files: Sequence[tuple[str, bytes]] = ()) -> Wheel:
    """``pack``, read from the cache when these files, requirements and version were packed
    before."""
    key = source_digest([*files, *info_files], requirements, f"{dist_name} {version}"
                        if dist_name != DIST_NAME else version)
    cache = cache_dir or default_cache_dir()
    cached = cache / f"{key}.whl"
    filename = wheel_name(version, dist_name)
    if cached.is_file():
        data = cached.read_bytes()
    else:
        filename, data = pack(files, version, requirements, dist_name=dist_name,
                              top_level=top_level, info_files=info_files)
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = cache / f".{key}.{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    return Wheel(filename, data, hashlib.sha256(data).hexdigest(), tuple(requirements),
                 python_version())


def verify(data: bytes, expected_sha256: str, *, key: str = "the SDK wheel") -> None:
    """Raise CodeIntegrityError unless ``data`` has the digest the caller shipped."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise CodeIntegrityError(
            f"{key} has SHA-256 {actual}, but the caller shipped {expected_sha256}; the "
            "object was altered or replaced in the store. Nothing was installed.")
