"""The registry: names to factories, refused when taken twice; a driver's specs checked against
the protocols when it registers; entry points loaded once, a failing one named; requests checked
against what is registered."""

from __future__ import annotations

import importlib.metadata

import pytest

from coldsnap.drivers import n610
from coldsnap.machine import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    Machine,
    Registry,
    RegistryError,
    RequestError,
    Spec,
    SpecError,
    Step,
)
from coldsnap.machine import _registry as registry_module
from coldsnap.testing import MemoryProcessDriver, MemoryWorld, memory_registry

from ._support import capture_request


def test_the_built_in_components_are_registered_through_entry_points() -> None:
    assert {"n580", "n610"} <= set(REGISTRY.names("driver"))
    assert {"native", "recovery"} <= set(REGISTRY.names("provider"))
    assert "sglang" in REGISTRY.names("engine")
    assert "store" in REGISTRY.names("store")
    assert REGISTRY.spec("capture", "n610") is n610.CAPTURE
    assert REGISTRY.spec_named("restore-n610") is n610.RESTORE
    assert {spec.name for spec in REGISTRY.specs()} >= {
        "capture-n580", "capture-n610", "restore-n580", "restore-n610",
    }  # fmt: skip


def test_a_taken_name_is_refused() -> None:
    registry = memory_registry(MemoryWorld())
    with pytest.raises(RegistryError, match="a driver named 'n610' is already registered"):
        registry.register_driver(
            "n610", capture=n610.CAPTURE, restore=n610.RESTORE, build=lambda r, e: None
        )
    with pytest.raises(RegistryError, match="a provider named 'native' is already registered"):
        registry.register_provider("native", build=lambda r: None)
    registry.unregister("provider", "native")
    registry.register_provider("native", build=lambda r: None)


def test_an_unknown_name_lists_what_is_known() -> None:
    registry = memory_registry(MemoryWorld())
    with pytest.raises(
        RegistryError, match=r"no driver named 'n999' is registered \(known: n580, n610\)"
    ):
        registry.get("driver", "n999")
    with pytest.raises(RegistryError, match="no driver named 'n999'"):
        registry.spec("capture", "n999")


def _spec(operation: str, driver: str, *steps: Step) -> Spec:
    return Spec(f"{operation}-{driver}", operation, driver, list(steps))


_LAUNCH = Step("launch_engine", "driver.launch_engine", "doc", compensation="driver.stop_engine")


def test_an_action_not_on_its_roles_protocol_is_refused() -> None:
    teleport = Step("teleport", "engine.teleport", "doc", side_effect=False)
    with pytest.raises(SpecError) as info:
        Registry(entry_points=False).register_driver(
            "x1",
            capture=_spec("capture", "x1", _LAUNCH, teleport),
            restore=_spec("restore", "x1", _LAUNCH),
            build=lambda r, e: None,
        )
    message = str(info.value)
    assert (
        "driver 'x1': step 'teleport': 'engine.teleport' is not declared on the engine" in message
    )
    assert "declared: " in message and "wait_healthy" in message


def test_a_driver_method_missing_from_the_class_is_refused() -> None:
    fly = Step("fly", "driver.fly", "doc", side_effect=False)
    with pytest.raises(SpecError, match="step 'fly': MemoryProcessDriver has no method 'fly'"):
        Registry(entry_points=False).register_driver(
            "x2",
            capture=_spec("capture", "x2", _LAUNCH, fly),
            restore=_spec("restore", "x2", _LAUNCH),
            build=lambda r, e: None,
            cls=MemoryProcessDriver,
        )


def test_specs_must_be_the_drivers_own_capture_and_restore() -> None:
    with pytest.raises(SpecError) as info:
        Registry(entry_points=False).register_driver(
            "x3", capture=n610.RESTORE, restore=n610.CAPTURE, build=lambda r, e: None
        )
    message = str(info.value)
    assert (
        "spec 'restore-n610' is a restore spec of driver 'n610', not the capture spec of "
        "driver 'x3'" in message
    )
    assert "not the restore spec of driver 'x3'" in message


