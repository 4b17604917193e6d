"""A capture or restore that this host cannot run is refused before it journals or starts
anything: the drivers declare the CRIU they will run (and on a GPU host the CUDA checkpoint
API), and the Machine asks before it takes the workdir. Components that declare nothing (the
doubles) are not asked."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap.backends import Criu, CudaCheckpoint
from coldsnap.drivers import _host
from coldsnap.drivers.n580 import N580Driver
from coldsnap.drivers.n610 import N610Driver
from coldsnap.machine import (
    HostMissing,
    HostNeed,
    Machine,
    RefusedError,
    Request,
    branch_of,
    environment_missing,
)
from coldsnap.testing import MemoryWorld

from ._lifecycle import lifecycle_registry
from ._support import capture_request, restore_request


@pytest.fixture(autouse=True)
def root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root, whoever runs the tests: each test says what else the host lacks."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def fake_criu(tmp_path: Path, version: str) -> Path:
    """An executable that answers `--version` as a CRIU of `version` would."""
    path = tmp_path / f"criu-{version}"
    path.write_text(f"#!/bin/sh\necho 'Version: {version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _driver(name: str, criu: Path) -> Any:
    """The real driver, its CRIU at `criu`. No launcher: were a step to run, it would fail
    at once instead of starting a process."""
    if name == "n610":
        return N610Driver(launcher=None, criu=Criu(criu))  # type: ignore[arg-type]
    return N580Driver(launcher=None, preload=(), criu=Criu(criu))  # type: ignore[arg-type]


def _machine(tmp_path: Path, request: Request, driver: Any) -> Machine:
    """The memory doubles the request names, with `driver` for the real one."""
    registry = lifecycle_registry(MemoryWorld())
    components = registry.components(request).by_role()
    return Machine(**{**components, "driver": driver}, registry=registry)


def _run(machine: Machine, request: Request) -> Any:
    return machine.capture(request) if request.operation == "capture" else machine.restore(
        request)  # fmt: skip


@pytest.mark.parametrize("driver", ["n610", "n580"])
@pytest.mark.parametrize("operation", ["capture", "restore"])
def test_without_criu_the_operation_is_refused_before_anything_starts(
    tmp_path: Path, driver: str, operation: str
) -> None:
    missing = tmp_path / "criu-bundle" / "criu"
    make = capture_request if operation == "capture" else restore_request
    request = make(tmp_path, driver)
    with pytest.raises(HostMissing) as refused:
        _run(_machine(tmp_path, request, _driver(driver, missing)), request)
    error = refused.value
    assert environment_missing(error) and branch_of(error) == RefusedError.__name__
    assert [(m.role, m.component) for m in error.missing] == [("driver", driver)]
    assert f"CRIU >= 4.2 at {missing}" in str(error)
    assert "No such file or directory" in str(error)
    assert f"this host cannot run the {operation}, nothing was started" in str(error)
    assert not Path(request.workdir).exists()  # no journal, no lock, no receipt


def test_an_old_criu_is_refused_naming_what_was_found(tmp_path: Path) -> None:
    old = fake_criu(tmp_path, "3.19")
    request = capture_request(tmp_path)
    with pytest.raises(HostMissing, match=r"is CRIU 3\.19\.0, below 4\.2"):
        _machine(tmp_path, request, _driver("n610", old)).capture(request)
    assert not Path(request.workdir).exists()


@pytest.mark.parametrize("driver", ["n610", "n580"])
def test_a_good_criu_meets_the_need_and_a_stop_needs_none(tmp_path: Path, driver: str) -> None:
    component = _driver(driver, fake_criu(tmp_path, "4.2.1"))
    needs = component.host_needs(SimpleNamespace(operation="capture"))
    assert [need.probe() for need in needs] == [None] * len(needs) and needs
    for operation in ("stop", "sleep", "wake"):
        assert component.host_needs(SimpleNamespace(operation=operation)) == []


def test_a_cpu_host_does_not_ask_for_the_cuda_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(_host, "gpu_host", lambda: False)
    monkeypatch.setattr(CudaCheckpoint, "problem", lambda self: asked.append("api") or "no api")
    driver = _driver("n610", fake_criu(tmp_path, "4.2.1"))
    needs = driver.host_needs(SimpleNamespace(operation="restore"))
    assert [need.what.split()[0] for need in needs] == ["root", "CRIU"]
    assert [need.probe() for need in needs] == [None, None]
    assert asked == []


def test_a_gpu_host_without_the_cuda_api_refuses_an_n610_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_host, "gpu_host", lambda: True)
    monkeypatch.setattr(
        CudaCheckpoint, "problem", lambda self: "cuda init: cuda-bindings is not importable"
    )
    request = restore_request(tmp_path)
    driver = _driver("n610", fake_criu(tmp_path, "4.2.1"))  # built without a CUDA backend
    with pytest.raises(HostMissing, match=r"checkpoint API .*cuda-bindings is not importable"):
        _machine(tmp_path, request, driver).restore(request)
    assert not Path(request.workdir).exists()
    with_api = N610Driver(launcher=None, criu=Criu(fake_criu(tmp_path, "4.2.1")),  # type: ignore[arg-type]
                          cuda=SimpleNamespace())  # type: ignore[arg-type]  # fmt: skip
    assert [n.probe() for n in with_api.host_needs(request)] == [None, None, None]


@pytest.mark.parametrize("driver", ["n610", "n580"])
def test_without_root_the_operation_is_refused_naming_the_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver: str
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    request = capture_request(tmp_path, driver)
    component = _driver(driver, fake_criu(tmp_path, "4.2.1"))
    with pytest.raises(HostMissing) as refused:
        _machine(tmp_path, request, component).capture(request)
    assert [str(m) for m in refused.value.missing] == [
        f"root (CRIU dumps and restores processes as root) (driver '{driver}'): running as uid 1000"
    ]
    assert not Path(request.workdir).exists()


def test_every_unmet_need_is_named_with_its_component(tmp_path: Path) -> None:
    """Needs of any role are asked; a double that declares nothing is not."""
    request = capture_request(tmp_path)
    registry = lifecycle_registry(MemoryWorld())
    components = registry.components(request).by_role()
    provider = components["provider"]
    provider.host_needs = lambda request: [  # type: ignore[attr-defined]
        HostNeed("a pinned checkpoint cache", lambda: "/cache is not mounted"),
        HostNeed("enough disk", lambda: None),
    ]
    machine = Machine(**{**components, "driver": _driver("n610", tmp_path / "nope")},
                      registry=registry)  # fmt: skip
    with pytest.raises(HostMissing) as refused:
        machine.capture(request)
    assert [(m.role, m.what) for m in refused.value.missing] == [
        ("driver", f"CRIU >= 4.2 at {tmp_path / 'nope'}"),
        ("provider", "a pinned checkpoint cache"),
    ]
    assert "a pinned checkpoint cache (provider 'native'): /cache is not mounted" in str(
        refused.value)  # fmt: skip


def test_doubles_declare_nothing_and_run_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLDSNAP_CRIU", str(tmp_path / "no-criu"))
    request = capture_request(tmp_path)
    registry = lifecycle_registry(MemoryWorld())
    receipt = Machine(**registry.components(request).by_role(), registry=registry).capture(
        request)  # fmt: skip
    assert receipt.outcome == "done"
