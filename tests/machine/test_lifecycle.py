"""Stop, sleep and wake as Machine operations: a target that must be a finished capture or
restore, facts seeded from it and journaled in `begin`, both workdirs locked, resume from the
op's own journal, and the registry picking the owner's spec (driver or engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coldsnap.machine import (
    JOURNAL_NAME,
    Machine,
    Registry,
    RegistryError,
    RequestError,
    SleepRequest,
    Spec,
    SpecError,
    Step,
    StopRequest,
    WakeRequest,
    _journal,
    document,
    lifecycle_request,
    op_workdir,
    parse_request,
    read_journal,
)
from coldsnap.machine import steps as s
from coldsnap.testing import Abandoned, FaultPlan, MemoryWorld

from ._lifecycle import SLEEP, STOP_N610, WAKE, SleepyEngine, lifecycle_registry
from ._support import capture_request, memory_machine, restore_request


def _restored(tmp: Path, world: MemoryWorld, provider: str = "native") -> Path:
    """A capture and a restore (the engine runs); the restore's workdir."""
    assert memory_machine(world, capture_request(tmp, provider=provider)).capture(
        capture_request(tmp, provider=provider)
    ).ok
    request = restore_request(tmp, provider=provider)
    assert memory_machine(world, request).restore(request).ok
    return tmp / "res"


def _machine(world: MemoryWorld, request, plan: FaultPlan | None = None) -> Machine:
    return memory_machine(world, request, plan)


def _pid(workdir: Path) -> int:
    return json.loads((workdir / "receipt.json").read_text())["facts"]["engine_pid"]


