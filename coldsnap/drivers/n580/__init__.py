"""n580: a context-free pre-exec template, restored and released into engine construction."""

from ._driver import N580Driver

__all__ = ["N580Driver"]
