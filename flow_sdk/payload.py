"""Serialization of calls and results: cloudpickle inside a digest-checked envelope.

Functions defined in ``__main__``, closures and lambdas pickle by value. So do functions from
the caller's own modules that are not installed packages (a test file, a sibling module of a
script): nodes do not have the caller's source tree, so those are shipped by value too.

The digest here catches accidents only. What authenticates a payload is the task's secret
(``flow_sdk.signing``): the signed task record names the payload's digest, and results and
error payloads are sealed by the node that uploads them and checked before ``loads``.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import sys
import sysconfig
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from flow_sdk.errors import PayloadError

_MAGIC = b"FLOW1"
_DIGEST_LEN = 64


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _installed_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    roots = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
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


class _OwnModules(cloudpickle.Pickler):
    """A pickling pass that only notes which of the caller's own modules the object uses:
    modules it refers to (``import mylib; mylib.f()``) and those its functions and classes
    come from (``from mylib import f``)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5)
        self.modules: dict[str, types.ModuleType] = {}

    def reducer_override(self, obj: Any) -> Any:
        module: types.ModuleType | None = None
        if isinstance(obj, types.ModuleType):
            module = obj
        elif isinstance(obj, (types.FunctionType, type)):
            module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is not None and _ship_by_value(module):
            root = sys.modules.get(module.__name__.split(".")[0])
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


def _own_modules(call: Any, fn: Callable[..., Any]) -> dict[str, types.ModuleType]:
    """Every module of the caller's own code the call reaches, also through the modules that
    travel by value (scanned again until no new one turns up)."""
    modules: dict[str, types.ModuleType] = {}
    registered: list[types.ModuleType] = []
    try:
        while True:
            scan = _OwnModules(io.BytesIO())
            try:
                scan.dump(call)
            except Exception as exc:  # pickling runs arbitrary __reduce__ code: any error
                raise PayloadError(f"cannot serialize the call of "
                                   f"{getattr(fn, '__name__', fn)!r}: {exc}. Pass only "
                                   "picklable arguments.") from exc
            new = {n: m for n, m in scan.modules.items() if n not in modules}
            if not new:
                return modules
            modules.update(new)
            already = set(cloudpickle.list_registry_pickle_by_value())
            for module in new.values():
                if module.__name__ not in already:
                    cloudpickle.register_pickle_by_value(module)
                    registered.append(module)
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def pack_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              include: Sequence[str] = ()) -> bytes:
    """The envelope for one call of ``fn``. The caller's own modules (files outside the
    installed environment: neither the standard library nor site-packages) that the call
    reaches travel by value, since nodes do not have the caller's source tree: functions and
    classes from them, and modules used by name (``import mylib; mylib.f()``). ``include``
    names more modules to ship by value (e.g. an installed package the nodes lack)."""
    call = (fn, args, kwargs)
    modules = {m.__name__: m for m in _included(include)}
    modules.update(_own_modules(call, fn))
    already = set(cloudpickle.list_registry_pickle_by_value())
    added = [m for name, m in modules.items() if name not in already]
    for module in added:
        cloudpickle.register_pickle_by_value(module)
    try:
        return dumps(call)
    finally:
        for module in added:
            cloudpickle.unregister_pickle_by_value(module)
