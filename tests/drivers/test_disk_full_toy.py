"""A real `coldsnap capture` (n610, CRIU, the toy engine) whose workdir is on a filesystem too
small for the process image: CRIU's dump fails with the disk full and the capture rolls back,
no engine left and no partial image, its journal whole. (Whether the journal's own appends meet
the full disk here depends on the room left in its last page; tests/machine/test_disk_full.py
makes them fail every time.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from coldsnap.machine import JOURNAL_NAME, read_journal
from coldsnap.machine._convert import unstructure
from coldsnap.testing.toy_engine import build_toy_model

from ._toy import capture_request, needs_criu
from .test_signals_toy import COLDSNAP, ROLLED_BACK, engines

pytestmark = [needs_criu, pytest.mark.criu, pytest.mark.xdist_group("toys")]


@pytest.fixture
def small(tmp_path: Path):
    """A 4 MiB filesystem: room for the journal and the engine's log, not for an image."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs",
                           str(mount)], capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_capture_that_fills_the_disk_rolls_back(tmp_path, small) -> None:
    model = build_toy_model(tmp_path / "model", hidden=256, layers=2)
    request = capture_request(tmp_path, model, "n610", "recovery", "full")
    request = attrs.evolve(request, workdir=str(small / "cap"))
    (tmp_path / "capture.json").write_text(json.dumps(unstructure(request)))
    done = subprocess.run(
        [sys.executable, "-c", COLDSNAP, "capture", "--json", str(tmp_path / "capture.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == ROLLED_BACK, done.stderr
    last = events[-1]
    assert (last["event"], last["status"]) == ("finished", "rolled_back"), done.stderr
    assert last["receipt"]["failure"]["step"] == "process_dump"
    assert not engines(model), "the capture's engine was left running"
    records = read_journal(small / "cap" / JOURNAL_NAME)
    assert ("comp_end", "process_dump") in [(r.event, r.step) for r in records]
    assert records[-1].event == "end"
    assert not [p for p in (small / "cap").rglob("*.img")], "the partial image was left"
