"""The SDK's version, in a module of its own so that any part can read it without importing
the top package."""

__version__ = "0.1.0"
