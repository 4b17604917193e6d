"""Errors of the machines. Each names what is wrong so an operator can act on it."""

from __future__ import annotations

from collections.abc import Sequence


class ColdsnapError(Exception):
    """Base of every error coldsnap raises on purpose."""


class SpecError(ColdsnapError):
    """A spec is malformed; raised when the spec is defined, never at run time."""


class RequestError(ColdsnapError, ValueError):
    """A request is malformed; raised before any side effect."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        lines = [f"request field '{field}': {message}" for field, message in self.problems]
        super().__init__("\n".join(lines))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(field for field, _ in self.problems)


class ComponentError(ColdsnapError):
    """A driver, provider, engine or store does not offer what a spec needs."""


class IllegalTransition(ColdsnapError):
    """A trigger that the spec does not allow from the current state."""


class StepTimeout(ColdsnapError):
    """A step ran past its timeout."""


class Cancelled(ColdsnapError):
    """The operation was cancelled; it compensates back like a failure."""


class JournalError(ColdsnapError):
    """A journal cannot be read or does not belong to this machine."""
