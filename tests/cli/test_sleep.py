"""`coldsnap sleep` and `wake` against a stand-in engine: a real process tree that carries a
runtime dir in its environment (what makes it the restore's engine) and an HTTP endpoint that
plays SGLang's release, resume and health (503 while released). Both run through the Machine
(the SGLang adapter's sleep and wake specs, journaled under the restore's workdir): sleep
releases the KV cache and weights; status says asleep; wake stages the payload again, writes a
resume plan from it and resumes weights before the KV cache; a second sleep or wake has nothing
to do; a wake whose payload is gone rolls back and leaves the engine asleep. The real engine,
killed and resumed: tests/e2e/test_fault_campaign.py and test_cli_e2e.py."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coldsnap._wire import PLAN_FILE

from .test_serving import Engine, _restored, cli, engine, env, machines  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("env")


class _Fake(http.server.BaseHTTPRequestHandler):
    calls: list[tuple[str, object]] = []
    released = False
    fail = False

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._answer(503 if _Fake.released else 200)

    def do_POST(self) -> None:
        if _Fake.fail:
            self._answer(502)
            return
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
    _Fake.calls, _Fake.released, _Fake.fail = [], False, False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _served(tmp_path: Path, engine: Engine, url: str) -> Path:  # noqa: F811
    (tmp_path / "payload").mkdir()
    return _restored(
        tmp_path, engine, engine_url=url, payload_dir=str(tmp_path / "payload"),
        weight_source={"source": "payload", "payload_dir": str(tmp_path / "payload"),
                       "preverified": True},
    )  # fmt: skip


def test_sleep_then_wake(tmp_path: Path, engine: Engine, fake: str) -> None:  # noqa: F811
    workdir = _served(tmp_path, engine, fake)
    slept = cli("sleep", "tiny")
    assert slept.exit_code == 0, slept.output
    assert "tiny asleep: released 0.0 MiB of host weight pages" in slept.stdout
    assert _Fake.calls == [("/flush_cache", None),
                           ("/release_memory_occupation", ["kv_cache", "weights"])]  # fmt: skip
    receipt = json.loads((workdir / "ops" / "sleep-1" / "receipt.json").read_text())
    assert receipt["outcome"] == "done" and receipt["spec"] == "sleep-sglang"
    record = receipt["facts"]["sleep_record"]
    assert record["healthy_while_asleep"] is False and record["device_freed"] is None
    assert "asleep (coldsnap wake)" in cli("status", "tiny").stdout
    assert json.loads(cli("status", "--json", "tiny").stdout)["sleep"] == "asleep"
    assert "already asleep" in cli("sleep", "tiny").stdout
    assert len(_Fake.calls) == 2, "a second sleep released again"

    woke = cli("wake", "tiny")
    assert woke.exit_code == 0, woke.output
    assert "tiny awake in " in woke.stdout
    assert _Fake.calls[2:] == [("/resume_memory_occupation", ["weights"]),
                               ("/resume_memory_occupation", ["kv_cache"])]  # fmt: skip
    plan = json.loads((engine.runtime_dir / PLAN_FILE).read_text())
    assert plan["source"] == "payload" and plan["payload_dir"] == str(tmp_path / "payload")
    assert not plan["preverified"], "the restore's verification was carried into the wake"
    assert json.loads(cli("status", "--json", "tiny").stdout)["sleep"] == "awake"
    assert cli("wake", "tiny").stdout.strip() == "tiny was awake"
    assert len(_Fake.calls) == 4


def test_a_wake_whose_payload_is_gone_rolls_back_and_leaves_it_asleep(
    tmp_path: Path,
    engine: Engine,  # noqa: F811
    fake: str,
) -> None:
    _served(tmp_path, engine, fake)
    assert cli("sleep", "tiny").exit_code == 0
    (tmp_path / "payload").rmdir()
    result = cli("wake", "tiny")
    assert result.exit_code == 3 and "is gone" in result.stderr, result.output
    assert json.loads(cli("status", "--json", "tiny").stdout)["sleep"] == "asleep"
    assert _Fake.calls[2:] == [], "the wake resumed without its payload"


def test_sleep_of_an_engine_that_is_not_running_rolls_back(
    tmp_path: Path,
    engine: Engine,  # noqa: F811
    fake: str,
) -> None:
    workdir = _served(tmp_path, engine, fake)
    engine.proc.kill()
    engine.proc.wait(10)
    _Fake.fail = True  # its port no longer answers
    result = cli("sleep", str(workdir))
    assert result.exit_code == 3, result.output
    assert json.loads(cli("status", "--json", str(workdir)).stdout)["sleep"] == "awake"


def test_sleep_refuses_a_workdir_without_a_finished_restore(tmp_path: Path) -> None:
    (tmp_path / "op").mkdir()
    result = cli("sleep", str(tmp_path / "op"))
    assert result.exit_code == 2 and "no capture or restore journaled there" in result.stderr
