"""`coldsnap status` and `stop` on an engine a restore left serving, played by a real process
tree that listens on a port and carries a runtime dir in its environment (as a restored engine
does): status from the journal and receipt, stop by name or workdir, and a PID that another
process took since is never signalled."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner, Result

from coldsnap.cli import main
from coldsnap.cli._serving import Serving, record
from coldsnap.engines.sglang import RUNTIME_ROOT
from coldsnap.machine import Journal, Machine, Receipt, RestoreRequest
from coldsnap.machine._convert import unstructure
from coldsnap.providers import ProviderError
from tests._support import free_port

SERVER = Path(__file__).parents[1] / "backends" / "targets" / "http_server.py"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    return {"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")}


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


class Engine:
    def __init__(self, runtime_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runtime_dir = runtime_dir
        runtime_dir.mkdir(parents=True)
        self.proc = subprocess.Popen(  # a tree: a child that sleeps, the root that serves
            ["bash", "-c", f"sleep 600 & exec {sys.executable} {SERVER} {self.port}"],
            env={**os.environ, "COLDSNAP_RUNTIME_DIR": str(runtime_dir)},
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == b"ready"
        self.child = psutil.Process(self.proc.pid).children()[0]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    started = Engine(RUNTIME_ROOT / f"test-{uuid.uuid4().hex}")
    yield started
    if started.proc.poll() is None:
        started.proc.kill()
    started.proc.wait(10)
    with contextlib.suppress(psutil.Error):
        started.child.kill()
    shutil.rmtree(started.runtime_dir, ignore_errors=True)


class _Store:
    """The store's role in a stop: it removes what admit laid out (the real store's step)."""

    name = "store"
    capabilities: frozenset[str] = frozenset()

    def discard_layout(self, ctx: Any) -> None:
        from coldsnap.capsules import StoreArtifacts

        StoreArtifacts.discard_layout(self, ctx)  # type: ignore[arg-type]


class _Provider:
    """A payload provider whose stage accepts the payload dir as it is (the real one verifies
    packs: tests/providers)."""

    name = "native"
    capabilities = frozenset({"payload"})

    def stage(self, ctx: Any) -> dict[str, Any]:
        payload = Path(ctx.facts["payload_dir"])
        if not payload.is_dir():
            raise ProviderError(f"payload {payload} is gone")
        return {"weight_source": {"source": "payload", "payload_dir": str(payload),
                                  "preverified": True},  # as the real one's stage says
                "verify_seconds": 0.0}  # fmt: skip

    def export(self, ctx: Any) -> None:
        raise AssertionError("not part of a lifecycle operation")

    discard_export = export


@pytest.fixture(autouse=True)
def machines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's Machine with the real n610 driver and SGLang adapter (talking to the stand-in
    engine) and light provider and store stand-ins."""
    from coldsnap.drivers.n610 import N610Driver
    from coldsnap.engines.sglang import SGLangEngine

    def for_request(request: Any, **options: Any) -> Machine:
        return Machine(driver=N610Driver(launcher=None), provider=_Provider(),  # type: ignore[arg-type]
                       engine=SGLangEngine(None), artifacts=_Store(), **options)  # type: ignore[arg-type]  # fmt: skip

    monkeypatch.setattr(Machine, "for_request", staticmethod(for_request))


def _restored(
    tmp_path: Path, engine: Engine, *, runtime_dir: str | None = None, **facts: Any
) -> Path:
    """A restore's workdir as the Machine leaves it: a journal that ended done, a receipt."""
    workdir = tmp_path / "op"
    (tmp_path / "model").mkdir(exist_ok=True)
    request = RestoreRequest(driver="n610", provider="native", artifact="tiny",
                             workdir=str(workdir), store=str(tmp_path / "store"))  # fmt: skip
    journal = Journal.create(workdir)
    journal.append("begin", spec="restore-n610", request=unstructure(request))
    journal.append("end", outcome="done")
    facts = {"engine_pid": engine.proc.pid, "engine_url": engine.url,
             "runtime_dir": runtime_dir or str(engine.runtime_dir), **facts}  # fmt: skip
    Receipt(operation="restore", spec="restore-n610", outcome="done", steps=(), facts=facts,
            workdir=str(workdir)).write(workdir)  # fmt: skip
    record(Serving(name="tiny", workdir=str(workdir), artifact="tiny", capsule_digest=None,
                   url=engine.url, pid=engine.proc.pid, started=time.time()))  # fmt: skip
    return workdir


