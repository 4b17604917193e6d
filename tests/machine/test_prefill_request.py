"""The prefill steps run only when a restore asks for them (`RestoreRequest.prefill`), and a
failure after them ends the helpers (in-memory doubles: the world counts what is left)."""

from __future__ import annotations

import attrs
import pytest

from coldsnap.machine import RequestError
from coldsnap.testing import FaultPlan, MemoryWorld

from ._support import capture_request, memory_machine, restore_request

PREFILL_STEPS = {"prefill_payload", "end_prefill"}


def _captured(tmp_path, world: MemoryWorld) -> None:
    request = capture_request(tmp_path)
    assert memory_machine(world, request).capture(request).ok


@pytest.mark.parametrize("prefill", [False, True])
def test_the_prefill_steps_run_only_when_asked(tmp_path, prefill: bool) -> None:
    world = MemoryWorld()
    _captured(tmp_path, world)
    request = attrs.evolve(restore_request(tmp_path), prefill=prefill)
    receipt = memory_machine(world, request).restore(request)
    assert receipt.ok, receipt.error
    assert ({step.name for step in receipt.steps} >= PREFILL_STEPS) is prefill
    assert not any(key.startswith("prefill:") for key in world.resources)
    if prefill:
        assert receipt.facts["prefill_report"] == {"tp0/target": "consumed"}


def test_a_failure_after_the_prefill_ends_the_helpers(tmp_path) -> None:
    world = MemoryWorld()
    _captured(tmp_path, world)
    request = attrs.evolve(restore_request(tmp_path), prefill=True)
    plan = FaultPlan(fail={"engine.resume_weights"})
    receipt = memory_machine(world, request, plan).restore(request)
    assert receipt.outcome == "rolled_back"
    assert "prefill_payload" in [c.name for c in receipt.compensations]
    assert not any(key.startswith("prefill:") for key in world.resources)


@pytest.mark.parametrize(("driver", "provider"), [("n580", "native"), ("n610", "recovery")])
def test_only_an_n610_native_restore_prefills(tmp_path, driver: str, provider: str) -> None:
    with pytest.raises(RequestError, match="'prefill': only an n610 restore from a native payload"):
        attrs.evolve(restore_request(tmp_path, driver, provider), prefill=True)
