"""Replicas of one capsule on one host: CRIU gives every restore of an image the same PIDs and
environment (the runtime dir among it), so neither tells two replicas apart. A stop acts only on
the process whose start stamp its target recorded, and neither a stop nor a failed restore's
compensation removes a runtime dir (or an n580 control dir) that a live replica uses.

The replicas here are plain processes that carry the same runtime dir; the stop of a crashed
replica meets the live one under the PID the crashed one had, as it does after a real restore
(tests/drivers/test_replicas_criu.py restores them with CRIU)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap.backends.procs import running, start_stamp
from coldsnap.drivers._processes import HOST_ROOT, RESTORE_WORK, RUNTIME_ENV
from coldsnap.drivers.n580 import N580Driver
from coldsnap.drivers.n610 import N610Driver
from coldsnap.machine import RestoreRequest, StopRequest


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    path = HOST_ROOT / "engines" / f"test-{uuid.uuid4().hex}"
    path.mkdir(parents=True)
    yield path
    if path.exists():
        path.rmdir()


@pytest.fixture
def spawn() -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        """A process that has said it runs: Popen returns once the exec began, before the
        kernel has set up the new environment that the drivers read."""
        code = "import time; print('ready', flush=True); time.sleep(600)"
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                                env={**os.environ, **env})  # fmt: skip
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _crashed(spawn: Any, env: dict[str, str], *args: str) -> str:
    """The start stamp of a replica that ran and crashed."""
    first = spawn(env, *args)
    stamp = start_stamp(first.pid)
    first.kill()
    first.wait(10)
    assert stamp is not None
    return stamp


def _started_after(spawn: Any, stamp: str, env: dict[str, str], *args: str) -> Any:
    """A process started after the one `stamp` names. Start times count clock ticks (10 ms),
    and a replica is restored seconds after another crashed; a process spawned here within
    the same tick is replaced by the next one."""
    while True:
        proc = spawn(env, *args)
        if start_stamp(proc.pid) != stamp:
            return proc
        proc.kill()
        proc.wait(10)


def _stop_ctx(tmp_path: Path, driver: str, **facts: Any) -> Any:
    target = tmp_path / "replica-1"
    (target / RESTORE_WORK).mkdir(parents=True)
    request = StopRequest(target=str(target), workdir=str(target / "ops" / "stop-1"),
                          driver=driver, provider="native")  # fmt: skip
    return SimpleNamespace(request=request, workdir=Path(request.workdir), facts=facts,
                           check=lambda: None)  # fmt: skip


def test_a_start_stamp_names_one_process(spawn: Any) -> None:
    first = spawn({})
    stamp = start_stamp(first.pid)
    second = _started_after(spawn, str(stamp), {})
    boot, ticks = str(stamp).rsplit(":", 1)
    assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip() and int(ticks) > 0
    assert start_stamp(first.pid) == stamp, "a process's stamp changes"
    assert running(first.pid, started=stamp)
    assert not running(first.pid, started=start_stamp(second.pid))
    first.kill()
    first.wait(10)
    assert start_stamp(first.pid) is None and not running(first.pid, started=stamp)


def test_n610_stop_of_a_crashed_replica_leaves_the_live_one(
    tmp_path: Path, runtime_dir: Path, spawn: Any
) -> None:
    env = {RUNTIME_ENV: str(runtime_dir)}
    stamp = _crashed(spawn, env)
    live = _started_after(spawn, stamp, env)  # same environment, after CRIU the same PID
    ctx = _stop_ctx(tmp_path, "n610", engine_pid=live.pid, runtime_dir=str(runtime_dir),
                    engine_start=stamp)  # fmt: skip
    N610Driver(launcher=None).stop_engine(ctx)  # type: ignore[arg-type]
    assert live.poll() is None, "the stop of the crashed replica stopped the live one"
    assert runtime_dir.is_dir(), "the live replica's runtime dir was removed"


def test_n610_stop_of_the_replica_it_names_still_stops_it(
    tmp_path: Path, runtime_dir: Path, spawn: Any
) -> None:
    live = spawn({RUNTIME_ENV: str(runtime_dir)})
    ctx = _stop_ctx(tmp_path, "n610", engine_pid=live.pid, runtime_dir=str(runtime_dir),
                    engine_start=start_stamp(live.pid))  # fmt: skip
    N610Driver(launcher=None).stop_engine(ctx)  # type: ignore[arg-type]
    assert live.wait(10) is not None and not runtime_dir.exists()


def test_n580_stop_of_a_crashed_replica_leaves_the_live_one(
    tmp_path: Path, runtime_dir: Path, spawn: Any
) -> None:
    control = HOST_ROOT / "templates" / f"test-{uuid.uuid4().hex}"
    control.mkdir(parents=True)
    try:
        stamp = _crashed(spawn, {}, "--control", str(control))
        live = _started_after(spawn, stamp, {RUNTIME_ENV: str(runtime_dir)}, "--control",
                              str(control))  # fmt: skip
        ctx = _stop_ctx(tmp_path, "n580", engine_pid=live.pid, template_pid=live.pid,
                        control_dir=str(control), runtime_dir=str(runtime_dir),
                        engine_start=stamp)  # fmt: skip
        N580Driver(launcher=None, preload=()).stop_engine(ctx)  # type: ignore[arg-type]
        assert live.poll() is None, "the stop of the crashed replica stopped the live one"
        assert control.is_dir() and runtime_dir.is_dir()
    finally:
        if control.exists():
            control.rmdir()


class _CollidingCriu:
    """CRIU's restore failing as it does while a live replica holds the image's PIDs."""

    def restore(self, images: Path, **options: Any) -> Any:
        raise OSError("criu restore: PID 4242 is in use")


def _restore_ctx(tmp_path: Path, name: str, runtime_dir: Path) -> Any:
    """process_restore's context: a capsule whose runtime dir is `runtime_dir`."""
    workdir, store = tmp_path / name, tmp_path / "store"
    request = RestoreRequest(driver="n610", provider="native", artifact="tiny",
                             workdir=str(workdir), store=str(store))  # fmt: skip
    capsule = {"runtime_dir": str(runtime_dir), "engine_url": "http://127.0.0.1:30000"}
    facts: dict[str, Any] = {"image_dir": str(tmp_path / "image"), "capsule": capsule}
    return SimpleNamespace(request=request, workdir=workdir, facts=facts, record=facts.update,
                           check=lambda: None, remaining=lambda: 60.0)  # fmt: skip


