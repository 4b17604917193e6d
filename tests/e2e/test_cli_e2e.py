"""The command line as a user runs it, from a shell that has not been readied for SGLang:
`coldsnap demo` once (a real cold start, capture and restore of a tiny SGLang server; it prints
the times, their ratio and the capsule size, and leaves nothing behind), and `coldsnap plan`
then `coldsnap capture` of a real SGLang server from one request file."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from .conftest import PRISTINE_ENV

pytestmark = [pytest.mark.criu, pytest.mark.sglang, pytest.mark.slow]
MARKER = "COLDSNAP_E2E_TEST_MARKER"


def _cli(*args: str, marker: str) -> subprocess.CompletedProcess[str]:
    """`python -m coldsnap.cli ARGS` with the environment this test session started with.

    Every process it starts inherits the marker (CRIU restores the environment a process
    started with), so leftovers can be found whatever their command lines say."""
    return subprocess.run(
        [sys.executable, "-m", "coldsnap.cli", *args],
        capture_output=True,
        text=True,
        timeout=540,  # under pytest's own 600 s per test
        env={**PRISTINE_ENV, MARKER: marker},
    )


def _marked(marker: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get(MARKER) == marker:
                found.append(f"{proc.info['pid']} {proc.info['name']}")
    return found


def _figure(label: str, unit: str, text: str) -> float:
    match = re.search(rf"^{label}\s+([0-9.]+)\s*{unit}\s*$", text, re.MULTILINE)
    assert match, f"no '{label}' line in:\n{text}"
    return float(match[1])


def test_the_demo_prints_cold_start_restore_and_their_ratio(e2e_ready: None) -> None:
    marker = uuid.uuid4().hex
    done = _cli("demo", marker=marker)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-4000:]
    cold = _figure("cold start to first answer", "s", out)
    restore = _figure("restore to first answer", "s", out)
    ratio = _figure("ratio", "x", out)
    capsule = _figure("capsule size", "MB", out)
    assert cold > 0 and restore > 0 and capsule > 0
    assert ratio == pytest.approx(cold / restore, rel=0.02, abs=0.06)  # printed rounded
    assert "equal to the cold start's token for token" in out
    workdir = re.search(r"^work directory: (\S+)$", out, re.MULTILINE)
    assert workdir, out
    assert not Path(workdir[1]).exists(), "the demo left its work directory behind"
    assert not _marked(marker), "the demo left processes running"


def test_the_cli_captures_a_real_sglang_server(e2e_ready: None, tmp_path: Path) -> None:
    from coldsnap.tiny_models import build_model

    info = build_model(tmp_path / "model", arch="llama", size="tiny", seed=0)
    request = {
        "kind": "coldsnap.capture-request",
        "format": 1,
        "driver": "n610",
        "provider": "recovery",
        "engine": "sglang",
        "model": {"id": "tiny-llama", "revision": "r1", "path": str(info.path)},
        "workdir": str(tmp_path / "capture"),
        "store": str(tmp_path / "store"),
        "name": "cli",
    }
    (tmp_path / "capture.json").write_text(json.dumps(request))
    marker = uuid.uuid4().hex
    planned = _cli("plan", str(tmp_path / "capture.json"), marker=marker)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert planned.stdout.startswith("capture-n610: driver n610, provider recovery")
    assert not (tmp_path / "capture").exists(), "plan started the operation"
    try:
        done = _cli("capture", str(tmp_path / "capture.json"), marker=marker)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["outcome"] == "done"
        assert not _marked(marker), "the capture left its source running"
    finally:
        shutil.rmtree(tmp_path / "store", ignore_errors=True)
