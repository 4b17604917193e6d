"""`coldsnap status` and `stop` of an engine an n580 template became, with real processes (no
CRIU): the template is launched by the real driver with its launcher's runtime dir in its
environment, and released into the engine's module (here `http.server`, which serves and ends on
SIGTERM). Its processes keep the environment the template started with whatever the release
adds, so the engine must run with that runtime dir: status finds it running, and stop ends it,
removes its runtime and control dirs and its serving record. A restored template goes through
the same release (tests/e2e/test_n580_manage_e2e.py runs it on a real SGLang restore)."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from click.testing import CliRunner, Result

from coldsnap.backends.procs import kill_tree
from coldsnap.cli import _sleep as cli_sleep
from coldsnap.cli import main
from coldsnap.cli._serving import Serving, record
from coldsnap.drivers._processes import HOST_ROOT, RUNTIME_ENV
from coldsnap.drivers.n580 import N580Driver
from coldsnap.machine import Journal, LaunchCommand, Machine, Receipt, RestoreRequest
from coldsnap.machine._convert import unstructure
from tests._support import free_port


class _Launcher:
    """The Launcher protocol as the real one keeps it: a fresh runtime dir (made under the
    host's root) unless the driver names one, in the command's environment."""

    template_preload: tuple[str, ...] = ()
    forkserver_preload: tuple[str, ...] | None = None

    def __init__(self) -> None:
        self.port = free_port()
        self.made: list[Path] = []

    def command(
        self, request: Any, workdir: Path, *, weights: Any, runtime_dir: Path | None = None
    ) -> LaunchCommand:
        if runtime_dir is None:
            runtime_dir = HOST_ROOT / "engines" / f"test-{uuid.uuid4().hex}"
            runtime_dir.mkdir(parents=True, mode=0o700)
            self.made.append(runtime_dir)
        argv = (sys.executable, "-P", "-m", "http.server", "--bind", "127.0.0.1", str(self.port))
        return LaunchCommand(argv=argv, env={RUNTIME_ENV: str(runtime_dir)},
                             url=f"http://127.0.0.1:{self.port}")  # fmt: skip


def _ctx(workdir: Path, facts: dict[str, Any]) -> Any:
    """What the driver's launch and release steps read of their context."""
    workdir.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(
        request=SimpleNamespace(operation="capture", engine_args=()),
        workdir=workdir,
        facts=facts,
        record=facts.update,
        check=lambda: None,
        remaining=lambda: 60.0,
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[N580Driver, _Launcher, dict[str, Any]]]:
    """An engine an n580 template became, serving on the launcher's port, and its facts."""
    launcher = _Launcher()
    driver = N580Driver(launcher=launcher, preload=())
    facts: dict[str, Any] = {"weight_source": {"source": "payload"}}
    ctx = _ctx(tmp_path / "op", facts)
    try:
        driver.launch_template(ctx)
        driver.release_template(ctx)
        deadline = time.monotonic() + 30
        while not _listening(launcher.port):
            assert time.monotonic() < deadline, "the released engine never listened"
            time.sleep(0.05)
        yield driver, launcher, facts
    finally:
        with contextlib.suppress(psutil.Error):
            kill_tree(facts["template_pid"])
        for path in [*launcher.made, Path(facts.get("control_dir") or "/nonexistent")]:
            shutil.rmtree(path, ignore_errors=True)


def _restored(tmp_path: Path, facts: dict[str, Any]) -> Path:
    """A finished n580 restore's workdir with the engine's facts, recorded as serving `t580`."""
    workdir = tmp_path / "op"
    request = RestoreRequest(driver="n580", provider="native", artifact="t580",
                             workdir=str(workdir), store=str(tmp_path / "store"))  # fmt: skip
    journal = Journal.create(workdir)
    journal.append("begin", spec="restore-n580", request=unstructure(request))
    journal.append("end", outcome="done")
    Receipt(operation="restore", spec="restore-n580", outcome="done", steps=(), facts=facts,
            workdir=str(workdir)).write(workdir)  # fmt: skip
    record(Serving(name="t580", workdir=str(workdir), artifact="t580", capsule_digest=None,
                   url=facts["engine_url"], pid=facts["engine_pid"],
                   started=time.time()))  # fmt: skip
    return workdir


class _Store:
    name = "store"
    capabilities: frozenset[str] = frozenset()

    def discard_layout(self, ctx: Any) -> None:
        pass  # nothing was laid out: no capsule was admitted


@pytest.fixture
def serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    return tmp_path / "serving"


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _machine_with(driver: N580Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    from coldsnap.engines.sglang import SGLangEngine

    def for_request(request: Any, **options: Any) -> Machine:
        provider = SimpleNamespace(name="native", capabilities=frozenset())
        return Machine(driver=driver, provider=provider, engine=SGLangEngine(None),  # type: ignore[arg-type]
                       artifacts=_Store(), **options)  # type: ignore[arg-type]  # fmt: skip

    monkeypatch.setattr(Machine, "for_request", staticmethod(for_request))


def test_the_engine_keeps_the_runtime_dir_its_template_carries(engine) -> None:
    _, _, facts = engine
    carried = psutil.Process(facts["template_pid"]).environ()[RUNTIME_ENV]
    assert facts["runtime_dir"] == carried, "the engine was given a runtime dir none of it carries"
    assert facts["engine_pid"] == facts["template_pid"]


def test_status_and_stop_by_name(tmp_path: Path, serving: Path, engine, monkeypatch) -> None:
    driver, launcher, facts = engine
    _restored(tmp_path, facts)
    state = _cli("status", "--json", "t580")
    assert state.exit_code == 0, state.output
    shown = json.loads(state.stdout)
    assert shown["running"] and shown["listening"], shown
    assert shown["pid"] == facts["engine_pid"] and shown["url"] == facts["engine_url"]

    _machine_with(driver, monkeypatch)
    stopped = _cli("stop", "t580")
    assert stopped.exit_code == 0, stopped.output
    assert f"stopped t580 (pid {facts['engine_pid']})" in stopped.stdout
    assert (
        not psutil.pid_exists(facts["engine_pid"])
        or psutil.Process(facts["engine_pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert not _listening(launcher.port), "the port is still held after the stop"
    assert not Path(facts["runtime_dir"]).exists() and not Path(facts["control_dir"]).exists()
    assert not (serving / "t580.json").exists()
    assert "nothing serving" in _cli("status").stdout


def test_a_stop_that_leaves_the_engine_running_keeps_its_record(
    tmp_path: Path, serving: Path, engine, monkeypatch
) -> None:
    """A stop whose receipt says done while the engine still runs (a step that did nothing)
    is an error, exit 1, and the name still says what serves."""
    _, launcher, facts = engine
    workdir = _restored(tmp_path, facts)

    def did_nothing(operation: str, target: Path, subscribers: Any = ()) -> Receipt:
        return Receipt(operation=operation, spec=f"{operation}-n580", outcome="done", steps=(),
                       facts={}, workdir=str(target / "ops" / f"{operation}-1"))  # fmt: skip

    monkeypatch.setattr(cli_sleep, "run", did_nothing)
    result = _cli("stop", "t580")
    assert result.exit_code == 1, result.output
    assert "still runs; its serving record is kept" in result.stderr
    assert (serving / "t580.json").exists() and _listening(launcher.port)
    assert json.loads(_cli("status", "--json", str(workdir)).stdout)["running"]
