"""At run time the facts are checked too: a step whose needs are missing fails before it runs
(MissingFact), and a step that returns or records a fact it does not declare fails
(UndeclaredFact); either way the operation compensates back."""

from __future__ import annotations

from typing import Any

import pytest

from coldsnap.machine import (
    JOURNAL_NAME,
    ArtifactStore,
    Driver,
    Engine,
    Machine,
    StepContext,
    WeightProvider,
    read_journal,
)
from coldsnap.machine import steps as s
from coldsnap.testing import (
    MemoryEngine,
    MemoryProcessDriver,
    MemoryProvider,
    MemoryStore,
    MemoryTemplateDriver,
    MemoryWorld,
    memory_components,
    memory_registry,
)

from ._support import capture_request, restore_request


def _run(tmp_path, world: MemoryWorld, **replace: Any):
    request = capture_request(tmp_path)
    components = {**memory_components(world, request), **replace}
    return Machine(**components, registry=memory_registry(world)).capture(request)


def test_a_missing_fact_fails_the_step_that_needs_it_before_it_runs(tmp_path) -> None:
    class NoUrl(MemoryProcessDriver):
        def launch_engine(self, ctx: StepContext) -> dict[str, Any]:
            facts = dict(super().launch_engine(ctx))
            del facts[s.ENGINE_URL.name]
            return facts

    world = MemoryWorld()
    receipt = _run(tmp_path, world, driver=NoUrl(world))
    assert receipt.outcome == "rolled_back"
    assert receipt.error.startswith("MissingFact: step 'wait_healthy' needs engine_url"), (
        receipt.error
    )
    assert "engine.wait_healthy" not in world.calls, "a step ran without what it needs"
    assert [c.name for c in receipt.compensations] == ["launch_engine"]
    assert not world.transient()


def test_a_returned_fact_the_step_does_not_declare_fails_it(tmp_path) -> None:
    class Chatty(MemoryEngine):
        def record_acceptance(self, ctx: StepContext) -> dict[str, Any]:
            return {**super().record_acceptance(ctx), "mood": "good"}

    world = MemoryWorld()
    receipt = _run(tmp_path, world, engine=Chatty(world))
    assert receipt.outcome == "rolled_back"
    assert receipt.error == (
        "UndeclaredFact: step 'acceptance_record' (engine.record_acceptance) made mood, which it "
        "does not declare (it makes: acceptance_tokens)"
    )
    assert "mood" not in receipt.facts
    assert not world.transient()


def test_a_recorded_fact_the_step_does_not_declare_fails_it_unjournaled(tmp_path) -> None:
    class Leaky(MemoryProcessDriver):
        def launch_engine(self, ctx: StepContext) -> dict[str, Any]:
            facts = super().launch_engine(ctx)
            ctx.record(secret=42)
            return facts

    world = MemoryWorld()
    receipt = _run(tmp_path, world, driver=Leaky(world))
    assert receipt.outcome == "rolled_back"
    assert receipt.error.startswith(
        "UndeclaredFact: step 'launch_engine' (driver.launch_engine) made secret"
    ), receipt.error
    journaled = [r.facts or {} for r in read_journal(tmp_path / "cap" / JOURNAL_NAME)]
    assert not any("secret" in facts for facts in journaled)
    assert not world.transient(), "the engine recorded before the refusal was stopped"


def test_facts_that_are_not_json_fail_the_step(tmp_path) -> None:
    class Opaque(MemoryEngine):
        def wait_healthy(self, ctx: StepContext) -> dict[str, Any]:
            super().wait_healthy(ctx)
            return {s.HEALTHY_AFTER_S.name: object()}

    world = MemoryWorld()
    receipt = _run(tmp_path, world, engine=Opaque(world))
    assert receipt.outcome == "rolled_back"
    assert "step 'wait_healthy' returned facts that are not JSON" in receipt.error


