"""The conformance kit: a hypothesis state machine that a third party runs against its own
driver, weight provider, engine adapter and store.

Subclass `MachineConformance`, implement `components`, `transient`, `capture_request` and
`restore_request`, and expose `YourKit.TestCase` to pytest. The kit captures and restores in
random orders with faults injected at random steps (through proxies, so components need no
test hooks) and checks what every orchestrator relies on:

- every operation ends in a terminal state; a successful one has every selected step done or
  skipped;
- a failed operation compensates exactly once per completed step, in reverse order, and leaves
  no transient resource behind (processes, images, staged payloads);
- a capsule restores any number of times, each restore passes acceptance, and stopping a restored
  engine leaves nothing behind.
"""

from __future__ import annotations

import shutil
import tempfile
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
    DRIVERS,
    PROVIDERS,
    CaptureRequest,
    Machine,
    Receipt,
    Request,
    RestoreRequest,
    Spec,
    spec_for,
)

from ._faults import FaultPlan, inject_faults


def expected_compensations(spec: Spec, request: Request, receipt: Receipt) -> list[str]:
    """The compensation order the machines promise for a receipt's forward steps."""
    steps = {s.name: s for s in spec.selected(request)}
    failed = [r.name for r in receipt.steps if r.status == "failed"]
    done = [r.name for r in receipt.steps if r.status == "done"]
    order = [n for n in failed if steps[n].compensation]
    order += [n for n in reversed(done) if steps[n].compensation and n not in order]
    return order


def check_receipt(spec: Spec, request: Request, receipt: Receipt, fault: str | None) -> None:
    """The promises every receipt keeps, faulted or not."""
    assert receipt.outcome in ("done", "rolled_back", "failed"), receipt.outcome
    if fault is None:
        assert receipt.outcome == "done", (receipt.error, receipt.steps)
        selected = [s.name for s in spec.selected(request)]
        assert [r.name for r in receipt.steps] == selected
        assert all(r.status in ("done", "skipped") for r in receipt.steps)
        assert not receipt.compensations
        return
    assert receipt.outcome == "rolled_back", (receipt.outcome, receipt.error)
    assert fault in (receipt.error or ""), receipt.error
    names = [r.name for r in receipt.compensations]
    assert names == expected_compensations(spec, request, receipt), names
    assert len(names) == len(set(names)), f"a compensation ran twice: {names}"


class MachineConformance(RuleBasedStateMachine):
    """Subclass me. `drivers` and `providers` narrow what is exercised."""

    drivers: tuple[str, ...] = DRIVERS
    providers: tuple[str, ...] = PROVIDERS
    captured = Bundle("captured")

    # -- to implement -------------------------------------------------------------------------

    def components(self, driver: str, provider: str) -> dict[str, Any]:
        """Fresh components (one host's state may be shared across calls)."""
        raise NotImplementedError

    def transient(self) -> frozenset[str]:
        """Live transient resources (processes, images, staged payloads), not capsules."""
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

    def _fault(self, data: st.DataObject, spec: Spec, request: Request) -> str | None:
        actions = [s.action for s in spec.selected(request)]
        return data.draw(st.none() | st.sampled_from(actions), label="fault")

    def _run(self, request: Request, driver: str, provider: str, fault: str | None) -> Receipt:
        plan = FaultPlan(fail={fault} if fault else set())
        machine = Machine(**inject_faults(self.components(driver, provider), plan))
        if isinstance(request, CaptureRequest):
            return machine.capture(request)
        return machine.restore(request)

    @rule(target=captured, data=st.data())
    def capture(self, data: st.DataObject) -> Any:
        driver = data.draw(st.sampled_from(self.drivers), label="driver")
        provider = data.draw(st.sampled_from(self.providers), label="provider")
        name = f"c{self._ops:04d}"
        request = self.capture_request(self._workdir("capture"), driver, provider, name)
        spec = spec_for("capture", driver)
        fault = self._fault(data, spec, request)
        receipt = self._run(request, driver, provider, fault)
        check_receipt(spec, request, receipt, fault)
        return multiple() if fault else (driver, provider, name)

    @precondition(lambda self: self._restores < 6)
    @rule(capsule=captured, data=st.data())
    def restore(self, capsule: tuple[str, str, str], data: st.DataObject) -> None:
        driver, provider, name = capsule
        request = self.restore_request(self._workdir("restore"), driver, provider, name)
        spec = spec_for("restore", driver)
        fault = self._fault(data, spec, request)
        plan = FaultPlan(fail={fault} if fault else set())
        machine = Machine(**inject_faults(self.components(driver, provider), plan))
        receipt = machine.restore(request)
        check_receipt(spec, request, receipt, fault)
        if receipt.ok:
            self._restores += 1
            assert self.transient(), "a restored engine should be running"
            machine.stop(receipt)

    @invariant()
    def nothing_left_behind(self) -> None:
        left = self.transient()
        assert not left, f"transient resources left behind: {sorted(left)}"
