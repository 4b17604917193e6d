"""Errors of the machines, on coldsnap's one tree (coldsnap._errors). Each names what is wrong
so an operator can act on it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from coldsnap._errors import (
    ColdsnapError,
    DefinitionError,
    EnvironmentMissing,
    OperationError,
    PluginError,
    RefusedError,
)

if TYPE_CHECKING:
    from ._receipt import Receipt


class SpecError(DefinitionError):
    """A spec is malformed; raised when the spec is defined, never at run time."""


class RegistryError(DefinitionError):
    """A driver, provider or engine is registered twice, or a request names one never registered."""


class ComponentError(DefinitionError):
    """A driver, provider, engine or store does not offer what a spec needs."""


class IllegalTransition(DefinitionError):
    """A trigger that the spec does not allow from the current state."""


class RequestError(ColdsnapError, ValueError):
    """A request is malformed; raised before any side effect."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        lines = [f"request field '{field}': {message}" for field, message in self.problems]
        super().__init__("\n".join(lines))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(field for field, _ in self.problems)


class StepTimeout(OperationError):
    """A step ran past its timeout."""


class Cancelled(OperationError):
    """The operation was cancelled; it compensates back like a failure."""


class MissingFact(OperationError):
    """A step needs a fact that no earlier step recorded (a journal from another version, or a
    component that did not return what its step declares it makes)."""


class UndeclaredFact(DefinitionError):
    """A step returned or recorded a fact its spec does not declare it makes."""


class UndeclaredRead(DefinitionError):
    """A step read a fact it does not declare (in `needs`, `uses` or `makes`): what a step reads
    must be written on it, so that the spec check and a reader can follow the data."""


class JournalError(OperationError):
    """A journal cannot be read or does not belong to this machine."""


class JournalUnwritable(OperationError):
    """The journal (or the receipt) could not be written, say the disk is full. The run still
    compensated what it had done; the records it could not write are the ones a later
    `resume` needs, so the message says what to run once the disk has room. `receipt` is the
    run's result as far as this process knows it (None where the run never ended)."""

    def __init__(self, message: str, receipt: Receipt | None = None) -> None:
        super().__init__(message)
        self.receipt = receipt


class MachineBusy(OperationError, RuntimeError):
    """This Machine is already running an operation (one at a time per Machine)."""


class InvalidFacts(DefinitionError, TypeError):
    """A step returned facts that are not a JSON-able mapping."""


class Interrupted(OperationError):
    """The orchestrator stopped during a step that cannot be retried: the resume compensates."""


BRANCHES: tuple[type[ColdsnapError], ...] = (
    DefinitionError,
    RequestError,
    OperationError,
    RefusedError,
    PluginError,
)
"""The branches of coldsnap's exception tree, by what the caller does next (coldsnap._errors)."""
UNEXPECTED = "unexpected"


def branch_of(exc: BaseException) -> str:
    """The name of the branch `exc` belongs to, or 'unexpected' for an error coldsnap did not
    raise on purpose (a builtin from a component)."""
    return next((b.__name__ for b in BRANCHES if isinstance(exc, b)), UNEXPECTED)


def environment_missing(exc: BaseException) -> bool:
    """Whether `exc` says this host lacks what the operation needs."""
    return isinstance(exc, EnvironmentMissing | ModuleNotFoundError)


__all__ = [
    "BRANCHES",
    "UNEXPECTED",
    "Cancelled",
    "ColdsnapError",
    "ComponentError",
    "DefinitionError",
    "EnvironmentMissing",
    "IllegalTransition",
    "Interrupted",
    "InvalidFacts",
    "JournalError",
    "JournalUnwritable",
    "MachineBusy",
    "MissingFact",
    "OperationError",
    "PluginError",
    "RefusedError",
    "RegistryError",
    "RequestError",
    "SpecError",
    "StepTimeout",
    "UndeclaredFact",
    "UndeclaredRead",
    "branch_of",
    "environment_missing",
]
