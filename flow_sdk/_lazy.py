"""Public names a package re-exports, imported from their modules on first use: a process that
imports one submodule (every node process imports ``flow_sdk``'s) does not pay for the rest."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, namespace: dict[str, Any], where: Mapping[str, str]
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (its globals: ``namespace``), which
    re-exports each name of ``where`` from the module it maps to (a name that is the module's
    own last part is the module itself). A name is imported once, then kept in ``namespace``."""

    def __getattr__(name: str) -> Any:
        module_name = where.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        value = module if module_name.endswith(f".{name}") else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