def test_a_failed_restore_leaves_the_runtime_dir_of_the_replica_that_serves(
    tmp_path: Path, runtime_dir: Path, spawn: Any
) -> None:
    live = spawn({RUNTIME_ENV: str(runtime_dir)})  # the first replica, serving
    (runtime_dir / "resume-plan.json").write_text("{}")
    ctx = _restore_ctx(tmp_path, "replica-2", runtime_dir)
    driver = N610Driver(launcher=None, criu=_CollidingCriu())  # type: ignore[arg-type]
    with pytest.raises(OSError, match="in use"):
        driver.restore(ctx)
    driver.stop_engine(ctx)  # process_restore's compensation
    assert live.poll() is None
    assert (runtime_dir / "resume-plan.json").exists(), "removed a dir the restore did not make"
    (runtime_dir / "resume-plan.json").unlink()


def test_a_failed_restore_removes_the_runtime_dir_it_made(tmp_path: Path) -> None:
    runtime_dir = HOST_ROOT / "engines" / f"test-{uuid.uuid4().hex}"
    ctx = _restore_ctx(tmp_path, "replica-1", runtime_dir)
    driver = N610Driver(launcher=None, criu=_CollidingCriu())  # type: ignore[arg-type]
    with pytest.raises(OSError):
        driver.restore(ctx)
    assert ctx.facts["runtime_dir_made"] and runtime_dir.is_dir()
    assert runtime_dir.stat().st_mode & 0o777 == 0o700
    driver.stop_engine(ctx)
    assert not runtime_dir.exists()


def test_a_runtime_dir_outside_the_host_root_is_not_made(tmp_path: Path) -> None:
    """The path comes from the capsule's facts: nothing is made where coldsnap keeps nothing."""
    ctx = _restore_ctx(tmp_path, "replica-1", tmp_path / "elsewhere")
    with pytest.raises(OSError):
        N610Driver(launcher=None, criu=_CollidingCriu()).restore(ctx)  # type: ignore[arg-type]
    assert ctx.facts["runtime_dir_made"] is False and not (tmp_path / "elsewhere").exists()
