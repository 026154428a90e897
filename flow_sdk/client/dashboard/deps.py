"""The web packages the dashboard runs on (the ``ui`` extra), checked before anything
imports them, so that a missing one is one line saying how to install it."""

from __future__ import annotations

import importlib.util

from flow_sdk.errors import FlowError, install_hint

# import name -> distribution name on the package index
WEB_PACKAGES: dict[str, str] = {"starlette": "starlette", "uvicorn": "uvicorn",
                                "sse_starlette": "sse-starlette", "jinja2": "jinja2"}


class DashboardUnavailableError(FlowError):
    """The web packages ``flow ui`` needs are not installed."""


def missing_packages() -> list[str]:
    """The distributions of ``WEB_PACKAGES`` that cannot be imported here."""
    missing = []
    for module, dist in WEB_PACKAGES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules
            found = False
        if not found:
            missing.append(dist)
    return missing


def require_web_packages() -> None:
    """Raise ``DashboardUnavailableError`` naming the install line when one is missing."""
    if missing_packages():
        raise DashboardUnavailableError(install_hint(
            "flow ui", "starlette", "uvicorn", "sse-starlette", "jinja2"))
