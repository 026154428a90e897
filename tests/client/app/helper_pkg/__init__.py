"""A local package, not installed: it travels whole with a function that uses it."""

from helper_pkg.calc import triple

__all__ = ["triple"]
