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
import io
import sys
import sysconfig
import types
from collections.abc import Callable
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
    """A pickling pass that only notes which of the caller's own modules the object uses."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5)
        self.modules: dict[str, types.ModuleType] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)):
            module = sys.modules.get(getattr(obj, "__module__", "") or "")
            if module is not None and _ship_by_value(module):
                self.modules[module.__name__] = module
        return super().reducer_override(obj)


def pack_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """The envelope for one call of ``fn``. Functions and classes from the caller's own
    modules, anywhere in the call (the function, its arguments, their attributes), travel by
    value: nodes do not have the caller's source tree."""
    call = (fn, args, kwargs)
    scan = _OwnModules(io.BytesIO())
    try:
        scan.dump(call)
    except Exception as exc:  # pickling runs arbitrary __reduce__ code: any error is possible
        raise PayloadError(f"cannot serialize the call of {getattr(fn, '__name__', fn)!r}: "
                           f"{exc}. Pass only picklable arguments.") from exc
    already = set(cloudpickle.list_registry_pickle_by_value())
    added = [m for name, m in scan.modules.items() if name not in already]
    for module in added:
        cloudpickle.register_pickle_by_value(module)
    try:
        return dumps(call)
    finally:
        for module in added:
            cloudpickle.unregister_pickle_by_value(module)
