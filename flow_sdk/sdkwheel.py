"""The caller's own SDK, packaged for the nodes: a wheel built from the installed package.

A cloud node must run the exact ``flow_sdk`` the caller runs, never whatever a package index
serves under a name. At launch the client packs the files of its installed ``flow_sdk``
package into a wheel, byte-for-byte reproducible (sorted entries, fixed timestamps), so the
same code always has the same SHA-256 and is stored once, content-addressed. The wheel's
metadata pins the SDK's dependencies to the versions installed beside the caller, so a node
resolves the same versions. A node checks the digest it was given in its launch
configuration before it installs anything (``verify``).

Wheels are cached in ``<flow home>/wheels/<source digest>.whl``: building again for unchanged
sources reads the cache and packs nothing.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
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
class SdkWheel:
    """One packed SDK: the wheel's file name, bytes and SHA-256, and what it pins."""

    filename: str
    data: bytes
    sha256: str
    requirements: tuple[str, ...]
    python: str  # "3.11": the caller's Python minor version; the node must run the same


def python_version() -> str:
    """The running interpreter's ``major.minor``."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def package_dir() -> Path:
    """The directory of the installed ``flow_sdk`` package this process runs (this module's
    own package)."""
    return Path(__file__).resolve().parent


def package_files(root: Path) -> list[tuple[str, bytes]]:
    """Every file of the package under ``root`` as (archive path, bytes), sorted; compiled
    files and caches are left out."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            if name.endswith(_SKIP_SUFFIXES):
                continue
            path = Path(dirpath, name)
            arcname = f"{PACKAGE}/{path.relative_to(root).as_posix()}"
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


def pack(files: Sequence[tuple[str, bytes]], version: str, requirements: Sequence[str]
         ) -> tuple[str, bytes]:
    """A reproducible wheel of ``files``: (file name, bytes)."""
    dist = DIST_NAME.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {DIST_NAME}", f"Version: {version}",
        f"Requires-Python: =={python_version()}.*",
        *(f"Requires-Dist: {r}" for r in requirements), "", ""])
    wheel = "\n".join(["Wheel-Version: 1.0", f"Generator: {PACKAGE}.sdkwheel",
                       "Root-Is-Purelib: true", "Tag: py3-none-any", "", ""])
    entries = [*files, (f"{info}/METADATA", metadata.encode()),
               (f"{info}/WHEEL", wheel.encode()),
               (f"{info}/top_level.txt", f"{PACKAGE}\n".encode())]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            item.compress_type = zipfile.ZIP_DEFLATED
            item.external_attr = 0o644 << 16
            archive.writestr(item, data)
    return wheel_name(version), out.getvalue()


def wheel_name(version: str) -> str:
    """The wheel's file name for ``version`` (pip reads name and version from it)."""
    return f"{DIST_NAME.replace('-', '_')}-{version}-py3-none-any.whl"


def default_cache_dir() -> Path:
    """``<flow home>/wheels`` (``$FLOW_HOME``, else ``~/.flow``)."""
    return flow_home(create=False) / "wheels"


def build(cache_dir: Path | None = None, root: Path | None = None) -> SdkWheel:
    """The caller's SDK as a wheel, from the cache when its sources are unchanged."""
    root = root or package_dir()
    files = package_files(root)
    version = installed_version()
    try:
        requires = importlib.metadata.requires(DIST_NAME) or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    requirements = pinned_requirements(requires)
    key = source_digest(files, requirements, version)
    cache = cache_dir or default_cache_dir()
    cached = cache / f"{key}.whl"
    if cached.is_file():
        filename, data = wheel_name(version), cached.read_bytes()
    else:
        filename, data = pack(files, version, requirements)
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = cache / f".{key}.{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    return SdkWheel(filename, data, hashlib.sha256(data).hexdigest(), requirements,
                    python_version())


def verify(data: bytes, expected_sha256: str, *, key: str = "the SDK wheel") -> None:
    """Raise CodeIntegrityError unless ``data`` has the digest the caller shipped."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise CodeIntegrityError(
            f"{key} has SHA-256 {actual}, but the caller shipped {expected_sha256}; the "
            "object was altered or replaced in the store. Nothing was installed.")
