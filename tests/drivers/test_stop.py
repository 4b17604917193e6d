"""The drivers' stop operation step (stop_engine in a stop spec): it acts on the target's engine
and workdir, removes what the driver left on the host (the runtime dir; n580's template control
dir too) and CRIU's restore work dir in the target's workdir, and never signals a process that
took the engine's PID since (it must still belong to the engine: n610 by its runtime dir, n580
by its control dir)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap.backends.procs import pid_exists
from coldsnap.drivers._processes import HOST_ROOT, RESTORE_WORK, RUNTIME_ENV
from coldsnap.drivers.n580 import STOP as STOP_N580
from coldsnap.drivers.n580 import N580Driver
from coldsnap.drivers.n610 import STOP as STOP_N610
from coldsnap.drivers.n610 import N610Driver
from coldsnap.machine import StopRequest


@pytest.fixture
def host_dir() -> Any:
    made: list[Path] = []

    def make(kind: str) -> Path:
        path = HOST_ROOT / kind / f"test-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        made.append(path)
        return path

    yield make
    for path in made:
        if path.exists():
            path.rmdir()


def _sleeper(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """A process that has said it runs: Popen returns once the exec began, before the kernel
    has set up the new environment and command line that stop_engine reads."""
    code = "import time; print('ready', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            env={**os.environ, **env})  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.stdout.close()  # it writes nothing more
    return proc


def _ctx(tmp_path: Path, driver: str, **facts: Any) -> Any:
    target = tmp_path / "restore"
    (target / RESTORE_WORK).mkdir(parents=True)
    (target / RESTORE_WORK / "restore.log").write_text("criu said")
    request = StopRequest(target=str(target), workdir=str(target / "ops" / "stop-1"),
                          driver=driver, provider="native")  # fmt: skip
    return SimpleNamespace(request=request, workdir=Path(request.workdir), facts=facts,
                           check=lambda: None)  # fmt: skip


def test_the_specs_are_one_stop_step_and_the_layout(tmp_path: Path) -> None:
    for spec in (STOP_N610, STOP_N580):
        assert [step.name for step in spec.steps] == ["stop_engine", "discard_layout"]
        assert spec.steps[0].on_interrupt == "retry"


def test_n610_stops_the_tree_and_removes_its_runtime_dir(tmp_path: Path, host_dir) -> None:
    runtime = host_dir("engines")
    proc = _sleeper({RUNTIME_ENV: str(runtime)})
    ctx = _ctx(tmp_path, "n610", engine_pid=proc.pid, runtime_dir=str(runtime))
    N610Driver(launcher=None).stop_engine(ctx)  # type: ignore[arg-type]
    assert proc.wait(10) is not None and not pid_exists(proc.pid)
    assert not runtime.exists()
    target = Path(ctx.request.target)
    assert not (target / RESTORE_WORK).exists() and (target / f"{RESTORE_WORK}.log").exists()


def test_n610_leaves_a_process_that_is_not_its_engine(tmp_path: Path, host_dir) -> None:
    runtime = host_dir("engines")
    stranger = _sleeper({RUNTIME_ENV: "/run/coldsnap/engines/another"})
    try:
        ctx = _ctx(tmp_path, "n610", engine_pid=stranger.pid, runtime_dir=str(runtime))
        N610Driver(launcher=None).stop_engine(ctx)  # type: ignore[arg-type]
        assert stranger.poll() is None, "stop signalled a process that is not the engine"
        assert not runtime.exists()
    finally:
        stranger.kill()
        stranger.wait(10)


def test_n580_stops_the_engine_and_removes_the_template_s_control_dir(
    tmp_path: Path, host_dir
) -> None:
    control, runtime = host_dir("templates"), host_dir("engines")
    proc = _sleeper({}, "--control", str(control))
    ctx = _ctx(tmp_path, "n580", engine_pid=proc.pid, template_pid=proc.pid,
               control_dir=str(control), runtime_dir=str(runtime))  # fmt: skip
    N580Driver(launcher=None, preload=()).stop_engine(ctx)  # type: ignore[arg-type]
    assert proc.wait(10) is not None
    assert not control.exists() and not runtime.exists()


def test_n580_leaves_a_process_without_its_control_dir(tmp_path: Path, host_dir) -> None:
    control = host_dir("templates")
    stranger = _sleeper({}, "--control", "/run/coldsnap/templates/another")
    try:
        ctx = _ctx(tmp_path, "n580", engine_pid=stranger.pid, control_dir=str(control))
        N580Driver(launcher=None, preload=()).stop_engine(ctx)  # type: ignore[arg-type]
        assert stranger.poll() is None, "stop signalled a process that is not the engine"
        assert not control.exists()
    finally:
        stranger.kill()
        stranger.wait(10)
