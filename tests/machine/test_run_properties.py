"""Faults at any step compensate back to a safe state; abandoned runs resume to the same end."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coldsnap.machine import Machine
from coldsnap.testing import (
    Abandoned,
    FaultPlan,
    MemoryWorld,
    check_receipt,
    expected_compensations,
    inject_faults,
    memory_registry,
    strategies,
)

from ._support import capture_request, restore_request

EXAMPLES = settings(max_examples=100, deadline=None)


class _Scene:
    """A world holding one published capsule per variant, and the requests to run against it."""

    def __init__(self, operation: str, driver: str, provider: str, cuda: bool) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="coldsnap-prop-"))
        self.world = MemoryWorld(cuda=cuda)
        self.registry = memory_registry(self.world)
        self.operation = operation
        if operation == "restore":
            seed = capture_request(self.tmp, driver, provider, workdir="seed")
            assert self.machine(FaultPlan(), request=seed).capture(seed).ok
        self.request = (capture_request if operation == "capture" else restore_request)(
            self.tmp, driver, provider, workdir="op")
        self.components = self.registry.components(self.request).by_role()
        self.spec = self.registry.spec(operation, driver)
        self.selected = self.spec.selected(self.request, self.components)

    def machine(self, plan: FaultPlan, subscribers=(), request=None) -> Machine:
        components = self.registry.components(request or self.request).by_role()
        return Machine(**inject_faults(components, plan), registry=self.registry,
                       subscribers=subscribers)

    def run(self, plan: FaultPlan):
        machine = self.machine(plan)
        return getattr(machine, self.operation)(self.request)

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _scene(variant, cuda: bool) -> _Scene:
    return _Scene(*variant, cuda)


@EXAMPLES
@given(variant=strategies.variants(), cuda=st.booleans(), data=st.data())
def test_a_fault_at_any_step_compensates_once_in_reverse(variant, cuda, data) -> None:
    scene = _scene(variant, cuda)
    try:
        before = scene.world.transient()
        actions = [s.action for s in scene.selected]
        fault = data.draw(st.sampled_from(actions), label="fault")
        plan = FaultPlan(fail={fault})
        receipt = scene.run(plan)
        check_receipt(scene.spec, scene.request, scene.components, receipt, fault)
        assert scene.world.transient() == before
        compensations = [c.removeprefix("comp:") for c in plan.calls if c.startswith("comp:")]
        steps = {s.name: s for s in scene.spec.steps}
        assert compensations == [steps[n].compensation for n in
                                 expected_compensations(scene.spec, receipt)]
        if scene.operation == "capture":
            assert not scene.world.capsules, "a rolled-back capture published a capsule"
    finally:
        scene.close()


@EXAMPLES
@given(variant=strategies.variants(), data=st.data())
def test_a_failing_compensation_ends_failed_and_the_rest_still_run(variant, data) -> None:
    scene = _scene(variant, True)
    try:
        steps = scene.selected
        index = data.draw(st.integers(1, len(steps) - 1), label="fault index")
        done_before = [s for s in steps[:index] if s.compensation]
        if not done_before:
            return
        broken = data.draw(st.sampled_from(done_before), label="broken compensation")
        plan = FaultPlan(fail={steps[index].action, f"comp:{broken.compensation}"})
        receipt = scene.run(plan)
        assert receipt.outcome == "failed"
        statuses = {c.name: c.status for c in receipt.compensations}
        assert statuses[broken.name] == "compensation_failed"
        assert [c.name for c in receipt.compensations] == expected_compensations(
            scene.spec, receipt)
    finally:
        scene.close()


def _end_state(scene: _Scene, receipt) -> tuple:
    return receipt.outcome, scene.world.snapshot()


@EXAMPLES
@given(variant=strategies.variants(), data=st.data())
def test_an_abandoned_run_resumes_to_the_same_end(variant, data) -> None:
    """Abandon during a step (before or after its effect), between steps, or while
    compensating; a new Machine resumes from the journal. The end state equals an uninterrupted
    run's, where the interrupted step counts as failed if its spec says to compensate."""
    reference = _scene(variant, True)
    resumed = _scene(variant, True)
    try:
        steps = reference.selected
        fault = data.draw(st.none() | st.sampled_from(steps), label="fault")
        probe = FaultPlan(fail={fault.action} if fault else set())
        probe_receipt = reference.run(probe)
        reference.close()
        reference = _scene(variant, True)

        where = data.draw(st.integers(0, len(probe.calls) - 1), label="abandon at call")
        after = data.draw(st.booleans(), label="after the call's effect")
        between = data.draw(st.booleans(), label="between steps instead") and not fault
        key = probe.calls[where]
        if fault is not None and key == fault.action:
            after = False  # the faulted call has no effect to abandon after
        interrupted = None
        if not key.startswith("comp:"):
            interrupted = next(s for s in steps if s.action == key)

        plan = FaultPlan(fail={fault.action} if fault else set())
        subscribers = ()
        if between and interrupted is not None:
            def abandon(event, name=interrupted.name):
                if event.step == name and event.phase == "done":
                    raise Abandoned("between steps")
            subscribers = (abandon,)
            interrupted = None
        else:
            plan.abandon_at, plan.abandon_after = where, after
        machine = resumed.machine(plan, subscribers)
        with pytest.raises(Abandoned):
            getattr(machine, resumed.operation)(resumed.request)
        plan.abandon_at = None
        receipt = resumed.machine(plan).resume(resumed.request.workdir)
        assert receipt.resumed

        expected_fault = fault
        if interrupted is not None and interrupted.on_interrupt == "compensate":
            expected_fault = interrupted
        if interrupted is not None and fault is not None and interrupted is not fault:
            expected_fault = fault if steps.index(fault) < steps.index(interrupted) else (
                interrupted if interrupted.on_interrupt == "compensate" else fault)
        expected = reference.run(FaultPlan(fail={expected_fault.action} if expected_fault
                                           else set()))
        assert _end_state(resumed, receipt) == _end_state(reference, expected)
        assert probe_receipt.outcome in ("done", "rolled_back")
    finally:
        reference.close()
        resumed.close()
