"""`coldsnap sleep` and `wake` against a stand-in engine: a real process tree that carries a
runtime dir in its environment (what makes it the restore's engine) and an HTTP endpoint that
plays SGLang's release, resume and health (503 while released). Sleep releases the KV cache and
weights and records it; status says asleep; wake writes the restore's resume plan (its weight
source and seed) and resumes weights before the KV cache; both are idempotent; refusals name
what is wrong. The real engine: tests/e2e/test_cli_e2e.py."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coldsnap._wire import PLAN_FILE

from .test_serving import Engine, _restored, cli, engine, env  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("env")


class _Fake(http.server.BaseHTTPRequestHandler):
    calls: list[tuple[str, object]] = []
    released = False

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._answer(503 if _Fake.released else 200)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"{}")
        _Fake.calls.append((self.path, body.get("tags")))
        if self.path == "/release_memory_occupation":
            _Fake.released = True
        elif self.path == "/resume_memory_occupation" and "kv_cache" in body.get("tags", []):
            _Fake.released = False
        self._answer(200)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[str]:
    _Fake.calls, _Fake.released = [], False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _served(tmp_path: Path, engine: Engine, url: str, **facts: object) -> Path:  # noqa: F811
    workdir = _restored(tmp_path, engine)
    receipt = json.loads((workdir / "receipt.json").read_text())
    (tmp_path / "payload").mkdir()
    receipt.update(operation="restore")
    receipt["facts"].update(
        engine_url=url,
        weight_source={"provider": "native", "payload_dir": str(tmp_path / "payload"),
                       "preverified": True},
        resume_seed=1234, **facts,
    )  # fmt: skip
    (workdir / "receipt.json").write_text(json.dumps(receipt))
    return workdir


def test_sleep_then_wake(tmp_path: Path, engine: Engine, fake: str) -> None:  # noqa: F811
    _served(tmp_path, engine, fake)
    slept = cli("sleep", "--json", "tiny")
    assert slept.exit_code == 0, slept.output
    done = json.loads(slept.stdout)
    assert not done["already"] and done["healthy_while_asleep"] is False
    assert done["device_freed"] is None and done["host_bytes"] == 0  # no plugin records here
    assert done["rss_before"] > 0 and done["exported"] is False
    assert _Fake.calls == [("/flush_cache", None),
                           ("/release_memory_occupation", ["kv_cache", "weights"])]  # fmt: skip
    assert "asleep (coldsnap wake)" in cli("status", "tiny").stdout
    assert json.loads(cli("status", "--json", "tiny").stdout)["sleep"] == "asleep"
    assert "already asleep" in cli("sleep", "tiny").stdout
    assert len(_Fake.calls) == 2, "a second sleep released again"

    woke = cli("wake", "tiny")
    assert woke.exit_code == 0, woke.output
    assert woke.stdout.startswith("tiny awake in ")
    assert _Fake.calls[2:] == [("/resume_memory_occupation", ["weights"]),
                               ("/resume_memory_occupation", ["kv_cache"])]  # fmt: skip
    plan = json.loads((engine.runtime_dir / PLAN_FILE).read_text())
    assert plan["provider"] == "native" and plan["seed"] == 1234
    assert plan["payload_dir"] == str(tmp_path / "payload")
    assert json.loads(cli("status", "--json", "tiny").stdout)["sleep"] == "awake"
    assert cli("wake", "tiny").stdout.strip() == "tiny was awake"
    assert len(_Fake.calls) == 4


def test_wake_refuses_when_the_payload_is_gone(
    tmp_path: Path,
    engine: Engine,  # noqa: F811
    fake: str,
) -> None:
    _served(tmp_path, engine, fake)
    assert cli("sleep", "tiny").exit_code == 0
    (tmp_path / "payload").rmdir()
    result = cli("wake", "tiny")
    assert result.exit_code == 1 and "is gone: it cannot be refilled" in result.stderr
    assert json.loads(cli("status", "--json", "tiny").stdout)["sleep"] == "asleep"


def test_sleep_refuses_an_engine_that_is_not_running(
    tmp_path: Path,
    engine: Engine,  # noqa: F811
    fake: str,
) -> None:
    workdir = _served(tmp_path, engine, fake)
    engine.proc.kill()
    engine.proc.wait(10)
    result = cli("sleep", str(workdir))
    assert result.exit_code == 1 and "is not running" in result.stderr
    assert _Fake.calls == []


def test_sleep_refuses_a_workdir_without_a_finished_restore(tmp_path: Path) -> None:
    (tmp_path / "op").mkdir()
    result = cli("sleep", str(tmp_path / "op"))
    assert result.exit_code == 1 and "no finished restore here" in result.stderr
