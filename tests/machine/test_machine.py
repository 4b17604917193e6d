"""The Machine's behaviour around the steps: bad input, timeouts, cancellation, async, events,
journal and resume, and components that lack what a spec needs."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from coldsnap.machine import (
    JOURNAL_NAME,
    ComponentError,
    JournalError,
    Machine,
    MachineBusy,
    RequestError,
    parse_request,
    read_journal,
)
from coldsnap.testing import (
    FaultPlan,
    MemoryProcessDriver,
    MemoryWorld,
    memory_components,
    memory_registry,
)

from ._support import Gate, capture_request, memory_machine, restore_request


def _machine(world: MemoryWorld, tmp: Path, plan: FaultPlan | None = None, **kw) -> Machine:
    """A Machine over the n610 and native doubles (those of the default requests)."""
    return memory_machine(world, capture_request(tmp), plan, **kw)


def _capture_data(tmp: Path) -> dict:
    (tmp / "model").mkdir(exist_ok=True)
    return {
        "kind": "coldsnap.capture-request", "driver": "n610", "provider": "native",
        "model": {"id": "tiny", "revision": "r1", "path": str(tmp / "model")},
        "workdir": str(tmp / "cap"), "store": str(tmp / "store"),
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("model"), "model"),
        (lambda d: d.update(driver="n999"), "driver"),
        (lambda d: d.update(provider="magic"), "provider"),
        (lambda d: d.update(workdir="relative/dir"), "workdir"),
        (lambda d: d.update(store="/no-such-parent/store"), "store"),
        (lambda d: d["model"].update(path="/no/such/model"), "model.path"),
        (lambda d: d["model"].update(path="model"), "model.path"),
        (lambda d: d.update(colour="blue"), "colour"),
        (lambda d: d["model"].update(colour="blue"), "model.colour"),
        (lambda d: d.update(tp=0), "tp"),
        (lambda d: d.update(format=7), "format"),
        (lambda d: d.update(timeouts={"dump": -1}), "timeouts.dump"),
        (lambda d: d.update(kind="coldsnap.nonsense"), "kind"),
        (lambda d: d.update(keep_source="false"), "keep_source"),
        (lambda d: d.update(engine_args="--abc"), "engine_args"),
        (lambda d: d.update(tp=2.7), "tp"),
        (lambda d: d.update(tp=True), "tp"),
        (lambda d: d.update(name=7), "name"),
        (lambda d: d["model"].update(revision=1), "model.revision"),
    ],
)
def test_bad_requests_are_refused_before_any_side_effect(tmp_path, change, field) -> None:
    data = _capture_data(tmp_path)
    change(data)
    world = MemoryWorld()
    machine = _machine(world, tmp_path)
    with pytest.raises(RequestError) as info:
        machine.capture(data)
    assert field in info.value.fields, str(info.value)
    assert f"request field '{field}'" in str(info.value)
    assert not world.calls and not (tmp_path / "cap").exists()


def _restore_data(tmp_path, **fields) -> dict:
    return {"kind": "coldsnap.restore-request", "driver": "n610", "provider": "recovery",
            "artifact": "tiny", "workdir": str(tmp_path / "r"), "store": str(tmp_path / "s"),
            **fields}  # fmt: skip


def test_a_checkpoint_provider_needs_the_checkpoint_from_its_declared_capability(
    tmp_path,
) -> None:
    """The request alone is well formed; the registry's check refuses it, from the capability
    the provider declared at registration, before any side effect."""
    request = parse_request(_restore_data(tmp_path))
    world = MemoryWorld()
    registry = memory_registry(world)
    assert registry.restore_needs_model(request)
    with pytest.raises(RequestError, match="request field 'model': provider 'recovery' brings"):
        registry.check(request)
    with pytest.raises(RequestError, match="request field 'model'"):
        memory_machine(world, request).restore(request)
    assert not world.calls and not (tmp_path / "r").exists()
    native = parse_request(_restore_data(tmp_path, provider="native"))
    assert not registry.restore_needs_model(native)
    registry.check(native)


def test_async_graphs_at_restore_are_refused_for_a_driver_that_resumes_the_process(
    tmp_path,
) -> None:
    (tmp_path / "model").mkdir()
    model = {"id": "tiny", "revision": "r1", "path": str(tmp_path / "model")}
    registry = memory_registry(MemoryWorld())
    resumed = parse_request(_restore_data(tmp_path, async_cuda_graphs=True, model=model))
    assert "resumes_process" in registry.capabilities("driver", "n610")
    with pytest.raises(RequestError, match="request field 'async_cuda_graphs': driver 'n610'"):
        registry.check(resumed)
    built = parse_request(
        _restore_data(tmp_path, async_cuda_graphs=True, model=model, driver="n580")
    )
    registry.check(built)


def test_a_component_without_a_needed_method_fails_before_side_effects(tmp_path) -> None:
    class NoDump(MemoryProcessDriver):
        dump = None  # type: ignore[assignment]

    world = MemoryWorld()
    request = capture_request(tmp_path)
    comps = memory_components(world, request)
    comps["driver"] = NoDump(world)
    machine = Machine(**comps, registry=memory_registry(world))
    with pytest.raises(ComponentError, match="no method 'dump' needed by step 'process_dump'"):
        machine.capture(request)
    assert not world.calls


def test_a_component_without_capabilities_is_refused(tmp_path) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    comps = memory_components(world, request)
    comps["engine"].capabilities = {"cuda_graphs"}  # a set, not a frozenset
    machine = Machine(**comps, registry=memory_registry(world))
    with pytest.raises(ComponentError, match=r"engine .* has no frozenset `capabilities`"):
        machine.capture(request)
    assert not world.calls


def test_a_component_for_another_driver_is_refused(tmp_path) -> None:
    world = MemoryWorld()
    with pytest.raises(ComponentError, match="asks for driver 'n580'"):
        _machine(world, tmp_path).capture(capture_request(tmp_path, "n580"))


@pytest.mark.parametrize("polls", [True, False], ids=["polls", "blocks"])
def test_a_slow_step_times_out_and_compensates(tmp_path, polls) -> None:
    """A step that polls `ctx.check()` stops at its timeout; one that blocks is abandoned at its
    timeout plus the grace. Either way the run compensates."""
    world = MemoryWorld()
    request = parse_request({**_as_data(capture_request(tmp_path)),
                             "timeouts": {"process_dump": 0.2}})  # fmt: skip
    machine = _machine(world, tmp_path, grace_s=0.1)
    gate = Gate()
    (gate.hold if polls else gate.block)(machine.components["driver"], "dump")
    receipt = machine.capture(request)
    assert receipt.outcome == "rolled_back"
    assert receipt.failure is not None
    assert (receipt.failure.type, receipt.failure.step) == ("StepTimeout", "process_dump")
    assert ("did not return within" in receipt.error) is not polls
    assert not world.transient()
    gate.open()  # an abandoned step's thread ends


def _as_data(request) -> dict:
    from coldsnap.machine._convert import unstructure
    return unstructure(request)


def test_cancel_during_a_step_compensates(tmp_path) -> None:
    world = MemoryWorld()
    machine = _machine(world, tmp_path)
    gate = Gate()
    gate.hold(machine.components["engine"], "release_memory")
    events = []
    machine.subscribe(events.append)
    cancel = threading.Event()
    result = {}
    run = threading.Thread(
        target=lambda: result.update(
            receipt=machine.capture(capture_request(tmp_path), cancel=cancel)
        )
    )
    run.start()
    assert gate.entered.wait(60), "the step never started"
    cancel.set()  # while release_memory runs
    run.join()
    receipt = result["receipt"]
    assert receipt.outcome == "rolled_back"
    assert "Cancelled" in receipt.error
    # release_memory's own compensation first (it may have half happened), then back from the
    # last completed step that has one: quiesce has none (a flushed cache refills by itself).
    assert [c.name for c in receipt.compensations] == ["release_memory", "launch_engine"]
    assert not world.transient()
    assert ("release_memory", "failed") in {(e.step, e.phase) for e in events}


def test_async_capture_and_cancellation(tmp_path) -> None:
    world = MemoryWorld()

    async def main() -> None:
        machine = _machine(world, tmp_path)
        receipt = await machine.capture_async(capture_request(tmp_path))
        assert receipt.ok
        slow = _machine(world, tmp_path)
        gate = Gate()
        gate.hold(slow.components["driver"], "restore")
        task = asyncio.ensure_future(slow.restore_async(restore_request(tmp_path)))
        assert await asyncio.to_thread(gate.entered.wait, 60), "the restore never started"
        task.cancel()  # while the driver restores
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not world.transient(), "cancellation left something running"
        receipt = json.loads((tmp_path / "res" / "receipt.json").read_text())
        assert receipt["outcome"] == "rolled_back"

    asyncio.run(main())


def test_events_journal_and_receipt_agree(tmp_path) -> None:
    world = MemoryWorld(cuda=False)
    events = []
    machine = _machine(world, tmp_path, subscribers=[events.append])
    receipt = machine.capture(capture_request(tmp_path))
    assert receipt.ok
    assert all(r.status == "done" for r in receipt.steps)
    ran = {r.name for r in receipt.steps}
    assert not ran & {"cuda_lock", "cuda_checkpoint"}, "no CUDA: the CUDA steps are not selected"
    assert not any(c.startswith("driver.cuda") for c in world.calls)
    records = read_journal(tmp_path / "cap" / JOURNAL_NAME)
    ends = [r.step for r in records if r.event == "step_end"]
    assert ends == [r.name for r in receipt.steps]
    assert [e.step for e in events if e.phase == "done"] == ends
    assert all(r.format == 3 and r.kind == "coldsnap.journal-record" for r in records)
    on_disk = json.loads((tmp_path / "cap" / "receipt.json").read_text())
    assert on_disk["kind"] == "coldsnap.receipt" and on_disk["outcome"] == "done"
    assert set(receipt.timings()) == set(ends)


def test_resuming_a_finished_operation_returns_its_receipt(tmp_path) -> None:
    world = MemoryWorld()
    receipt = _machine(world, tmp_path).capture(capture_request(tmp_path))
    calls = len(world.calls)
    again = _machine(world, tmp_path).resume(tmp_path / "cap")
    assert again == receipt and len(world.calls) == calls


def test_a_workdir_with_a_journal_is_not_reused(tmp_path) -> None:
    world = MemoryWorld()
    assert _machine(world, tmp_path).capture(capture_request(tmp_path)).ok
    with pytest.raises(JournalError, match="resume it, or use a new workdir"):
        _machine(world, tmp_path).capture(capture_request(tmp_path, name="other"))


def test_a_torn_last_journal_line_is_ignored_but_a_torn_middle_is_not(tmp_path) -> None:
    world = MemoryWorld()
    assert _machine(world, tmp_path).capture(capture_request(tmp_path)).ok
    path = tmp_path / "cap" / JOURNAL_NAME
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert read_journal(path)[-1].seq == len(lines) - 2
    path.write_text("\n".join([lines[0], "{broken", *lines[2:]]) + "\n")
    with pytest.raises(JournalError, match=":2: not a journal record"):
        read_journal(path)


def test_one_operation_at_a_time(tmp_path) -> None:
    world = MemoryWorld()
    machine = _machine(world, tmp_path)
    gate = Gate()
    gate.hold(machine.components["driver"], "launch_engine")
    result = {}
    first = threading.Thread(
        target=lambda: result.update(receipt=machine.capture(capture_request(tmp_path)))
    )
    first.start()
    assert gate.entered.wait(60), "the first capture never started"
    with pytest.raises(MachineBusy, match="this Machine is already running an operation"):
        machine.capture(capture_request(tmp_path, workdir="other"))
    gate.open()
    first.join()
    assert result["receipt"].ok
