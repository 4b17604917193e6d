"""The n610 capture rehearses a restore's refill in its source engine before anything is dumped
or sealed (step rehearse_refill), on the in-memory doubles: a refill that answers like the
engine did goes on to the dump with the engine released again; one that answers otherwise
refuses the capture, nothing is published, and the compensations give the engine its own
weights back before they stop it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coldsnap.machine import StepEvent
from coldsnap.testing import MemoryWorld

from ._support import capture_request, memory_machine


@pytest.mark.parametrize("provider", ["native", "recovery"])
def test_a_faithful_refill_is_rehearsed_then_released_before_the_dump(
    tmp_path: Path, provider: str
) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path, provider=provider)
    seen: dict[str, Any] = {}

    def after_rehearsal(event: StepEvent) -> None:
        if (event.step, event.phase) == ("rehearse_refill", "done"):
            procs = [v for k, v in world.resources.items() if k.startswith("process:")]
            seen["weights"] = [p.get("weights") for p in procs]

    machine = memory_machine(world, request)
    machine.subscribe(after_rehearsal)
    receipt = machine.capture(request)
    assert receipt.ok, receipt.error
    calls = [c for c in world.calls if not c.startswith("comp:")]
    assert calls.index("engine.rehearse_refill") < calls.index("driver.dump")
    if provider == "native":
        assert calls.index("provider.export") < calls.index("engine.rehearse_refill")
    assert seen["weights"] == ["released"], "the dump must see the released engine"
    assert world.capsules


def test_a_refill_that_answers_otherwise_refuses_the_capture_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    after_resume: list[Any] = []

    def on_event(event: StepEvent) -> None:
        if (event.step, event.phase) == ("export_payload", "done"):
            for key, resource in world.resources.items():  # a payload that refills otherwise
                if key.startswith("export:"):
                    resource["weights"] = "w:something-else"
        if (event.step, event.phase) == ("release_memory", "compensated"):
            procs = [v for k, v in world.resources.items() if k.startswith("process:")]
            after_resume.extend(p.get("weights") for p in procs)

    machine = memory_machine(world, request)
    machine.subscribe(on_event)
    receipt = machine.capture(request)
    assert receipt.outcome == "rolled_back", receipt.error
    assert "answers differently after a release and refill" in (receipt.error or "")
    assert [r.status for r in receipt.steps if r.name == "rehearse_refill"] == ["failed"]
    assert not world.capsules and not world.names, "nothing may be published"
    assert "driver.dump" not in world.calls and "artifacts.seal" not in world.calls
    # release_memory's compensation reloaded the checkpoint the engine started from
    assert after_resume == ["w:model"]
    assert not world.transient()
