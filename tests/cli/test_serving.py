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

import psutil
import pytest
from click.testing import CliRunner, Result

from coldsnap.cli import main
from coldsnap.cli._serving import RUNTIME_ROOT, Serving, record
from coldsnap.machine import Journal

SERVER = Path(__file__).parents[1] / "backends" / "targets" / "http_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    return {"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")}


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


class Engine:
    def __init__(self, runtime_dir: Path) -> None:
        self.port = _free_port()
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


def _restored(tmp_path: Path, engine: Engine, *, runtime_dir: str | None = None) -> Path:
    """A restore's workdir as the Machine leaves it: a journal that ended done, a receipt."""
    workdir = tmp_path / "op"
    journal = Journal.create(workdir)
    journal.append("begin", spec="restore-n610", request={"kind": "coldsnap.restore-request",
                                                         "artifact": "tiny"})  # fmt: skip
    journal.append("end", outcome="done")
    facts = {"engine_pid": engine.proc.pid, "engine_url": engine.url,
             "runtime_dir": runtime_dir or str(engine.runtime_dir)}  # fmt: skip
    (workdir / "receipt.json").write_text(json.dumps({"facts": facts, "outcome": "done"}))
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
    assert result.stdout.strip() == f"stopped tiny (pid {engine.proc.pid}, {engine.url})"
    assert engine.proc.poll() is not None
    assert not engine.child.is_running() or engine.child.status() == psutil.STATUS_ZOMBIE
    assert not engine.runtime_dir.exists() and not (workdir / "image").exists()
    assert (workdir / "receipt.json").exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", engine.port)) != 0
    assert "nothing serving" in cli("status").stdout
    after = json.loads(cli("status", "--json", str(workdir)).stdout)
    assert not after["running"] and after["stopped"]
    again = cli("stop", str(workdir))
    assert again.exit_code == 0 and "was not running" in again.stdout


def test_a_pid_another_process_holds_now_is_not_signalled(tmp_path: Path, env, engine) -> None:
    _restored(tmp_path, engine, runtime_dir="/run/coldsnap/engines/another")
    assert not json.loads(cli("status", "--json", "tiny").stdout)["running"]
    result = cli("stop", "tiny")
    assert result.exit_code == 0 and "was not running" in result.stdout
    assert engine.proc.poll() is None, "stop signalled a process that is not the engine"


def test_an_unknown_target_is_a_bad_request(tmp_path: Path, env) -> None:
    result = cli("stop", "nothing")
    assert result.exit_code == 2 and "neither a name serving here" in result.stderr


def test_a_workdir_without_a_receipt_has_nothing_to_stop(tmp_path: Path, env) -> None:
    (tmp_path / "op").mkdir()
    result = cli("stop", str(tmp_path / "op"))
    assert result.exit_code != 0 and "no receipt" in result.stderr