def test_stop_is_journaled_in_its_own_workdir_with_the_seeds_in_begin(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    pid = _pid(target)
    request = lifecycle_request("stop", target)
    assert isinstance(request, StopRequest)
    assert request.workdir == str(target / "ops" / "stop-1")
    assert (request.driver, request.provider, request.engine) == ("n610", "native", "sglang")
    receipt = _machine(world, request).stop(request)
    assert receipt.ok and receipt.operation == "stop" and receipt.spec == "stop-n610"
    assert world.alive(pid) is None
    begin = read_journal(Path(request.workdir) / JOURNAL_NAME)[0]
    assert begin.facts == {"engine_pid": pid}, "only the spec's seeds, from the target"
    assert (Path(request.workdir) / "receipt.json").exists()
    assert op_workdir(target, "stop") == target / "ops" / "stop-2"


def test_stop_receipt_is_the_embedders_convenience(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    restored = json.loads((target / "receipt.json").read_text())
    machine = _machine(world, restore_request(tmp_path))
    from coldsnap.machine._targets import read_receipt as _read_receipt

    receipt = machine.stop(_read_receipt(target))
    assert receipt.ok and receipt.workdir == str(target / "ops" / "stop-1")
    assert world.alive(restored["facts"]["engine_pid"]) is None


def test_sleep_and_wake_use_the_engines_specs(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    pid = _pid(target)
    weights = world.process(pid)["weights"]
    sleep = lifecycle_request("sleep", target)
    assert isinstance(sleep, SleepRequest)
    machine = _machine(world, sleep)
    assert isinstance(machine.components["engine"], SleepyEngine)
    receipt = machine.sleep(sleep)
    assert receipt.ok and receipt.spec == "sleep-sglang"
    assert world.process(pid)["weights"] == "asleep"
    wake = lifecycle_request("wake", target)
    assert isinstance(wake, WakeRequest)
    assert _machine(world, wake).wake(wake).ok
    assert world.process(pid)["weights"] == weights


def test_a_lifecycle_request_round_trips_and_is_strict(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    request = lifecycle_request("sleep", target, timeouts={"fall_asleep": 5})
    from coldsnap.machine._convert import unstructure

    data = unstructure(request)
    assert data["kind"] == "coldsnap.sleep-request"
    assert parse_request(data) == request
    with pytest.raises(RequestError) as info:
        parse_request({**data, "target": "relative"})
    assert "target" in info.value.fields
    with pytest.raises(RequestError) as info:
        parse_request({**data, "workdir": str(target)})
    assert "workdir" in info.value.fields
    with pytest.raises(RequestError) as info:
        parse_request({**data, "timeouts": {"fall_asleep": True}})
    assert "timeouts" in info.value.fields
    with pytest.raises(RequestError) as info:
        parse_request({**data, "colour": "blue"})
    assert "colour" in info.value.fields
    with pytest.raises(RequestError, match="request field 'operation'"):
        lifecycle_request("nap", target)


def test_a_lifecycle_request_names_the_targets_model_for_steps_that_read_it_again(
    tmp_path,
) -> None:
    """A wake from a pinned checkpoint verifies and reloads the model's files, so the request
    carries the model (and draft) the target's request named."""
    world = MemoryWorld()
    target = _restored(tmp_path, world, provider="recovery")
    journaled = parse_request(read_journal(target / JOURNAL_NAME)[0].request or {})
    wake = lifecycle_request("wake", target)
    assert journaled.model is not None
    assert (wake.model, wake.draft) == (journaled.model, journaled.draft)


def test_a_target_that_did_not_finish_is_refused_naming_target(tmp_path) -> None:
    world = MemoryWorld()
    assert memory_machine(world, capture_request(tmp_path)).capture(capture_request(tmp_path)).ok
    request = restore_request(tmp_path)
    failed = memory_machine(world, request, FaultPlan(fail={"engine.wait_healthy"}))
    assert failed.restore(request).outcome == "rolled_back"
    stop = lifecycle_request("stop", tmp_path / "res")
    calls = len(world.calls)
    with pytest.raises(RequestError, match=r"request field 'target': .* ended rolled_back"):
        _machine(world, stop).stop(stop)
    assert len(world.calls) == calls and not Path(stop.workdir).exists()


def test_a_target_without_a_receipt_is_refused_naming_target(tmp_path) -> None:
    world = MemoryWorld()
    assert memory_machine(world, capture_request(tmp_path)).capture(capture_request(tmp_path)).ok
    request = restore_request(tmp_path)
    with pytest.raises(Abandoned):
        memory_machine(world, request, FaultPlan(abandon_at=3)).restore(request)
    stop = lifecycle_request("stop", tmp_path / "res")
    with pytest.raises(RequestError, match=r"request field 'target': .* no receipt"):
        _machine(world, stop).stop(stop)
    with pytest.raises(RequestError, match="request field 'target'"):
        lifecycle_request("stop", tmp_path / "nothing-here")


def test_a_capture_that_kept_its_source_is_a_target(tmp_path) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path, keep_source=True)
    receipt = memory_machine(world, request).capture(request)
    assert receipt.ok
    pid = receipt.facts["engine_pid"]
    assert world.alive(pid) is not None
    stop = lifecycle_request("stop", tmp_path / "cap")
    assert _machine(world, stop).stop(stop).ok
    assert world.alive(pid) is None


def test_other_components_than_the_targets_are_refused_naming_them(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    request = StopRequest(
        target=str(target), workdir=str(target / "ops" / "x"), driver="n610",
        provider="recovery", engine="sglang",
    )  # fmt: skip
    with pytest.raises(RequestError, match=r"request field 'provider': 'recovery', but the "
                       r"target ran with 'native'"):  # fmt: skip
        _machine(world, request).stop(request)


def test_the_target_is_locked_for_the_whole_operation(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    stop = lifecycle_request("stop", target)
    with _journal.workdir_lock(target), pytest.raises(_journal.WorkdirBusy):
        _machine(world, stop).stop(stop)
    seen: list[str] = []

    class Probing(SleepyEngine):
        def fall_asleep(self, ctx):  # the target's lock is held while a step runs
            try:
                with _journal.workdir_lock(target):
                    seen.append("free")
            except _journal.WorkdirBusy:
                seen.append("held")
            return super().fall_asleep(ctx)

    sleep = lifecycle_request("sleep", target)
    machine = _machine(world, sleep)
    machine.components["engine"] = Probing(world)
    assert machine.sleep(sleep).ok
    assert seen == ["held"]


def test_resume_reads_the_seeds_from_the_journal_not_the_target(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    pid = _pid(target)
    stop = lifecycle_request("stop", target)
    with pytest.raises(Abandoned):
        _machine(world, stop, FaultPlan(abandon_at=0)).stop(stop)
    assert world.alive(pid) is not None, "abandoned before the stop took effect"
    # The target's receipt changes meanwhile: the resume must not read it.
    path = target / "receipt.json"
    data = json.loads(path.read_text())
    data["facts"]["engine_pid"] = 999999
    path.write_text(json.dumps(data))
    with _journal.workdir_lock(target), pytest.raises(_journal.WorkdirBusy):
        _machine(world, stop).resume(stop.workdir)
    receipt = _machine(world, stop).resume(stop.workdir)
    assert receipt.ok and receipt.resumed
    assert world.alive(pid) is None
    assert receipt.facts["engine_pid"] == pid


def test_a_failed_sleep_compensates(tmp_path) -> None:
    world = MemoryWorld()
    target = _restored(tmp_path, world)
    pid = _pid(target)
    weights = world.process(pid)["weights"]
    sleep = lifecycle_request("sleep", target)
    plan = FaultPlan(fail={"engine.fall_asleep"})
    receipt = _machine(world, sleep, plan).sleep(sleep)
    assert receipt.outcome == "rolled_back"
    assert world.process(pid)["weights"] == weights


def test_the_registry_picks_the_owners_spec() -> None:
    world = MemoryWorld()
    registry = lifecycle_registry(world)
    assert registry.spec("stop", "n610") is STOP_N610
    request = StopRequest(target="/", workdir="/tmp/x", driver="n610", provider="native")
    assert registry.spec("stop", request) is STOP_N610
    assert registry.spec("sleep", request) is SLEEP
    assert registry.spec("wake", "sglang") is WAKE
    assert {"stop-n610", "sleep-sglang", "wake-sglang"} <= {x.name for x in registry.specs()}
    with pytest.raises(RegistryError, match="no operation 'nap'"):
        registry.spec("nap", request)
    text = document(registry.specs())
    assert "Owned by the engine `sglang`. Seeded from the target: engine_pid" in text


def test_an_engine_spec_is_checked_against_its_class_and_operation() -> None:
    registry = Registry(entry_points=False)
    with pytest.raises(SpecError, match="not the wake spec of engine 'sglang'"):
        registry.register_engine("sglang", build=lambda r: None, wake=SLEEP, cls=SleepyEngine)
    with pytest.raises(SpecError, match="SleepyEngine has no method 'snore'"):
        registry.register_engine(
            "sglang",
            build=lambda r: None,
            sleep=Spec(
                "sleep-sglang",
                "sleep",
                "sglang",
                [Step("snore", "engine.snore", "doc", side_effect=False)],
            ),
            cls=SleepyEngine,
        )
    with pytest.raises(SpecError, match="not the stop spec of driver 'n610'"):
        registry.register_driver(
            "n610", capture=STOP_N610, restore=STOP_N610, stop=SLEEP, build=lambda r, e: None
        )


def test_seeds_are_for_lifecycle_specs_and_satisfy_needs() -> None:
    step = Step("use_pid", "driver.stop_engine", "doc", side_effect=False, needs=(s.ENGINE_PID,))
    Spec("stop-x", "stop", "x", [step], seeds=(s.ENGINE_PID,))
    with pytest.raises(SpecError, match="needs fact 'engine_pid', which no earlier step makes"):
        Spec("stop-x", "stop", "x", [step])
    with pytest.raises(SpecError, match="a capture spec has no target to seed facts from"):
        Spec("capture-x", "capture", "x", [step], seeds=(s.ENGINE_PID,))
    uses = Step("peek", "driver.stop_engine", "doc", side_effect=False, uses=(s.RUNTIME_DIR,))
    with pytest.raises(SpecError, match="uses fact 'runtime_dir', which no step of the spec"):
        Spec("stop-x", "stop", "x", [uses])
    Spec("stop-x", "stop", "x", [uses], seeds=(s.RUNTIME_DIR,))


def test_a_lifecycle_request_carries_the_targets_engine_options(tmp_path) -> None:
    """The adapter built for a stop, sleep or wake is the one that started the engine (its
    options decide, for one, whether the graphs lie in the memory saver)."""
    import attrs

    world = MemoryWorld()
    options = {"knob": "on"}
    capture = capture_request(tmp_path, engine_options=options)
    assert memory_machine(world, capture).capture(capture).ok
    restore = attrs.evolve(restore_request(tmp_path), engine_options=options)
    assert memory_machine(world, restore).restore(restore).ok
    assert lifecycle_request("sleep", tmp_path / "res").engine_options == options
    assert lifecycle_request("stop", tmp_path / "cap").engine_options == options
