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
import threading
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


# -- names: taken atomically, kept by a restore that `coldsnap resume` finishes ------------------


class _Restores:
    """The Machine of `coldsnap restore` and `coldsnap resume`, played on the stand-in engine:
    a restore journals its begin, then (as `hold` says) waits half-way until released, dies
    half-way (its orchestrator killed), or ends as `outcome` with its receipt. Stops go to the
    real Machine of the `machines` fixture."""

    def __init__(self, engine: Engine, real: Any, *, hold: bool = False, die: bool = False,
                 outcome: str = "done") -> None:  # fmt: skip
        self.engine, self.real = engine, real
        self.hold, self.die, self.outcome = hold, die, outcome
        self.entered, self.release = threading.Event(), threading.Event()
        self.began: list[str] = []

    def for_request(self, request: Any, **options: Any) -> Any:
        return self if isinstance(request, RestoreRequest) else self.real(request, **options)

    def restore(self, request: RestoreRequest, cancel: Any = None) -> Receipt:
        self.began.append(request.workdir)
        journal = Journal.create(Path(request.workdir))
        journal.append("begin", spec="restore-n610", request=unstructure(request))
        if self.hold and len(self.began) == 1:
            self.entered.set()
            assert self.release.wait(60), "the test never released the first restore"
        if self.die:
            raise KeyboardInterrupt  # the orchestrator ends mid-step: no end, no receipt
        return self._end(Path(request.workdir), journal)

    def resume(self, workdir: Path, cancel: Any = None) -> Receipt:
        return self._end(workdir, Journal.reopen(workdir)[0])

    def _end(self, workdir: Path, journal: Journal) -> Receipt:
        journal.append("end", outcome=self.outcome)
        engine, facts = self.engine, {}
        if self.outcome == "done":
            facts = {"engine_pid": engine.proc.pid, "engine_url": engine.url,
                     "runtime_dir": str(engine.runtime_dir)}  # fmt: skip
        receipt = Receipt(operation="restore", spec="restore-n610", outcome=self.outcome,
                          steps=(), facts=facts, workdir=str(workdir))  # fmt: skip
        receipt.write(workdir)
        return receipt


@pytest.fixture
def restores(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(**kw: Any) -> _Restores:
        fake = _Restores(engine, Machine.for_request, **kw)
        monkeypatch.setattr(Machine, "for_request", staticmethod(fake.for_request))
        return fake

    return make


def _request_file(tmp_path: Path, name: str) -> Path:
    workdir, store = tmp_path / name, tmp_path / "store"
    request = RestoreRequest(driver="n610", provider="native", artifact="tiny",
                             workdir=str(workdir), store=str(store))  # fmt: skip
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(unstructure(request)))
    return path


def test_two_restores_under_one_name_at_once_one_is_refused(tmp_path: Path, env, restores) -> None:
    fake = restores(hold=True)
    first: dict[str, Any] = {}

    def run_first() -> None:
        try:
            main.main(["restore", str(_request_file(tmp_path, "op-a")), "--serve-as", "web",
                       "--json"], standalone_mode=False)  # fmt: skip
        except SystemExit as exc:
            first["code"] = exc.code
        else:
            first["code"] = 0

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert fake.entered.wait(60), "the first restore did not start"
        second = cli("restore", str(_request_file(tmp_path, "op-b")), "--serve-as", "web")
    finally:
        fake.release.set()
        thread.join(60)
    assert second.exit_code == 2, second.output
    assert "field '--serve-as'" in second.stderr and "being taken" in second.stderr
    assert fake.began == [str(tmp_path / "op-a")], "the second restore ran"
    assert first["code"] == 0
    assert json.loads((tmp_path / "serving" / "web.json").read_text())["workdir"] == str(
        tmp_path / "op-a"
    )
    later = cli("restore", str(_request_file(tmp_path, "op-c")), "--serve-as", "web")
    assert later.exit_code == 2 and "already serves" in later.stderr, later.output
    assert fake.began == [str(tmp_path / "op-a")]


def test_a_restore_that_rolled_back_gives_its_name_back(tmp_path: Path, env, restores) -> None:
    restores(outcome="rolled_back")
    result = cli("restore", str(_request_file(tmp_path, "op-a")), "--serve-as", "web")
    assert result.exit_code == 3, result.output
    assert not (tmp_path / "serving" / "web.json").exists()
    assert "nothing serving" in cli("status").stdout


def test_a_restore_finished_by_resume_serves_under_its_name(
    tmp_path: Path, env, engine: Engine, restores
) -> None:
    fake = restores(die=True)
    died = cli("restore", str(_request_file(tmp_path, "op-a")), "--serve-as", "web")
    assert died.exit_code != 0 and not (tmp_path / "op-a" / "receipt.json").exists()
    taken = cli("restore", str(_request_file(tmp_path, "op-b")), "--serve-as", "web")
    assert taken.exit_code == 2 and "did not end" in taken.stderr, taken.output
    fake.die = False
    resumed = cli("resume", str(tmp_path / "op-a"))
    assert resumed.exit_code == 0, resumed.output
    state = json.loads(cli("status", "--json", "web").stdout)
    assert state["running"] and state["workdir"] == str(tmp_path / "op-a")
    assert cli("status").stdout.startswith("web  running")
    stopped = cli("stop", "web")
    assert stopped.exit_code == 0, stopped.output
    assert engine.proc.wait(10) is not None
    assert "nothing serving" in cli("status").stdout


def test_a_restore_into_a_workdir_of_another_operation_takes_no_name(
    tmp_path: Path, env, engine: Engine
) -> None:
    """The Machine refuses a workdir that journals an earlier operation; the name is not left
    pointing at that operation's engine."""
    _restored(tmp_path, engine)  # a restore done in tmp_path/op, serving as tiny
    refused = cli("restore", str(_request_file(tmp_path, "op")), "--serve-as", "web")
    assert refused.exit_code != 0, refused.output
    assert not (tmp_path / "serving" / "web.json").exists()
    assert [line.split()[0] for line in cli("status").stdout.splitlines()] == ["tiny"]
