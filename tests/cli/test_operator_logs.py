"""`coldsnap logs NAME`: the last lines of the engine log the receipt names, and with --follow
what the engine writes next, until it stops."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.cli import _logs, _serving, main
from coldsnap.machine._receipt import RECEIPT_NAME


@pytest.fixture(autouse=True)
def serving_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    monkeypatch.setattr(_logs, "POLL_SECONDS", 0.02)
    return tmp_path / "serving"


def _served(tmp_path: Path, name: str, pid: int | None, log: Path) -> Path:
    workdir = tmp_path / f"ops-{name}"
    workdir.mkdir()
    facts = {"engine_pid": pid, "engine_url": None, "engine_log": str(log)}
    (workdir / RECEIPT_NAME).write_text(json.dumps({"outcome": "done", "facts": facts}))
    served = _serving.Serving(name=name, workdir=str(workdir), artifact=name,
                              capsule_digest=None, url=None, pid=pid, started=0.0)  # fmt: skip
    _serving.record(served)
    return workdir


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_the_last_lines_of_the_engine_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {n}\n" for n in range(200_000)))  # several chunks
    _served(tmp_path, "tiny", None, log)
    result = cli("logs", "tiny", "-n", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout == "line 199997\nline 199998\nline 199999\n"
    assert cli("logs", "tiny").stdout.count("\n") == 50  # the default
    assert cli("logs", "tiny", "-n", "0").stdout == ""


def test_follow_prints_what_the_engine_writes_until_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, go = tmp_path / "engine.log", tmp_path / "go"
    log.write_text("before\n")
    code = (
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.01)\n"
        "for n in range(5):\n"
        "    print(n, flush=True)\n"
        "    time.sleep(0.05)\n"
    )
    with log.open("ab") as out:
        engine = subprocess.Popen([sys.executable, "-c", code, str(go)], stdout=out)
    reaper = threading.Thread(target=engine.wait)  # so that it is gone, not a zombie, once done
    reaper.start()
    _served(tmp_path, "tiny", engine.pid, log)
    following = _logs.follow

    def follow_then_go(*args: object) -> None:  # the engine writes only once logs follows
        go.touch()
        following(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_logs, "follow", follow_then_go)
    result = cli("logs", "tiny", "--follow", "-n", "1")
    reaper.join()
    assert result.exit_code == 0, result.output
    assert result.stdout == "before\n0\n1\n2\n3\n4\n"


def test_a_name_that_serves_nothing_is_a_bad_request(tmp_path: Path) -> None:
    result = cli("logs", "nothing")
    assert result.exit_code == 2 and "'nothing' is neither a name serving here" in result.output


def test_an_operation_that_has_not_ended_has_no_log_yet(tmp_path: Path) -> None:
    workdir = tmp_path / "running"
    workdir.mkdir()
    result = cli("logs", str(workdir))
    assert result.exit_code == 2 and "has no receipt yet" in result.output
