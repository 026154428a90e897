"""A module beside the tests, not installed: it must travel with a function that uses it."""

from __future__ import annotations


def f(x: int) -> str:
    return f"helper_mod.f({x})"
