"""The conformance kit: a hypothesis state machine that a third party runs against its own
driver, weight provider, engine adapter and store.

Subclass `MachineConformance`, implement `transient`, `capture_request` and `restore_request`
(and `components`, unless the registry's factories build what a request names), and expose
`YourKit.TestCase` to pytest. The kit takes the specs from `registry` (the process-wide one
unless a subclass sets its own), captures and restores in random orders with faults injected at
random steps (through proxies, so components need no test hooks) and checks what every
orchestrator relies on:

- every operation ends in a terminal state; a successful one ran exactly the steps the guards
  select for its components (none skipped, none compensated), and made only declared facts;
- a failed operation compensates exactly once per completed step, in reverse order, and leaves
  no transient resource behind (processes, images, exports);
- a capsule restores any number of times, each restore passes acceptance, and stopping a restored
  engine leaves nothing behind.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from coldsnap.machine import (
    REGISTRY,
    CaptureRequest,
    Machine,
    Receipt,
    Registry,
    Request,
    RestoreRequest,
    Spec,
)

from ._faults import FaultPlan, inject_faults


def expected_compensations(spec: Spec, receipt: Receipt) -> list[str]:
    """The compensation order the machines promise for a receipt's forward steps."""
    steps = {s.name: s for s in spec.steps}
    failed = [r.name for r in receipt.steps if r.status == "failed"]
    done = [r.name for r in receipt.steps if r.status == "done"]
    order = [n for n in failed if steps[n].compensation]
    order += [n for n in reversed(done) if steps[n].compensation and n not in order]
    return order


def check_receipt(
    spec: Spec,
    request: Request,
    components: Mapping[str, Any],
    receipt: Receipt,
    fault: str | None,
) -> None:
    """The promises every receipt keeps, faulted or not. `components` are those the operation
    ran with: the guards read their capabilities."""
    assert receipt.outcome in ("done", "rolled_back", "failed"), receipt.outcome
    selected = spec.selected(request, components)
    if fault is None:
        assert receipt.outcome == "done", (receipt.error, receipt.steps)
        assert [r.name for r in receipt.steps] == [s.name for s in selected]
        assert all(r.status == "done" for r in receipt.steps), receipt.steps
        assert not receipt.compensations
        made = {f.name for s in selected for f in s.makes}
        undeclared = sorted(set(receipt.facts) - made)
        assert not undeclared, f"facts no selected step declares: {undeclared}"
        return
    assert receipt.outcome == "rolled_back", (receipt.outcome, receipt.error)
    assert fault in (receipt.error or ""), receipt.error
    names = [r.name for r in receipt.compensations]
    assert names == expected_compensations(spec, receipt), names
    assert len(names) == len(set(names)), f"a compensation ran twice: {names}"


class MachineConformance(RuleBasedStateMachine):
    """Subclass me. `drivers` and `providers` narrow what is exercised (empty: every one the
    registry holds); `registry` is where the specs (and, by default, the components) come from."""

    registry: Registry = REGISTRY
    drivers: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    captured = Bundle("captured")

    # -- to implement -------------------------------------------------------------------------

    def components(self, request: Request) -> Mapping[str, Any]:
        """Fresh components for `request` (one host's state may be shared across calls). By
        default, what the registry's factories build."""
        return self.registry.components(request).by_role()

    def transient(self) -> frozenset[str]:
        """Live transient resources (processes, images, exports), not capsules."""
        raise NotImplementedError

    def capture_request(
        self, workdir: Path, driver: str, provider: str, name: str
    ) -> CaptureRequest:
        raise NotImplementedError

    def restore_request(
        self, workdir: Path, driver: str, provider: str, artifact: str
    ) -> RestoreRequest:
        raise NotImplementedError

    # -- the kit ------------------------------------------------------------------------------

    def __init__(self) -> None:
        super().__init__()
        self._tmp = Path(tempfile.mkdtemp(prefix="coldsnap-conformance-"))
        self._ops = 0
        self._restores = 0

    def teardown(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _workdir(self, what: str) -> Path:
        self._ops += 1
        return self._tmp / f"{self._ops:04d}-{what}"

    def _run(self, data: st.DataObject, request: Request) -> tuple[Machine, Receipt]:
        spec = self.registry.spec(request.operation, request.driver)
        components = self.components(request)
        actions = [s.action for s in spec.selected(request, components)]
        fault = data.draw(st.none() | st.sampled_from(actions), label="fault")
        plan = FaultPlan(fail={fault} if fault else set())
        machine = Machine(**inject_faults(components, plan), registry=self.registry)
        if isinstance(request, CaptureRequest):
            receipt = machine.capture(request)
        else:
            receipt = machine.restore(request)
        check_receipt(spec, request, components, receipt, fault)
        return machine, receipt

    @rule(target=captured, data=st.data())
    def capture(self, data: st.DataObject) -> Any:
        drivers = self.drivers or self.registry.names("driver")
        providers = self.providers or self.registry.names("provider")
        driver = data.draw(st.sampled_from(drivers), label="driver")
        provider = data.draw(st.sampled_from(providers), label="provider")
        name = f"c{self._ops:04d}"
        request = self.capture_request(self._workdir("capture"), driver, provider, name)
        _, receipt = self._run(data, request)
        return (driver, provider, name) if receipt.ok else multiple()

    @precondition(lambda self: self._restores < 6)
    @rule(capsule=captured, data=st.data())
    def restore(self, capsule: tuple[str, str, str], data: st.DataObject) -> None:
        driver, provider, name = capsule
        request = self.restore_request(self._workdir("restore"), driver, provider, name)
        machine, receipt = self._run(data, request)
        if receipt.ok:
            self._restores += 1
            assert self.transient(), "a restored engine should be running"
            machine.stop(receipt)

    @invariant()
    def nothing_left_behind(self) -> None:
        left = self.transient()
        assert not left, f"transient resources left behind: {sorted(left)}"
