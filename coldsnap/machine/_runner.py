"""Runs a spec on `transitions`: one step at a time, journaled, compensating on any failure.

Order of work for each step: journal `step_start`, call the action in a worker thread under the
step's timeout, journal `step_end` (or `step_fail`). On a failure, cancellation or timeout the
machine moves to `compensating` and runs, exactly once each, the failed step's compensation (a
step may fail half-way, so compensations are idempotent) and then those of the completed steps
in reverse order; it ends in `rolled_back`, or `failed` if a compensation failed too.

A journal append that fails (a full disk) does not stop the run where it is: the record is kept
for the next append, the run stops going forward at the next step boundary and compensates as
for a failure, and if the journal or the receipt is still not on disk when the run ends, it
raises JournalUnwritable (with the receipt it would have written) so that the caller knows a
`resume` must finish the record.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from transitions import Machine as _Transitions
from transitions import MachineError

from ._context import Skipped, StepContext
from ._errors import (
    Cancelled,
    IllegalTransition,
    Interrupted,
    InvalidFacts,
    JournalError,
    JournalUnwritable,
    MissingFact,
    StepTimeout,
    UndeclaredFact,
)
from ._journal import Journal, Replay
from ._receipt import ErrorRecord, Receipt, StepEvent, StepRecord
from ._requests import Request
from ._spec import (
    ADVANCE,
    COMPENSATED,
    COMPENSATING,
    COMPENSATION_FAILED,
    DONE,
    FAIL,
    FAILED,
    ROLLED_BACK,
    Spec,
    Step,
    guard_condition,
)

log = logging.getLogger("coldsnap.machine")
Subscriber = Callable[[StepEvent], None]


class _Model:
    """The object `transitions` drives; the spec's guards are offered as its methods."""

    state: str

    def __init__(self, spec: Spec, request: Request, components: Mapping[str, Any]) -> None:
        for guard in spec.guards():
            holds = functools.partial(guard.holds, request, components)
            setattr(self, guard_condition(guard), holds)


class SpecMachine:
    """A spec's graph on `transitions` for one request: fire triggers, read the state."""

    def __init__(
        self,
        spec: Spec,
        request: Request,
        components: Mapping[str, Any],
        state: str | None = None,
    ) -> None:
        graph = spec.graph()
        self.spec = spec
        self._model = _Model(spec, request, components)
        self._machine = _Transitions(
            model=self._model,
            states=list(graph.states),
            initial=state or graph.initial,
            transitions=[
                {
                    "trigger": t.trigger,
                    "source": t.source,
                    "dest": t.dest,
                    "conditions": list(t.conditions),
                    "unless": list(t.unless),
                }
                for t in graph.transitions
            ],
            auto_transitions=False,
            ignore_invalid_triggers=False,
        )

    @property
    def state(self) -> str:
        return self._model.state

    def triggers(self) -> list[str]:
        """Triggers declared from the current state (guards may still block one)."""
        return self._machine.get_triggers(self.state)

    def fire(self, trigger: str) -> str:
        """Takes a legal transition or raises IllegalTransition, leaving the state unchanged."""
        before = self.state
        try:
            moved = getattr(self._model, trigger)() if trigger in self._machine.events else None
        except MachineError as exc:
            raise IllegalTransition(
                f"{self.spec.name}: '{trigger}' is not allowed in state '{before}'"
            ) from exc
        if not moved:
            raise IllegalTransition(
                f"{self.spec.name}: '{trigger}' is not allowed in state '{before}'"
            )
        return self.state


