"""Errors the drivers raise for runtime conditions, on coldsnap's one tree (coldsnap._errors).
A driver misconfigured by its embedder raises coldsnap.machine.ComponentError instead."""

from __future__ import annotations

from coldsnap._errors import OperationError


class DriverError(OperationError):
    """A driver's step could not do its work."""


class TemplateEnded(DriverError):
    """An n580 template process ended before it reached the state the step waited for."""


__all__ = ["DriverError", "TemplateEnded"]
