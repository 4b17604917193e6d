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
class Receipt:
    """The result of one capture or restore. `outcome` is terminal: done, rolled_back or failed
    (failed means a compensation failed too, and `compensations` says which)."""

    operation: str
    spec: str
    outcome: Outcome
    steps: tuple[StepRecord, ...]
    compensations: tuple[StepRecord, ...] = ()
    facts: dict[str, Any] = field(factory=dict)
    error: str | None = None
    seconds: float = 0.0
    resumed: bool = False
    workdir: str = ""
    format: int = 1
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