class Run:
    """One execution (or resumption) of a spec for a request."""

    def __init__(
        self,
        *,
        spec: Spec,
        request: Request,
        components: Mapping[str, Any],
        journal: Journal,
        cancel: threading.Event,
        subscribers: Iterable[Subscriber] = (),
        grace_s: float = 5.0,
    ) -> None:
        self.spec = spec
        self.request = request
        self.components = components
        self.journal = journal
        self.cancel = cancel
        self.subscribers = tuple(subscribers)
        self.grace_s = grace_s
        self.workdir = Path(request.workdir)
        self.steps = {s.name: s for s in spec.selected(request, components)}
        self.facts: dict[str, Any] = {}
        self.records: list[StepRecord] = []
        self.comp_records: list[StepRecord] = []
        self.completed: list[Step] = []
        self._comps_done: set[str] = set()
        self.resumed = False
        self.failure: ErrorRecord | None = None
        """The error that ended the run, typed (the receipt keeps it)."""
        self.unwritable: JournalUnwritable | None = None
        """The first failed journal append, if any: the run compensates at the next boundary."""

    # -- entry points -------------------------------------------------------------------------

    def start(
        self,
        request_data: dict[str, Any],
        *,
        components: dict[str, str],
        dry_run: bool,
        seeds: Mapping[str, Any] | None = None,
    ) -> Receipt:
        """Journals `begin` (with the facts seeded from a lifecycle operation's target: a resume
        reads them from here, not from a target receipt that may have changed since) and runs."""
        self.facts.update(seeds or {})
        self.journal.append(
            "begin",
            spec=self.spec.name,
            request=request_data,
            components=components,
            capabilities=capabilities_of(self.components),
            dry_run=dry_run,
            facts=dict(seeds) if seeds else None,
        )
        return self._forward(SpecMachine(self.spec, self.request, self.components), None)

    def finished(self, replay: Replay) -> Receipt:
        """The receipt of an operation whose journal ended (its receipt was never written:
        the orchestrator died between the `end` record and the receipt)."""
        assert replay.end is not None
        self.failure = replay.failed.failure if replay.failed is not None else None
        self._replay_records(replay)
        self._replay_compensations(replay)
        if replay.failed is not None and replay.failed.step:
            self.records.append(
                StepRecord(
                    name=replay.failed.step,
                    status="failed",
                    seconds=replay.failed.seconds or 0.0,
                    detail=replay.failed.error or "",
                )
            )
        self.resumed = True
        return self._receipt(replay.end.outcome or "failed", replay.end.error)

    def _replay_records(self, replay: Replay) -> None:
        self._check_steps(replay)
        self.facts.update(replay.facts)
        for record in replay.completed:
            step = self.steps[record.step or ""]
            self.records.append(
                StepRecord(
                    name=step.name,
                    status=record.status or "done",
                    seconds=record.seconds or 0.0,
                    detail=record.detail or "",
                )
            )
            if record.status == "done":
                self.completed.append(step)

    def _replay_compensations(self, replay: Replay) -> None:
        for name, record in replay.compensations.items():
            self._comps_done.add(name)
            self.comp_records.append(
                StepRecord(
                    name=name,
                    status="compensated" if record.event == "comp_end" else "compensation_failed",
                    seconds=record.seconds or 0.0,
                    detail=record.error or "",
                )
            )

    def _check_steps(self, replay: Replay) -> None:
        """Every step the journal names must be one this spec selects for this request; the
        error names the line of the first record that names another (a record's line is its
        `seq` plus one: the journal's lines are its records in order)."""
        unknown = [r for r in replay.records if r.step is not None and r.step not in self.steps]
        if unknown:
            names = sorted({r.step or "" for r in unknown})
            raise JournalError(
                f"{self.journal.path}:{unknown[0].seq + 1}: names step(s) "
                f"{', '.join(map(repr, names))}, which {self.spec.name} does not run for this "
                f"request (it runs: {', '.join(self.steps)})"
            )

    def resume(self, replay: Replay) -> Receipt:
        self.resumed = True
        self._replay_records(replay)
        last = replay.completed[-1].step if replay.completed else None
        if replay.compensating:
            self._replay_compensations(replay)
            failed = replay.failed.step if replay.failed else None
            error = replay.failed.error if replay.failed else "interrupted while compensating"
            self.failure = replay.failed.failure if replay.failed else ErrorRecord.of(
                Interrupted("the orchestrator stopped while compensating"), None
            )
            if failed:
                self.records.append(
                    StepRecord(
                        name=failed,
                        status="failed",
                        seconds=replay.failed.seconds or 0.0,
                        detail=error or "",
                    )
                )
            machine = SpecMachine(self.spec, self.request, self.components, COMPENSATING)
            return self._compensate(machine, self.steps.get(failed or ""), error or "", fire=False)
        if replay.interrupted:
            step = self.steps[replay.interrupted]
            machine = SpecMachine(self.spec, self.request, self.components, step.name)
            if step.on_interrupt == "retry":
                return self._forward(machine, step)
            error = "interrupted: the orchestrator stopped during this step"
            self.failure = ErrorRecord.of(Interrupted(error), step.name)
            self._append(
                "step_fail", step=step.name, error=error, failure=self.failure, seconds=0.0
            )
            self.records.append(
                StepRecord(name=step.name, status="failed", seconds=0.0, detail=error)
            )
            return self._compensate(machine, step, error)
        machine = SpecMachine(self.spec, self.request, self.components, last)
        return self._forward(machine, None)

    # -- forward ------------------------------------------------------------------------------

    def _forward(self, machine: SpecMachine, pending: Step | None) -> Receipt:
        while True:
            if pending is None:
                if self.cancel.is_set():
                    return self._cancelled(machine)
                machine.fire(ADVANCE)
                if machine.state == DONE:
                    return self._finish("done", None)
                pending = self.steps[machine.state]
            # A step whose start is not journaled must not run: a resume would not know it
            # had started, and could not undo what it did.
            if not self._append("step_start", step=pending.name):
                return self._stop(machine, self.unwritable)
            error = self._run_step(pending)
            if error is not None:
                return self._compensate(machine, pending, error)
            if self.unwritable is not None:  # the step ran, but its records are not on disk
                return self._stop(machine, self.unwritable)
            pending = None

    def _cancelled(self, machine: SpecMachine) -> Receipt:
        return self._stop(machine, Cancelled("the operation was cancelled"), "cancelled")

    def _stop(
        self, machine: SpecMachine, cause: BaseException | None, error: str | None = None
    ) -> Receipt:
        """Stops going forward at a step boundary (no step failed: the operation was cancelled,
        or its journal cannot be written) and compensates every completed step."""
        assert cause is not None
        self.failure = ErrorRecord.of(cause, None)
        error = error or self.failure.line()
        self._append("step_fail", error=error, failure=self.failure)
        if not self.completed and machine.state not in self.steps:
            # Nothing ran yet: there is nothing to undo, and `pending` has no fail transition.
            return self._finish("rolled_back", error, emit=False)
        return self._compensate(machine, None, error)

    def _run_step(self, step: Step) -> str | None:
        timeout = self._timeout(step)
        ctx = self._context(step, timeout, compensating=False)
        self._emit(step.name, "started")
        started = time.monotonic()
        missing = [f.name for f in step.needs if f.name not in self.facts]
        if missing:
            result, exc = (
                None,
                MissingFact(
                    f"step '{step.name}' needs {', '.join(missing)}, which no earlier step recorded"
                ),
            )
        else:
            result, exc = self._invoke(step.action, ctx, timeout)
            exc = _undeclared(ctx) or exc
        seconds = time.monotonic() - started
        if exc is None and seconds > timeout:
            exc = StepTimeout(f"step '{step.name}' ran past {timeout:g} s ({seconds:.1f} s)")
        facts: dict[str, Any] = {}
        if exc is None and not isinstance(result, Skipped):
            try:
                facts = dict(result or {})
                json.dumps(facts)
                _check_declared(step, facts)
            except (TypeError, ValueError) as bad:
                exc = InvalidFacts(f"step '{step.name}' returned facts that are not JSON: {bad}")
            except UndeclaredFact as bad:
                exc = bad
        if exc is not None:
            self.failure = ErrorRecord.of(exc, step.name)
            error = self.failure.line()
            self._append(
                "step_fail", step=step.name, error=error, failure=self.failure, seconds=seconds
            )
            self.records.append(
                StepRecord(name=step.name, status="failed", seconds=seconds, detail=error)
            )
            self._emit(step.name, "failed", seconds, error)
            return error
        status, detail = ("skipped", result.reason) if isinstance(result, Skipped) else ("done", "")
        self.facts.update(facts)
        self._append(
            "step_end",
            step=step.name,
            status=status,
            seconds=seconds,
            facts=facts or None,
            detail=detail or None,
        )
        self.records.append(
            StepRecord(name=step.name, status=status, seconds=seconds, detail=detail)
        )
        if status == "done":
            self.completed.append(step)
        self._emit(step.name, status, seconds, detail)
        return None

    # -- compensation -------------------------------------------------------------------------

    def _compensate(
        self, machine: SpecMachine, failed: Step | None, error: str, *, fire: bool = True
    ) -> Receipt:
        if fire:
            machine.fire(FAIL)
        plan = [failed] if failed is not None and failed.compensation else []
        plan += [s for s in reversed(self.completed) if s.compensation and s is not failed]
        broken = False
        for step in plan:
            if step.name in self._comps_done:
                broken |= any(
                    r.name == step.name and r.status != "compensated" for r in self.comp_records
                )
                continue
            broken |= not self._run_compensation(step)
        machine.fire(COMPENSATION_FAILED if broken else COMPENSATED)
        assert machine.state in (ROLLED_BACK, FAILED)
        return self._finish(machine.state, error)

    def _run_compensation(self, step: Step) -> bool:
        assert step.compensation is not None
        timeout = self._timeout(step)
        ctx = self._context(step, timeout, compensating=True)
        # Compensations run even where their records cannot be written: each is idempotent, so a
        # resume that finds no record of it runs it again to no harm.
        self._append("comp_start", step=step.name)
        self._emit(step.name, "compensating")
        started = time.monotonic()
        _, exc = self._invoke(step.compensation, ctx, timeout)
        exc = _undeclared(ctx) or exc
        seconds = time.monotonic() - started
        self._comps_done.add(step.name)
        if exc is not None:
            error = f"{type(exc).__name__}: {exc}"
            self._append("comp_fail", step=step.name, error=error, seconds=seconds)
            self.comp_records.append(
                StepRecord(
                    name=step.name, status="compensation_failed", seconds=seconds, detail=error
                )
            )
            self._emit(step.name, "compensation_failed", seconds, error)
            return False
        self._append("comp_end", step=step.name, seconds=seconds)
        self.comp_records.append(StepRecord(name=step.name, status="compensated", seconds=seconds))
        self._emit(step.name, "compensated", seconds)
        return True

    # -- plumbing -----------------------------------------------------------------------------

    def _timeout(self, step: Step) -> float:
        return float(self.request.timeouts.get(step.name) or step.timeout_s)

    def _context(self, step: Step, timeout: float, *, compensating: bool) -> StepContext:
        return StepContext(
            request=self.request,
            spec=self.spec,
            step=step,
            workdir=self.workdir,
            deadline=time.monotonic() + timeout,
            facts=self.facts,
            cancel=self.cancel,
            record=self._progress(step),
            compensating=compensating,
            show=lambda detail: self._emit(step.name, "progress", detail=detail),
        )

    def _progress(self, step: Step) -> Callable[[dict[str, Any]], None]:
        def record(facts: dict[str, Any]) -> None:
            _check_declared(step, facts)
            # Known to the run before it is journaled: if the append fails, a compensation in
            # this process still finds what the step made (a PID right after a spawn).
            self.facts.update(facts)
            try:
                self.journal.append("progress", step=step.name, facts=facts)
            except JournalUnwritable as exc:
                self.unwritable = self.unwritable or exc  # the step may catch it; the run won't
                raise
            # Subscribers see it too (from the step's worker thread): a long step shows life.
            shown = ", ".join(f"{k}={v}" for k, v in sorted(facts.items()))
            self._emit(step.name, "progress", detail=shown, facts=dict(facts))

        return record

    def _invoke(
        self, action: str, ctx: StepContext, timeout: float
    ) -> tuple[Any, BaseException | None]:
        """Calls `component.method(ctx)` in a worker thread, bounded by timeout plus grace.

        BaseExceptions other than Exception (the orchestrator is going away) propagate untouched
        and leave the journal as it is, for a later machine to resume.
        """
        role, method = action.split(".", 1)
        fn = getattr(self.components[role], method)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = fn(ctx)
            except BaseException as exc:  # handed to the runner's thread below
                box["error"] = exc

        worker = threading.Thread(target=target, name=f"coldsnap:{action}", daemon=True)
        worker.start()
        worker.join(timeout + self.grace_s)
        if worker.is_alive():
            return None, StepTimeout(
                f"'{action}' did not return within {timeout:g} s (+{self.grace_s:g} s grace); "
                "its thread was abandoned"
            )
        error = box.get("error")
        if error is not None and not isinstance(error, Exception):
            raise error
        return box.get("result"), error

    def _emit(
        self,
        step: str,
        phase: str,
        seconds: float = 0.0,
        detail: str = "",
        facts: dict[str, Any] | None = None,
    ) -> None:
        event = StepEvent(
            operation=self.spec.operation,
            spec=self.spec.name,
            step=step,
            phase=phase,
            seconds=seconds,
            detail=detail,
            facts=facts,
        )
        for subscriber in self.subscribers:
            try:
                subscriber(event)
            except Exception:
                log.exception("a step-event subscriber failed; the run goes on")

    def _append(self, event: Any, **fields: Any) -> bool:
        """Journals a record; False (the record kept for the next append, the error in
        `unwritable`) when it cannot be written, so that the caller goes on to compensate."""
        try:
            self.journal.append(event, **fields)
        except JournalUnwritable as exc:
            log.warning("%s", exc)
            self.unwritable = self.unwritable or exc
            return False
        return True

    def _finish(self, outcome: str, error: str | None, *, emit: bool = True) -> Receipt:
        self._append("end", outcome=outcome, error=error)
        if emit:
            self._emit("", "finished", detail=outcome)
        return self._receipt(outcome, error)

    def _receipt(self, outcome: str, error: str | None) -> Receipt:
        receipt = Receipt(
            operation=self.spec.operation,
            spec=self.spec.name,
            outcome=outcome,  # type: ignore[arg-type]
            steps=tuple(self.records),
            compensations=tuple(self.comp_records),
            facts=dict(self.facts),
            error=error,
            failure=None if outcome == "done" else self.failure,
            seconds=sum(r.seconds for r in (*self.records, *self.comp_records)),
            resumed=self.resumed,
            workdir=str(self.workdir),
        )
        try:
            self.journal.flush()  # what a full disk held back, now that compensation freed it
            receipt.write(self.workdir)
        except (JournalUnwritable, OSError) as exc:
            raise JournalUnwritable(
                f"{self.workdir}: the operation ended {outcome} in this process, but its "
                f"journal or receipt could not be written ({exc}): once the disk has room, "
                "resume the operation in this workdir to record how it ended",
                receipt,
            ) from exc
        return receipt


def capabilities_of(components: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each role's capabilities as the journal keeps them (sorted names)."""
    return {role: sorted(c.capabilities) for role, c in sorted(components.items())}


def _undeclared(ctx: StepContext) -> BaseException | None:
    """The first undeclared read of the action, even where the action caught its error: a
    step that reads what it does not declare fails, whatever it did next."""
    return ctx.undeclared_reads[0] if ctx.undeclared_reads else None


def _check_declared(step: Step, facts: Mapping[str, Any]) -> None:
    """A step may make only the facts it declares: what flows between steps stays readable."""
    undeclared = sorted(set(facts) - {f.name for f in step.makes})
    if undeclared:
        raise UndeclaredFact(
            f"step '{step.name}' ({step.action}) made {', '.join(undeclared)}, which it does "
            f"not declare (it makes: {', '.join(f.name for f in step.makes) or 'nothing'})"
        )


__all__ = ["COMPENSATING", "Run", "SpecMachine", "Subscriber"]
