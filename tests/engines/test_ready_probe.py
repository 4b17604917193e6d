"""wait_healthy against a fake HTTP engine that serves SGLang's probe routes as 0.5.17 and 0.5.23
spell them (real sockets, real timing): without /ready the step asks /ping, which answers at
once, only once the plugin's health gate in that server has opened again; otherwise /health,
whose answer takes its one-token request and a sleep."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap._wire import STATUS_FORMAT, STATUS_KIND, status_path
from coldsnap.engines import EngineError
from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher
from coldsnap.machine import InstalledBuild
from coldsnap.machine import steps as s

HEALTH_SLEEP_S = 0.4
"""The fake /health's wait once Up (SGLang sleeps a whole second); long enough to tell apart."""


class FakeEngine:
    """SGLang's HTTP probes. release "0.5.17": no /ready, /ping 200 whatever the status;
    "0.5.23": /ready and /ping answer the status at once. /health: 503 while Starting, else
    200 after HEALTH_SLEEP_S. `ping=False` drops /ping (404), `health=False` /health."""

    def __init__(
        self, release: str, *, up: bool = True, ping: bool = True, health: bool = True
    ) -> None:
        self.release, self.up, self.ping, self.health = release, up, ping, health
        self.paths: list[str] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine.paths.append(self.path)
                self.send_response(engine.answer(self.path))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str) -> int:
        status = 200 if self.up else 503
        if path == "/ready":
            return 404 if self.release == "0.5.17" else status
        if path == "/ping":
            if not self.ping:
                return 404
            return 200 if self.release == "0.5.17" else status
        if path == "/health" and self.health:
            if self.up:
                time.sleep(HEALTH_SLEEP_S)
            return status
        return 404


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[FakeEngine] = []

    def start(release: str, **kw: Any) -> FakeEngine:
        engine = FakeEngine(release, **kw)
        threading.Thread(target=engine.server.serve_forever, args=(0.02,), daemon=True).start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.server.shutdown()
        engine.server.server_close()


def gate_record(runtime_dir: Path, *, gate: str, released: list[str], pid: int) -> None:
    """The HTTP server's status record as coldsnap.plugin._gate leaves it."""
    path = status_path(runtime_dir, "main")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "format": STATUS_FORMAT,
        "kind": STATUS_KIND,
        "process": "main",
        "pid": pid,
        "role": "main",
        "mode": "off",
        "events": [{"event": "gate_opened" if gate == "open" else "gate_closed", "time": 1.0}],
        "gate": gate,
        "released_tags": released,
    }
    path.write_text(json.dumps(record))


def ctx(engine: FakeEngine, runtime_dir: Path, pid: int | None = None) -> Any:
    facts = {
        s.ENGINE_URL.name: engine.url,
        s.ENGINE_PID.name: pid or os.getpid(),
        s.RUNTIME_DIR.name: str(runtime_dir),
    }
    request = SimpleNamespace(workdir=str(runtime_dir))  # an unkeyed engine's operation
    return SimpleNamespace(facts=facts, check=lambda: None, request=request)


def adapter() -> SGLangEngine:
    return SGLangEngine(
        SGLangLauncher((), {}),
        identity=lambda: InstalledBuild(
            engine="sglang", version="0", contract="sha256:x", plugin_digest="sha256:x"
        ),
    )


def test_without_ready_an_opened_gate_is_probed_on_ping_at_once(serve: Any, tmp_path: Path) -> None:
    engine = serve("0.5.17")
    gate_record(tmp_path, gate="open", released=[], pid=os.getpid())
    started = time.monotonic()
    made = adapter().wait_healthy(ctx(engine, tmp_path))
    assert time.monotonic() - started < HEALTH_SLEEP_S
    assert made[s.HEALTHY_AFTER_S.name] < HEALTH_SLEEP_S
    assert engine.paths == ["/ready", "/ping"]


def test_a_first_start_without_ready_waits_on_health(serve: Any, tmp_path: Path) -> None:
    """No gate record (nothing was released): only SGLang's warm-up makes the server Up, and
    /ping says nothing of that."""
    engine = serve("0.5.17")
    made = adapter().wait_healthy(ctx(engine, tmp_path))
    assert made[s.HEALTHY_AFTER_S.name] >= HEALTH_SLEEP_S
    assert engine.paths == ["/ready", "/health"]


@pytest.mark.parametrize(
    ("gate", "released", "other_pid"),
    [
        ("closed", ["weights", "kv_cache"], False),  # resumed nothing yet
        ("closed", ["kv_cache"], False),  # weights hydrated, the rest still released
        ("open", [], True),  # another process's record
    ],
)
def test_a_closed_gate_or_a_foreign_record_is_not_ready_while_ping_answers(
    serve: Any, tmp_path: Path, gate: str, released: list[str], other_pid: bool
) -> None:
    engine = serve("0.5.17", up=False)  # /ping 200, /health 503: the gate holds Starting
    pid = os.getpid() + 1 if other_pid else os.getpid()
    gate_record(tmp_path, gate=gate, released=released, pid=pid)
    made: list[dict[str, Any]] = []
    step = threading.Thread(
        target=lambda: made.append(adapter().wait_healthy(ctx(engine, tmp_path)))
    )
    step.start()
    time.sleep(0.2)
    assert step.is_alive(), "ready while the gate was closed"
    assert "/ping" not in engine.paths and engine.paths.count("/health") > 1
    gate_record(tmp_path, gate="open", released=[], pid=os.getpid())  # every rank resumed
    engine.up = True
    step.join(5)
    assert not step.is_alive() and made, "not ready once the gate opened"
    assert engine.paths[-1] in ("/ping", "/health")


def test_an_engine_without_ping_falls_back_to_health(serve: Any, tmp_path: Path) -> None:
    engine = serve("0.5.17", ping=False)
    gate_record(tmp_path, gate="open", released=[], pid=os.getpid())
    adapter().wait_healthy(ctx(engine, tmp_path))
    assert engine.paths == ["/ready", "/ping", "/health"]


def test_an_engine_with_ready_is_asked_only_ready(serve: Any, tmp_path: Path) -> None:
    engine = serve("0.5.23")
    gate_record(tmp_path, gate="open", released=[], pid=os.getpid())
    made = adapter().wait_healthy(ctx(engine, tmp_path))
    assert made[s.HEALTHY_AFTER_S.name] < HEALTH_SLEEP_S
    assert engine.paths == ["/ready"]


def test_an_unreadable_gate_record_is_no_evidence(serve: Any, tmp_path: Path) -> None:
    engine = serve("0.5.17")
    path = status_path(tmp_path, "main")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    adapter().wait_healthy(ctx(engine, tmp_path))
    assert engine.paths == ["/ready", "/health"]


def test_the_probe_still_fails_at_once_when_the_engine_ends(serve: Any, tmp_path: Path) -> None:
    engine = serve("0.5.17")
    gate_record(tmp_path, gate="open", released=[], pid=os.getpid())
    ended = subprocess.Popen(["true"])
    ended.wait()  # reaped: the pid names no process
    with pytest.raises(EngineError, match="ended before it was ready"):
        adapter().wait_healthy(ctx(engine, tmp_path, pid=ended.pid))
    assert engine.paths == []


def test_an_engine_without_any_probe_fails_at_once(serve: Any, tmp_path: Path) -> None:
    engine = serve("0.5.17", ping=False, health=False)
    with pytest.raises(EngineError, match="neither /ready nor /health"):
        adapter().wait_healthy(ctx(engine, tmp_path))
    assert engine.paths == ["/ready", "/health"]
