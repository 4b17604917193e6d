"""What a step's action receives, and what it may return."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from attrs import define, field, frozen

from ._errors import Cancelled, StepTimeout
from ._requests import Request
from ._spec import Spec, Step


@frozen
class Skipped:
    """Returned by an action that had nothing to do (say, CUDA steps for a process without CUDA)."""

    reason: str


@define
class StepContext:
    """The request, the facts earlier steps recorded, the step's deadline and cancellation.

    Actions poll `check()` in long waits so that timeouts and cancellation stop them promptly,
    and `record()` facts as soon as they exist (a PID right after a spawn) so that a resumed or
    compensating machine can find what they made even if the step never returns.
    """

    request: Request
    spec: Spec
    step: Step
    workdir: Path
    deadline: float
    _facts: dict[str, Any]
    _cancel: threading.Event
    _record: Callable[[dict[str, Any]], None]
    compensating: bool = False
    log: list[str] = field(factory=list)
    _show: Callable[[str], None] = lambda _detail: None
    _shown: dict[str, float] = field(factory=dict)  # what: when it was last shown

    @property
    def facts(self) -> Mapping[str, Any]:
        return MappingProxyType(self._facts)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raises if the operation was cancelled or the step ran out of time."""
        if self._cancel.is_set() and not self.compensating:
            raise Cancelled(f"step '{self.step.name}' was cancelled")
        if time.monotonic() > self.deadline:
            raise StepTimeout(f"step '{self.step.name}' ran past {self.step.timeout_s:g} s")

    def record(self, **facts: Any) -> None:
        """Journals facts now, before the step ends."""
        self._record(facts)  # refuses a fact the step does not declare it makes
        self._facts.update(facts)

    def advance(self, what: str, done: int, total: int, started: float) -> None:
        """Shows how far a long piece of work is (bytes of `total`, and the rate since
        `started`, a time.monotonic()) to the run's subscribers, at most every PROGRESS_EVERY_S
        seconds and at the end; never journaled: it is for the operator watching, not a resume."""
        now = time.monotonic()
        if done < total and now - self._shown.get(what, 0.0) < PROGRESS_EVERY_S:
            return
        self._shown[what] = now
        rate = done / (now - started) if now > started else 0.0
        self._show(f"{what} {_gib(done)} of {_gib(total)} GiB, {_gib(rate)} GiB/s")


PROGRESS_EVERY_S = 0.5


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f}"