def test_status_says_what_serves(tmp_path: Path, env, engine: Engine) -> None:
    workdir = _restored(tmp_path, engine)
    result = cli("status", "--json", "tiny")
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    assert state["running"] and state["listening"] and state["url"] == engine.url
    assert (state["pid"], state["operation"], state["state"]) == (
        engine.proc.pid,
        "restore",
        "done",
    )
    listed = cli("status")
    assert listed.stdout.startswith(f"tiny  running  url {engine.url}  pid {engine.proc.pid}")
    assert json.loads(cli("status", "--json", str(workdir)).stdout)["running"]


def test_stop_by_name_ends_the_tree_and_its_runtime_dir(tmp_path: Path, env, engine) -> None:
    workdir = _restored(tmp_path, engine)
    (workdir / "image").mkdir()
    (workdir / "image" / "pages-1.img").write_bytes(b"pages")
    result = cli("stop", "tiny")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(f"stopped tiny (pid {engine.proc.pid})")
    assert engine.proc.poll() is not None
    assert not engine.child.is_running() or engine.child.status() == psutil.STATUS_ZOMBIE
    assert not engine.runtime_dir.exists() and not (workdir / "image").exists()
    assert (workdir / "receipt.json").exists()
    stop = json.loads((workdir / "ops" / "stop-1" / "receipt.json").read_text())
    assert stop["outcome"] == "done" and stop["spec"] == "stop-n610"
    assert [s["name"] for s in stop["steps"]] == ["stop_engine", "discard_layout"]
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", engine.port)) != 0
    assert "nothing serving" in cli("status").stdout
    after = json.loads(cli("status", "--json", str(workdir)).stdout)
    assert not after["running"] and after["stopped"]
    again = cli("stop", str(workdir))
    assert again.exit_code == 0 and "was stopped" in again.stdout
    assert not (workdir / "ops" / "stop-2").exists(), "a second stop ran again"


def test_a_pid_another_process_holds_now_is_not_signalled(tmp_path: Path, env, engine) -> None:
    _restored(tmp_path, engine, runtime_dir="/run/coldsnap/engines/another")
    assert not json.loads(cli("status", "--json", "tiny").stdout)["running"]
    result = cli("stop", "tiny")
    assert result.exit_code == 0, result.output
    assert engine.proc.poll() is None, "stop signalled a process that is not the engine"


def test_an_unknown_target_is_a_bad_request(tmp_path: Path, env) -> None:
    result = cli("stop", "nothing")
    assert result.exit_code == 2 and "neither a name serving here" in result.stderr


def test_a_workdir_without_a_finished_operation_has_nothing_to_stop(tmp_path: Path, env) -> None:
    (tmp_path / "op").mkdir()
    result = cli("stop", str(tmp_path / "op"))
    assert result.exit_code == 2 and "no capture or restore journaled there" in result.stderr


def test_a_stop_whose_orchestrator_died_is_finished_by_resume(
    tmp_path: Path, env, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coldsnap.drivers.n610 import N610Driver

    workdir = _restored(tmp_path, engine)
    real = N610Driver.stop_engine

    def dies(self: N610Driver, ctx: Any) -> None:
        raise KeyboardInterrupt  # the orchestrator ends mid-step: no step_end, no receipt

    monkeypatch.setattr(N610Driver, "stop_engine", dies)
    with pytest.raises(KeyboardInterrupt):
        from coldsnap.cli._serving import stop

        stop(workdir)
    state = json.loads(cli("status", "--json", "tiny").stdout)
    assert state["running"] and state["pending"] == str(workdir / "ops" / "stop-1")
    refused = cli("stop", "tiny")
    assert refused.exit_code == 2 and "coldsnap resume" in refused.stderr
    monkeypatch.setattr(N610Driver, "stop_engine", real)
    resumed = cli("resume", str(workdir / "ops" / "stop-1"))
    assert resumed.exit_code == 0, resumed.output
    assert engine.proc.wait(10) is not None and not engine.runtime_dir.exists()
    assert "nothing serving" in cli("status").stdout
