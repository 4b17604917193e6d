"""Receipts (what an operation did, step by step, with timings) and step events."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from attrs import field, frozen

from coldsnap._atomic import write_json_atomic

Outcome = Literal["done", "rolled_back", "failed"]
RECEIPT_NAME = "receipt.json"


@frozen(kw_only=True)
class StepRecord:
    """One step's (or compensation's) result: done, skipped, failed, compensated, ..."""

    name: str
    status: str
    seconds: float
    detail: str = ""


@frozen(kw_only=True)
class ErrorRecord:
    """The error that ended an operation, typed: its class name, its branch of coldsnap's
    exception tree (DefinitionError, RequestError, OperationError, RefusedError, PluginError,
    or 'unexpected'), the step it came from (None before any step: a cancellation), its
    message, and whether it says this host lacks what the operation needs (`environment`)."""

    type: str
    branch: str
    step: str | None
    message: str
    environment: bool = False

    @classmethod
    def of(cls, exc: BaseException, step: str | None) -> ErrorRecord:
        from ._errors import branch_of, environment_missing

        return cls(
            type=type(exc).__name__,
            branch=branch_of(exc),
            step=step,
            message=str(exc),
            environment=environment_missing(exc),
        )

    def line(self) -> str:
        """The error as one `Type: message` line (what `Receipt.error` holds)."""
        return f"{self.type}: {self.message}"


@frozen(kw_only=True)
class Receipt:
    """The result of one operation. `outcome` is terminal: done, rolled_back or failed (failed
    means a compensation failed too, and `compensations` says which). `error` is the error
    that ended it as one line, `failure` the same error typed (format 2)."""

    operation: str
    spec: str
    outcome: Outcome
    steps: tuple[StepRecord, ...]
    compensations: tuple[StepRecord, ...] = ()
    facts: dict[str, Any] = field(factory=dict)
    error: str | None = None
    failure: ErrorRecord | None = None
    seconds: float = 0.0
    resumed: bool = False
    workdir: str = ""
    format: int = 2
    kind: str = "coldsnap.receipt"

    @property
    def ok(self) -> bool:
        return self.outcome == "done"

    def timings(self) -> dict[str, float]:
        return {s.name: s.seconds for s in self.steps}

    def write(self, workdir: Path) -> Path:
        from ._convert import unstructure

        return write_json_atomic(workdir / RECEIPT_NAME, unstructure(self))


@frozen(kw_only=True)
class StepEvent:
    """Delivered to subscribers as a run progresses."""

    operation: str
    spec: str
    step: str
    phase: str
    seconds: float = 0.0
    detail: str = ""
    facts: dict[str, Any] | None = None
    """For a step's recorded progress: the facts it recorded, by name (`detail` shows them as
    text); None for every other event."""
