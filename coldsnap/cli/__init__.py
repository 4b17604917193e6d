"""The `coldsnap` command line (click)."""

from ._main import main

__all__ = ["main"]
