"""A third driver is one package plus its registration: x100 (tests/machine/x100, its own facts,
specs and steps class around the shared steps) registers into a registry and passes the
conformance kit, with no edit to coldsnap."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import coldsnap
from coldsnap.machine import (
    CaptureRequest,
    Machine,
    ModelRef,
    RestoreRequest,
    document,
)
from coldsnap.testing import MachineConformance, MemoryWorld, memory_registry

from . import x100
from ._support import capture_request, restore_request


def _registry(world: MemoryWorld):
    """The in-memory doubles of the other roles, and x100 registered beside them."""
    registry = memory_registry(world)
    x100.register(registry)
    return registry


def test_coldsnap_does_not_know_the_third_driver() -> None:
    root = Path(coldsnap.__file__).parent
    mentions = [p for p in root.rglob("*.py") if "x100" in p.read_text()]
    assert mentions == []


@pytest.mark.parametrize("provider", ["native", "recovery"])
def test_capture_then_restore_twice(tmp_path, provider) -> None:
    world = MemoryWorld(cuda=False)
    registry = _registry(world)
    request = capture_request(tmp_path, x100.NAME, provider)
    captured = Machine.for_request(request, registry=registry).capture(request)
    assert captured.ok, captured.error
    assert [r.name for r in captured.steps][-3:] == ["park", "seal_artifact", "retire_source"]
    (capsule,) = world.capsules.values()
    assert capsule["facts"][x100.SLOT.name] == "slot:cap", "the store carries the driver's fact"
    for attempt in range(2):
        again = restore_request(tmp_path, x100.NAME, provider, workdir=f"res{attempt}")
        machine = Machine.for_request(again, registry=registry)
        restored = machine.restore(again)
        assert restored.ok, restored.error
        assert restored.facts["acceptance_tokens"] == captured.facts["acceptance_tokens"]
        machine.stop(restored)
    assert not world.transient()


def test_its_specs_are_documented_like_the_others() -> None:
    text = document([x100.CAPTURE, x100.RESTORE])
    assert "capture-x100" in text and "restore-x100" in text
    assert "driver.park" in text and "x100_slot" in text


class X100Conformance(MachineConformance):
    drivers = (x100.NAME,)

    def __init__(self) -> None:
        super().__init__()
        self.world = MemoryWorld(cuda=False)
        self.registry = _registry(self.world)
        (self._tmp / "model").mkdir()

    def transient(self) -> frozenset[str]:
        return self.world.transient()

    def _model(self) -> ModelRef:
        return ModelRef(id="tiny", revision="r1", path=str(self._tmp / "model"))

    def capture_request(self, workdir: Path, driver: str, provider: str, name: str):
        return CaptureRequest(
            driver=driver,
            provider=provider,
            model=self._model(),
            workdir=str(workdir),
            store=str(self._tmp / "store"),
            name=name,
        )

    def restore_request(self, workdir: Path, driver: str, provider: str, artifact: str):
        return RestoreRequest(
            driver=driver,
            provider=provider,
            model=self._model(),
            artifact=artifact,
            workdir=str(workdir),
            store=str(self._tmp / "store"),
        )


X100Conformance.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestX100Conformance = X100Conformance.TestCase
