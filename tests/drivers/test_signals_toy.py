"""Ctrl-C (SIGINT) and SIGTERM sent to a real `coldsnap capture` and `coldsnap restore` (the
n610 driver and CRIU, on the toy engine): the command rolls the operation back, leaves no engine
running, says what to run should it be killed, ends its `--json` stream with the `finished`
event and exits with the rolled-back code (not click's "Aborted!" and 1)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from coldsnap import Machine
from coldsnap.machine import JOURNAL_NAME, read_journal
from coldsnap.machine._convert import unstructure
from coldsnap.testing.toy_engine import build_toy_model

from ._toy import capture_request, needs_criu, restore_request

pytestmark = [needs_criu, pytest.mark.criu, pytest.mark.xdist_group("toys")]

ROLLED_BACK = 3
COLDSNAP = (
    "import sys\n"
    "from coldsnap.machine import REGISTRY\n"
    "from coldsnap.testing.toy import register_toy\n"
    "register_toy(REGISTRY)\n"
    "from coldsnap.cli._main import main\n"
    "main(prog_name='coldsnap')\n"
)
"""The `coldsnap` command with the toy engine registered (the tests' engine has no entry point)."""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("signals", numbered=True)


@pytest.fixture(scope="module")
def model(root: Path) -> Path:
    return build_toy_model(root / "model", hidden=256, layers=2)


def engines(model: Path) -> list[int]:
    """Live processes (any parent) of an engine serving `model`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if proc.info["status"] != psutil.STATUS_ZOMBIE and str(model) in cmdline:
            found.append(proc.pid)
    return found


def interrupted(command: str, request_file: Path, step: str, sig: signal.Signals):
    """Runs `coldsnap COMMAND --json REQUEST_FILE`, sends `sig` as the stream says `step`
    started, and returns the exit code, the events and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", COLDSNAP, command, "--json", str(request_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    events = []
    assert proc.stdout is not None
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["event"] == "step_started" and events[-1]["step"] == step:
            proc.send_signal(sig)
            break
    rest, err = proc.communicate(timeout=300)
    events += [json.loads(line) for line in rest.splitlines()]
    assert any(e["event"] == "step_started" and e["step"] == step for e in events), err
    return proc.returncode, events, err


def _write(path: Path, request) -> Path:
    path.write_text(json.dumps(unstructure(request)))
    return path


def _check_rolled_back(code: int, events: list[dict], err: str, workdir: str) -> None:
    assert "Aborted" not in err
    assert code == ROLLED_BACK, err
    last = events[-1]
    assert (last["event"], last["status"]) == ("finished", "rolled_back"), last
    assert last["receipt"]["failure"]["type"] == "Cancelled"
    assert f"run: coldsnap resume {workdir}" in err
    assert read_journal(Path(workdir) / JOURNAL_NAME)[-1].event == "end"


def test_sigint_during_a_capture_rolls_it_back(root, model) -> None:
    request = capture_request(root, model, "n610", "native", "sigint")
    code, events, err = interrupted(
        "capture", _write(root / "capture.json", request), "wait_healthy", signal.SIGINT
    )
    _check_rolled_back(code, events, err, request.workdir)
    assert ("launch_engine", "step_compensated") in {(e["step"], e["event"]) for e in events}
    assert not engines(model), "the capture's engine was left running"
    assert not (root / "store" / "tags" / "sigint").exists()


def test_sigterm_during_a_restore_rolls_it_back(root, model) -> None:
    request = capture_request(root, model, "n610", "native", "sigterm")
    assert Machine.for_request(request).capture(request).ok
    assert not engines(model)
    restore = restore_request(root, model, "n610", "native", "sigterm", "res-sigterm")
    code, events, err = interrupted(
        "restore", _write(root / "restore.json", restore), "resume_weights", signal.SIGTERM
    )
    _check_rolled_back(code, events, err, restore.workdir)
    assert ("process_restore", "step_compensated") in {(e["step"], e["event"]) for e in events}
    assert not engines(model), "the restored engine was left running"
