"""Serialization of calls and results: cloudpickle inside a digest-checked envelope.

Functions defined in ``__main__``, closures and lambdas pickle by value. So do functions from
the caller's own modules that are not installed packages (a test file, a sibling module of a
script): nodes do not have the caller's source tree, so those are shipped by value too.

The digest here catches accidents only. What authenticates a payload is the task's secret
(``flow_sdk.wire.signing``): the signed task record names the payload's digest, and results and
error payloads are sealed by the node that uploads them and checked before ``loads``.
"""

from __future__ import annotations

import dis
import hashlib
import importlib
import io
import sys
import sysconfig
import types
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from flow_sdk.errors import PayloadError

_MAGIC = b"FLOW1"
_DIGEST_LEN = 64


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _installed_roots() -> tuple[Path, ...]:
    """This interpreter's standard library and site directories, and every other site
    directory on ``sys.path`` (one a ``.pth`` file names, such as a base image's packages
    seen from a venv of its own): what is under them is installed, not the caller's code."""
    paths = sysconfig.get_paths()
    roots = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(Path(entry).resolve() for entry in sys.path
                 if Path(entry).name in ("site-packages", "dist-packages"))
    return tuple(sorted(roots))


def _ship_by_value(module: types.ModuleType | None) -> bool:
    """True for a module of the caller's own code (not stdlib, not installed, not flow_sdk)."""
    if module is None or module.__name__ == "__main__":
        return False
    if module.__name__.split(".")[0] in ("flow_sdk",) or module.__name__ in sys.builtin_module_names:
        return False
    file = getattr(module, "__file__", None)
    if not file:
        return False
    resolved = Path(file).resolve()
    return not any(resolved.is_relative_to(root) for root in _installed_roots())


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` (cloudpickle) into an envelope carrying its SHA-256 digest."""
    try:
        body = cloudpickle.dumps(obj, protocol=5)
    except Exception as exc:  # pickling runs arbitrary __reduce__ code: any error is possible
        raise PayloadError(f"cannot serialize {type(obj).__name__}: {exc}. Return or pass only "
                           "picklable values (no open files, sockets, locks or CUDA handles).") from exc
    return _MAGIC + digest(body).encode() + body


def loads(data: bytes) -> Any:
    """Check the envelope's digest, then unpickle. A tampered or truncated blob is refused
    before any byte of it is unpickled."""
    header = len(_MAGIC) + _DIGEST_LEN
    if len(data) < header or not data.startswith(_MAGIC):
        raise PayloadError("not a flow-sdk payload (bad header); refusing to unpickle it")
    expected = data[len(_MAGIC):header].decode("ascii", errors="replace")
    body = data[header:]
    actual = digest(body)
    if actual != expected:
        raise PayloadError(f"payload digest mismatch (expected {expected[:16]}..., got "
                           f"{actual[:16]}...): the payload was modified or truncated; "
                           "refusing to unpickle it")
    return cloudpickle.loads(body)


CodeOrigins = dict[tuple[str, int], str]
"""(function name, first line) -> the file on the caller's machine, for every code object a
call ships by value. Newer cloudpickle releases rename those files ``<dynamic-code>``; this is
how a remote traceback still names the caller's file (``flow_sdk.wire.tracebacks``)."""


@dataclass(frozen=True)
class Call:
    """What a task's payload holds: the function, its arguments and where its code came from."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    origins: CodeOrigins


@dataclass(frozen=True)
class CallCode:
    """The code half of a call stored in two parts: the function and where its code came
    from. Content-addressed apart from the arguments, so an unchanged function is stored (and
    fetched by a pool node) once, however often it is called."""

    fn: Callable[..., Any]
    origins: CodeOrigins


@dataclass(frozen=True)
class CallArgs:
    """The arguments half of a call stored in two parts."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class PackedCall:
    """A call as two envelopes: its code and its arguments (``pack_parts``), and the
    top-level names of the modules the call imports or refers to, its arguments' included
    (``torch`` for a function that runs ``import torch``, or for a tensor argument): a node
    may import those once, before its workers start."""

    code: bytes
    args: bytes
    imports: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NodeEntry:
    """A node-side function named by its module and name: the caller ships a call to it
    without importing node code, and the node imports it when the call runs."""

    module: str
    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)


class _Scan(cloudpickle.Pickler):
    """A pickling pass whose bytes are thrown away. It notes which of the caller's own modules
    the object uses (modules it refers to, ``import mylib; mylib.f()``, and those its functions
    and classes come from, ``from mylib import f``) and the file of every code object that
    pickles by value, and the top-level names of every module the object imports or refers
    to."""

    def __init__(self, file: io.BytesIO) -> None:
        self.modules: dict[str, types.ModuleType] = {}
        self.origins: CodeOrigins = {}
        self.imports: set[str] = set()
        # Read by the C pickler when it is created, so it is set before that.
        self.dispatch_table = ChainMap({types.CodeType: self._note_code},
                                       cloudpickle.Pickler.dispatch_table)
        super().__init__(file, protocol=5)

    def _note_code(self, code: types.CodeType) -> Any:
        self.origins[(code.co_name, code.co_firstlineno)] = code.co_filename
        self.imports.update(str(i.argval).split(".")[0] for i in dis.get_instructions(code)
                            if i.opname == "IMPORT_NAME" and i.argval)
        return cloudpickle.Pickler.dispatch_table[types.CodeType](code)

    def reducer_override(self, obj: Any) -> Any:
        module: types.ModuleType | None = None
        if isinstance(obj, types.ModuleType):
            module = obj
        elif isinstance(obj, (types.FunctionType, type)):
            module = sys.modules.get(getattr(obj, "__module__", "") or "")
        root_name = module.__name__.split(".")[0] if module is not None else ""
        if root_name:
            self.imports.add(root_name)
        if module is not None and _ship_by_value(module):
            root = sys.modules.get(root_name)
            # A local package travels whole (its submodules import each other by name).
            chosen = root if root is not None and _ship_by_value(root) else module
            self.modules[chosen.__name__] = chosen
        return super().reducer_override(obj)


def _included(names: Sequence[str]) -> list[types.ModuleType]:
    """The modules named in ``include=[...]``, imported here so they can travel by value."""
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ImportError as exc:
            raise PayloadError(f"include: cannot import {name!r} here ({exc}); list modules "
                               "this Python can import") from None
    return found


@contextmanager
def _by_value(modules: Iterable[types.ModuleType]) -> Iterator[None]:
    """Pickle ``modules`` by value inside the block (those already registered stay so)."""
    already = set(cloudpickle.list_registry_pickle_by_value())
    added = [m for m in modules if m.__name__ not in already]
    for module in added:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in added:
            cloudpickle.unregister_pickle_by_value(module)


def _scan(call: Any, fn: Callable[..., Any]) -> _Scan:
    try:
        scan = _Scan(io.BytesIO())
        scan.dump(call)
    except Exception as exc:  # pickling runs arbitrary __reduce__ code: any error
        raise PayloadError(f"cannot serialize the call of {getattr(fn, '__name__', fn)!r}: "
                           f"{exc}. Pass only picklable arguments.") from exc
    return scan


def pack_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              include: Sequence[str] = ()) -> bytes:
    """The envelope for one call of ``fn``, code and arguments together (see ``_pack``)."""
    blobs, _ = _pack(fn, args, kwargs, include, lambda origins: [
        dumps(Call(fn, args, kwargs, origins))])
    return blobs[0]


def pack_parts(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               include: Sequence[str] = ()) -> PackedCall:
    """One call of ``fn`` as two envelopes, its code and its arguments, pickled with the same
    modules by value (see ``_pack``): what a task stores, so unchanged code is not stored
    again."""
    (code, arguments), imports = _pack(fn, args, kwargs, include, lambda origins: [
        dumps(CallCode(fn, origins)), dumps(CallArgs(args, kwargs))])
    return PackedCall(code, arguments, imports)


def _pack(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
          include: Sequence[str], pickle: Callable[[CodeOrigins], list[bytes]]
          ) -> tuple[list[bytes], frozenset[str]]:
    """The envelopes for one call of ``fn``, and the modules the call imports or refers to
    (``PackedCall.imports``). The caller's own modules (files outside the
    installed environment: neither the standard library nor site-packages) that the call
    reaches travel by value, since nodes do not have the caller's source tree: functions and
    classes from them, and modules used by name (``import mylib; mylib.f()``), also through
    the modules that travel by value (scanned again until no new one turns up). ``include``
    names more modules to ship by value (e.g. an installed package the nodes lack)."""
    call = (fn, args, kwargs)
    modules = {m.__name__: m for m in _included(include)}
    with ExitStack() as registered:
        registered.enter_context(_by_value(modules.values()))
        while True:
            scan = _scan(call, fn)
            new = [m for name, m in scan.modules.items() if name not in modules]
            if not new:
                break
            modules.update((m.__name__, m) for m in new)
            registered.enter_context(_by_value(new))
        return pickle(scan.origins), frozenset(scan.imports)


def unpack_call(blob: bytes) -> Call:
    """The call in an envelope made by :func:`pack_call` (its digest checked first)."""
    call = loads(blob)
    if not isinstance(call, Call):
        raise PayloadError(f"the payload holds a {type(call).__name__}, not a call; refusing "
                           "to run it")
    return call


def unpack_parts(code: bytes, arguments: bytes) -> Call:
    """The call stored as :func:`pack_parts` made it (each envelope's digest checked first)."""
    part, given = loads(code), loads(arguments)
    if not isinstance(part, CallCode) or not isinstance(given, CallArgs):
        raise PayloadError(f"the payload holds a {type(part).__name__} and a "
                           f"{type(given).__name__}, not a call's code and arguments; refusing "
                           "to run it")
    return Call(part.fn, given.args, given.kwargs, part.origins)
