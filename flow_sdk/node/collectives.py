"""A deadline for collectives, so a rank that never joins fails the job instead of hanging it.

The agent adds :func:`collective_env` to each worker's environment; the worker calls
:func:`install_default_timeout` before the user's function runs. torch.distributed then makes
every process group the user creates without ``timeout=`` wait at most that long for a
collective (all backends); an explicit ``timeout=`` still wins. torch is not imported for it:
the defaults are set when the user's code imports torch.distributed, if it ever does.

Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from types import ModuleType

from flow_sdk.wire import envvars

DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
C10D_MODULE = "torch.distributed.distributed_c10d"
# The watchdog's heartbeat may lag this long behind the collective timeout before the
# monitoring thread gives up on it.
HEARTBEAT_MARGIN_S = 60

# Each NCCL variable with the older names torch still reads for it: a user who sets any of
# them keeps their value.
_NCCL_ALIASES: dict[str, tuple[str, ...]] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("NCCL_ASYNC_ERROR_HANDLING",),
    "TORCH_NCCL_ENABLE_MONITORING": (),
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": (),
}

__all__ = ["C10D_MODULE", "DEFAULT_COLLECTIVE_TIMEOUT_S", "collective_env", "install_default_timeout", "timeout_from_env"]


def collective_env(timeout_s: float, user_env: Mapping[str, str]) -> dict[str, str]:
    """The variables the agent adds to each worker's environment, less those ``user_env``
    sets (the user's value wins):

    * ``FLOW_COLLECTIVE_TIMEOUT_S``: the default collective timeout, read by
      :func:`install_default_timeout` in the worker.
    * ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` (older name ``NCCL_ASYNC_ERROR_HANDLING``): when a
      collective times out or NCCL fails, torch's watchdog aborts the communicators and tears
      the process down (mode 1, TearDown), so the worker exits instead of waiting forever.
    * ``TORCH_NCCL_ENABLE_MONITORING=1``: a monitoring thread aborts the process when the
      watchdog itself is stuck (a hung CUDA or NCCL call) and sends no heartbeat for
      ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``.
    * ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``: that heartbeat timeout, the collective timeout
      plus 60 s, so the watchdog's own timeout handling goes first.
    """
    if not timeout_s > 0:
        raise ValueError(f"the collective timeout must be positive, not {timeout_s}")
    wanted = {
        envvars.COLLECTIVE_TIMEOUT_S: repr(float(timeout_s)),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(math.ceil(timeout_s) + HEARTBEAT_MARGIN_S),
    }
    return {name: value for name, value in wanted.items()
            if not _user_sets(name, user_env)}


def _user_sets(name: str, user_env: Mapping[str, str]) -> bool:
    return any(alias in user_env for alias in (name, *_NCCL_ALIASES.get(name, ())))


def timeout_from_env(environ: Mapping[str, str]) -> timedelta | None:
    """The collective timeout ``environ`` asks for; None when it asks for none (unset, empty
    or not above zero: torch's own defaults stay)."""
    text = environ.get(envvars.COLLECTIVE_TIMEOUT_S, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"{envvars.COLLECTIVE_TIMEOUT_S}={text!r} is not a number of "
                         "seconds") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{envvars.COLLECTIVE_TIMEOUT_S}={text!r} is not a finite number "
                         "of seconds")
    return timedelta(seconds=seconds) if seconds > 0 else None


def install_default_timeout() -> None:
    """Make ``FLOW_COLLECTIVE_TIMEOUT_S`` torch.distributed's default process-group timeout
    for every backend: now if torch.distributed is loaded, else when it is imported."""
    timeout = timeout_from_env(os.environ)
    if timeout is None:
        return
    module = sys.modules.get(C10D_MODULE)
    if module is not None:
        _set_defaults(module, timeout)
        return
    if not any(isinstance(finder, _DefaultsOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DefaultsOnImport(timeout))


def _set_defaults(c10d: ModuleType, timeout: timedelta) -> None:
    """Set the module globals ``_get_default_timeout(backend)`` returns. The NCCL one stays
    None where torch was built without NCCL."""
    c10d.default_pg_timeout = timeout
    if getattr(c10d, "default_pg_nccl_timeout", None) is not None:
        c10d.default_pg_nccl_timeout = timeout


class _DefaultsOnImport(importlib.abc.MetaPathFinder):
    """Lets the import of torch.distributed's c10d module run as usual, then sets its default
    timeouts. Used once: it leaves ``sys.meta_path`` when it finds the module."""

    def __init__(self, timeout: timedelta) -> None:
        self.timeout = timeout

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != C10D_MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        loader.exec_module = _then_set_defaults(  # type: ignore[method-assign]
            loader.exec_module, self.timeout)
        return spec


def _then_set_defaults(exec_module: Callable[[ModuleType], None],
                       timeout: timedelta) -> Callable[[ModuleType], None]:
    def run(module: ModuleType) -> None:
        exec_module(module)
        _set_defaults(module, timeout)

    return run