@pytest.mark.parametrize(
    ("field", "value"), [("driver", "n999"), ("provider", "magic"), ("engine", "vllm9")]
)
def test_a_request_naming_an_unregistered_component_is_refused(tmp_path, field, value) -> None:
    request = capture_request(tmp_path, **{"driver": "n610", "provider": "native", field: value})
    registry = memory_registry(MemoryWorld())
    with pytest.raises(RequestError) as info:
        Machine.for_request(request, registry=registry)
    assert info.value.fields == (field,)
    assert not (tmp_path / "cap").exists(), "refused before the journal is created"
    assert f"request field '{field}': unknown {field} '{value}' (registered: " in str(info.value)


def test_for_request_builds_the_registered_components(tmp_path) -> None:
    world = MemoryWorld()
    registry = memory_registry(world)
    request = capture_request(tmp_path)
    machine = Machine.for_request(request, registry=registry)
    assert isinstance(machine.components["driver"], MemoryProcessDriver)
    assert machine.components["driver"].launcher is machine.components["engine"].launcher
    assert machine.capture(request).ok
    assert world.capsules


class _CheckingEngine:
    """An engine class whose request checks the registry reads without building it."""

    @staticmethod
    def check_engine_args(args) -> list[tuple[str, str]]:
        return [("engine_args", f"{a} is the engine's to refuse") for a in args if a == "--x"]

    @staticmethod
    def check_engine_options(options) -> list[tuple[str, str]]:
        return [(f"engine_options.{k}", "is not an option") for k in options if k != "ok"]


def _checking_registry() -> Registry:
    registry = memory_registry(MemoryWorld())
    registry.unregister("engine", "sglang")
    registry.register_engine("sglang", build=_never_built, cls=_CheckingEngine)
    return registry


def _never_built(request):
    raise AssertionError("a check builds no engine")


def test_the_engine_class_checks_engine_args_without_being_built(tmp_path) -> None:
    registry = _checking_registry()
    registry.check(capture_request(tmp_path, engine_args=("--y",)))
    with pytest.raises(RequestError) as info:
        registry.check(capture_request(tmp_path, engine_args=("--y", "--x")))
    assert info.value.problems == (("engine_args", "--x is the engine's to refuse"),)


def test_the_engine_class_checks_engine_options_without_being_built(tmp_path) -> None:
    registry = _checking_registry()
    registry.check(capture_request(tmp_path, engine_options={"ok": "1"}))
    with pytest.raises(RequestError) as info:
        registry.check(capture_request(tmp_path, engine_options={"ok": "1", "nope": "2"}))
    assert info.value.fields == ("engine_options.nope",)


def test_an_engine_registered_without_a_class_is_not_asked(tmp_path) -> None:
    memory_registry(MemoryWorld()).check(capture_request(tmp_path, engine_args=("--x",)))


# -- entry points -------------------------------------------------------------------------------

CALLS: list[str] = []


def register_fake(registry: Registry) -> None:
    CALLS.append("fake")
    registry.register_provider("fake", build=lambda request: None, doc="from an entry point")


def register_broken(registry: Registry) -> None:
    raise ImportError("no module named 'fancy_gpu_lib'")


def _entry_points(*targets: str):
    points = [
        importlib.metadata.EntryPoint(name=t, value=f"{__name__}:{t}", group=ENTRY_POINT_GROUP)
        for t in targets
    ]

    def entry_points(*, group: str):
        return [p for p in points if p.group == group]

    return entry_points


def test_entry_points_are_loaded_once_on_first_read(monkeypatch) -> None:
    monkeypatch.setattr(registry_module.importlib.metadata, "entry_points",
                        _entry_points("register_fake"))  # fmt: skip
    CALLS.clear()
    registry = Registry()
    assert CALLS == [], "nothing loads before the registry is read"
    assert registry.names("provider") == ("fake",)
    assert registry.get("provider", "fake").doc == "from an entry point"
    assert registry.names("driver") == ()
    assert CALLS == ["fake"]


def test_a_failing_entry_point_is_named(monkeypatch) -> None:
    monkeypatch.setattr(registry_module.importlib.metadata, "entry_points",
                        _entry_points("register_broken"))  # fmt: skip
    with pytest.raises(RegistryError) as info:
        Registry().names("driver")
    message = str(info.value)
    assert f"entry point 'register_broken' ({__name__}:register_broken)" in message
    assert "ImportError: no module named 'fancy_gpu_lib'" in message


def test_a_private_registry_reads_no_entry_points(monkeypatch) -> None:
    monkeypatch.setattr(registry_module.importlib.metadata, "entry_points",
                        _entry_points("register_broken"))  # fmt: skip
    assert Registry(entry_points=False).names("driver") == ()
