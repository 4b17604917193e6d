"""What a step's action receives, and what it may return."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from attrs import define, field, frozen

from ._errors import Cancelled, SpecError, StepTimeout, UndeclaredRead
from ._facts import Fact
from ._requests import Request
from ._spec import Spec, Step
from ._steps import CAPSULE


@frozen
class Skipped:
    """Returned by an action that had nothing to do (say, CUDA steps for a process without CUDA)."""

    reason: str


class DeclaredFacts(Mapping[str, Any]):
    """The facts recorded so far, as one step may read them: only those it declares in
    `needs`, `uses` or `makes` (a retried or compensating step reads what it recorded itself).

    Reading any other name (`[...]`, `.get`, `in`) raises UndeclaredRead naming the step, the
    fact and what the step declares, and is remembered, so that the run fails the step even if
    the action caught the error. Iterating shows only declared facts that are present."""

    def __init__(self, facts: Mapping[str, Any], step: Step, seen: list[UndeclaredRead]) -> None:
        self._facts = facts  # live: a fact the step records is readable at once
        self._step = step
        self._reads = step.reads()
        self._seen = seen

    def _allow(self, name: object) -> None:
        if name in self._reads:
            return
        step = self._step
        declared = "; ".join(
            f"{what}: {', '.join(f.name for f in facts)}"
            for what, facts in (("needs", step.needs), ("uses", step.uses), ("makes", step.makes))
            if facts
        )
        error = UndeclaredRead(
            f"step '{step.name}' ({step.action}) read fact {name!r}, which it does not declare "
            f"({declared or 'it declares no fact'}): add it to the step's `needs` or `uses`"
        )
        self._seen.append(error)
        raise error

    def __getitem__(self, name: str) -> Any:
        self._allow(name)
        return self._facts[name]

    def __contains__(self, name: object) -> bool:
        self._allow(name)
        return name in self._facts

    def get(self, name: str, default: Any = None) -> Any:
        self._allow(name)
        return self._facts.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._facts if name in self._reads)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"DeclaredFacts({dict(self)!r})"


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
    undeclared_reads: list[UndeclaredRead] = field(factory=list)
    """Every read of an undeclared fact so far; the runner fails the step on the first."""

    @property
    def facts(self) -> DeclaredFacts:
        """The facts this step declares (needs, uses, makes) as recorded so far; reading any
        other raises UndeclaredRead."""
        return DeclaredFacts(self._facts, self.step, self.undeclared_reads)

    def captured(self, fact: Fact, default: Any = None) -> Any:
        """What the capture recorded for `fact`, a fact declared `carried`, as the capsule
        brought it back (the `capsule` fact admit makes): a restore step reads the capture's
        facts by their declared Fact, not by string keys into a dict. The step must declare
        `capsule` (needs or uses); `default` where the capsule does not hold the fact."""
        if not fact.carried:
            raise SpecError(
                f"step '{self.step.name}' reads '{fact.name}' from the capsule, but that fact is "
                "not declared carried: a capture does not keep it"
            )
        capsule = self.facts.get(CAPSULE.name)
        return default if capsule is None else capsule.get(fact.name, default)

    def carried(self) -> dict[str, Any]:
        """The facts this spec declares `carried` (coldsnap.machine.fact) that its steps made so
        far: what a capture hands its restores through the capsule. The store's seal reads them
        here, since which facts are carried depends on the spec, not on the seal step."""
        names = {f.name for f in self.spec.makes() if f.carried}
        return {name: value for name, value in self._facts.items() if name in names}

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
            seconds = self.request.timeouts.get(self.step.name) or self.step.timeout_s
            raise StepTimeout(f"step '{self.step.name}' ran past {seconds:g} s")

    def record(self, **facts: Any) -> None:
        """Journals facts now, before the step ends."""
        self._record(facts)  # refuses a fact the step does not declare it makes
        self._facts.update(facts)

    def advance(self, what: str, done: int, total: int, started: float) -> None:
        """Shows how far a long piece of work is (bytes of `total`, and the rate since
        `started`, a time.monotonic()) to the run's subscribers, at most every PROGRESS_EVERY_S
        seconds and at the end; never journaled: it is for the operator watching, not a resume."""
        now = time.monotonic()
        last = self._shown.get(what)  # the first report always shows
        if done < total and last is not None and now - last < PROGRESS_EVERY_S:
            return
        self._shown[what] = now
        rate = done / (now - started) if now > started else 0.0
        self._show(f"{what} {_gib(done)} of {_gib(total)} GiB, {_gib(rate)} GiB/s")


PROGRESS_EVERY_S = 0.5


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f}"