@pytest.mark.parametrize("driver", ["n580", "n610"])
@pytest.mark.parametrize("provider", ["native", "recovery"])
def test_the_doubles_make_every_fact_their_steps_declare(tmp_path, driver, provider) -> None:
    world = MemoryWorld()
    registry = memory_registry(world)
    for request in (capture_request(tmp_path, driver, provider),
                    restore_request(tmp_path, driver, provider)):  # fmt: skip
        components = registry.components(request).by_role()
        machine = Machine(**components, registry=registry)
        receipt = getattr(machine, request.operation)(request)
        assert receipt.ok, receipt.error
        selected = registry.spec(request.operation, driver).selected(request, components)
        assert set(receipt.facts) == {f.name for step in selected for f in step.makes}


def test_the_store_carries_what_the_spec_marks_carried(tmp_path) -> None:
    world = MemoryWorld()
    registry = memory_registry(world)
    request = capture_request(tmp_path)
    receipt = Machine(**memory_components(world, request), registry=registry).capture(request)
    assert receipt.ok, receipt.error
    (capsule,) = world.capsules.values()
    carried = {f.name for f in registry.spec("capture", "n610").makes() if f.carried}
    assert set(capsule["facts"]) == carried
    assert capsule["facts"][s.ENGINE_URL.name] == receipt.facts[s.ENGINE_URL.name]


def test_the_doubles_implement_their_protocols() -> None:
    world = MemoryWorld()
    for double, protocol in [
        (MemoryProcessDriver(world), Driver),
        (MemoryTemplateDriver(world), Driver),
        (MemoryEngine(world), Engine),
        (MemoryProvider(world), WeightProvider),
        (MemoryStore(world), ArtifactStore),
    ]:
        assert isinstance(double, protocol), (double, protocol)
        assert isinstance(double.capabilities, frozenset)
    assert MemoryProcessDriver(world).capabilities == {"cuda"}
    assert MemoryProcessDriver(world, cuda=False).capabilities == frozenset()
    assert MemoryProvider(world, "recovery").capabilities == {"checkpoint"}


def test_advance_shows_bytes_and_rate_to_subscribers_throttled_and_unjournaled(
    tmp_path, monkeypatch
) -> None:
    """A long step's bytes reach the subscribers as `progress` events (the first, then at most
    one per PROGRESS_EVERY_S, and the last), and none of them is journaled. The throttle is set
    beyond any run's length, so what shows does not depend on how fast the loop runs."""
    import time

    from coldsnap.machine import StepEvent, _context

    monkeypatch.setattr(_context, "PROGRESS_EVERY_S", float("inf"))

    class Counting(MemoryProcessDriver):
        def launch_engine(self, ctx: StepContext) -> dict[str, Any]:
            started = time.monotonic() - 1.0
            for done in range(0, 4 << 30, 1 << 28):  # 16 reports at once: only the first shows
                ctx.advance("copied", done, 4 << 30, started)
            ctx.advance("copied", 4 << 30, 4 << 30, started)  # the end always shows
            return super().launch_engine(ctx)

    world = MemoryWorld()
    request = capture_request(tmp_path)
    components = {**memory_components(world, request), "driver": Counting(world)}
    machine = Machine(**components, registry=memory_registry(world))
    seen: list[StepEvent] = []
    machine.subscribe(seen.append)
    receipt = machine.capture(request)
    assert receipt.ok, receipt.error
    shown = [e.detail for e in seen if e.phase == "progress" and e.detail.startswith("copied")]
    assert shown[0].startswith("copied 0.00 of 4.00 GiB, ")
    assert shown[-1].startswith("copied 4.00 of 4.00 GiB, ") and shown[-1].endswith(" GiB/s")
    assert len(shown) == 2, shown
    journaled = [r for r in read_journal(tmp_path / "cap" / JOURNAL_NAME) if r.event == "progress"]
    assert not any("copied" in str(r.facts) for r in journaled)
