"""A restored tree's output re-pointed with `output` (CRIU's --inherit-fd): the image then needs
nothing from the directory the tree was dumped from. Real processes, real CRIU (root)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coldsnap.backends import Criu, CriuError, launch, wait_gone
from coldsnap.backends._stdio import read_stdio_paths

from .conftest import ask, target, wait_for_line

pytestmark = [pytest.mark.criu, pytest.mark.xdist_group("toys")]
REPORT = r"report pid=(\d+) count=(\d+) checksum=(\d+)"


def _dump_counter(criu: Criu, images: Path, log: Path | None) -> tuple[int, int]:
    """A counter (1 MB of state) dumped and killed; returns its pid and checksum."""
    proc = launch(target("counter.py", 1), log_path=log)
    try:
        if log is not None:
            checksum = int(wait_for_line(log, r"ready pid=\d+ checksum=(\d+)")[1])
        else:
            checksum = 0
        criu.dump(proc.pid, images)
    except BaseException:
        proc.stop(timeout=5)
        raise
    assert proc.wait(10) == -9
    return proc.pid, checksum


def test_output_replaces_the_dump_time_log_whose_directory_is_gone(
    criu: Criu, tmp_path: Path
) -> None:
    first_dir = tmp_path / "capture-workdir"
    log = first_dir / "engine.log"
    pid, checksum = _dump_counter(criu, tmp_path / "image", log)
    assert read_stdio_paths(tmp_path / "image") == (str(log),)
    shutil.rmtree(first_dir)

    with pytest.raises(CriuError) as info:  # without `output` the image needs that log
        criu.restore(tmp_path / "image", work_dir=tmp_path / "op-0")
    assert "engine.log" in (info.value.first_error or "")
    wait_gone(pid, timeout=10)

    for attempt in (1, 2):
        out = tmp_path / f"restore-{attempt}" / "engine.log"
        tree = criu.restore(tmp_path / "image", work_dir=tmp_path / f"op-{attempt}", output=out)
        try:
            report = ask(tree.pid, out, REPORT)
            assert int(report[1]) == pid and int(report[3]) == checksum
            assert Path(f"/proc/{tree.pid}/fd/1").resolve() == out
            assert Path(f"/proc/{tree.pid}/fd/2").resolve() == out
            assert Path(f"/proc/{tree.pid}/fd/0").resolve() == Path("/dev/null")
        finally:
            criu.stop(tree, timeout=5)
            wait_gone(tree.pid, timeout=10)
    assert not first_dir.exists()  # nothing wrote there again


def test_a_root_writing_to_dev_null_leaves_output_unused(criu: Criu, tmp_path: Path) -> None:
    pid, _ = _dump_counter(criu, tmp_path / "image", None)
    assert read_stdio_paths(tmp_path / "image") == ()
    out = tmp_path / "restore" / "engine.log"
    tree = criu.restore(tmp_path / "image", output=out)
    try:
        assert tree.pid == pid
        assert Path(f"/proc/{tree.pid}/fd/1").resolve() == Path("/dev/null")
        assert not out.exists()
    finally:
        criu.stop(tree, timeout=5)
        wait_gone(tree.pid, timeout=10)
