"""A submodule of the local package, reached through the package."""

from __future__ import annotations


def triple(x: int) -> int:
    return 3 * x
