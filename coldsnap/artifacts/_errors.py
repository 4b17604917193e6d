"""Errors of the artifacts layer. Each message names the field or object that is wrong."""

from __future__ import annotations

from collections.abc import Sequence

from coldsnap._errors import RefusedError


class ArtifactError(RefusedError):
    """Base of every error the artifacts layer raises on purpose: integrity or compatibility
    refuses to go on (a malformed record, a damaged object, a capture that does not fit)."""


class RecordError(ArtifactError, ValueError):
    """A record read from disk (or built by a caller) is malformed; one problem per line."""

    def __init__(self, what: str, problems: Sequence[tuple[str, str]]) -> None:
        self.what = what
        self.problems = tuple(problems)
        lines = [f"{what}: {field}: {message}" for field, message in self.problems]
        super().__init__("\n".join(lines) or f"{what}: malformed")

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(field for field, _ in self.problems)


class StoreError(ArtifactError):
    """The store refuses an operation (bad name, symlink, missing object, wrong filesystem)."""


class NoCapsule(StoreError):
    """No published capsule answers to a name: a tag or digest the store does not hold, or a
    short digest that begins no capsule's digest or several (a request to correct, not damage)."""


class IntegrityError(StoreError):
    """Stored bytes do not hash to the digest that names them."""


class IncompatibleArtifact(ArtifactError):
    """A captured identity does not match the runtime's; `differences` lists each field."""

    def __init__(self, differences: Sequence[object], message: str) -> None:
        self.differences = tuple(differences)
        super().__init__(message)
