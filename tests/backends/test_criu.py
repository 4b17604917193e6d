"""The CRIU backend on real processes: dump, restore, restore again, collisions, namespaces,
sockets, external files, errors. Needs root and CRIU >= 4.2 (scripts/setup-criu.sh)."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from attrs import frozen

from coldsnap.backends import (
    Criu,
    CriuError,
    DumpManifest,
    PidCollision,
    RestoredTree,
    launch,
    wait_gone,
)
from coldsnap.backends._images import read_file_paths, read_pstree
from coldsnap.backends._records import DUMP_MANIFEST, RESTORE_RECORD, read_record
from tests._support import free_port

from .conftest import ask, target, wait_for_line

pytestmark = [pytest.mark.criu, pytest.mark.xdist_group("toys")]
STATE_MB = 200
REPORT = r"report pid=(\d+) count=(\d+) checksum=(\d+)"


@frozen
class CounterImage:
    images: Path
    log: Path
    pid: int
    checksum: int
    count_at_dump: int
    manifest: DumpManifest


@pytest.fixture(scope="module")
def counter_image(criu: Criu, tmp_path_factory: pytest.TempPathFactory) -> CounterImage:
    """A Python process holding 200 MB of state, dumped once (and killed by the dump)."""
    base = tmp_path_factory.mktemp("counter")
    log = base / "counter.log"
    proc = launch(target("counter.py", STATE_MB), log_path=log)
    try:
        ready = wait_for_line(log, r"ready pid=(\d+) checksum=(\d+)")
        count = int(ask(proc.pid, log, REPORT)[2])
        manifest = criu.dump(proc.pid, base / "image")
    except BaseException:
        proc.stop(timeout=5)
        raise
    assert proc.wait(10) == -9  # CRIU kills the dumped tree; we reap it
    return CounterImage(base / "image", log, proc.pid, int(ready[2]), count, manifest)


@pytest.fixture
def restored(criu: Criu) -> Iterator[list[RestoredTree]]:
    """Restored trees to stop (and reap) after the test."""
    trees: list[RestoredTree] = []
    yield trees
    for tree in reversed(trees):
        criu.stop(tree, timeout=5)
        if tree.criu_pid is None:
            wait_gone(tree.pid, timeout=10)


def test_version_and_check(criu: Criu) -> None:
    assert (criu.version().major, criu.version().minor) >= (4, 2)
    assert criu.check() == "Looks good."


def test_200mb_process_restores_with_equal_checksum_and_keeps_counting(
    criu: Criu, counter_image: CounterImage, restored: list[RestoredTree]
) -> None:
    image = counter_image
    assert image.manifest.root_pid == image.pid and image.pid in image.manifest.pids
    assert image.manifest.image_bytes > STATE_MB << 20
    assert read_record(image.images / DUMP_MANIFEST, DumpManifest) == image.manifest

    tree = criu.restore(image.images)
    restored.append(tree)
    assert tree.pid == image.pid  # the same PID, taken back
    first = ask(tree.pid, image.log, REPORT)
    assert int(first[3]) == image.checksum
    assert int(first[2]) >= image.count_at_dump
    # It carries on counting. A report can come before the loop's next step (the second
    # signal may be handled as the first handler returns), so ask until the count moves: a
    # tree whose loop stopped would answer with the same count every time.
    counts = [int(ask(tree.pid, image.log, REPORT)[2])]
    while counts[-1] == int(first[2]) and len(counts) < 20:
        counts.append(int(ask(tree.pid, image.log, REPORT)[2]))
    assert counts[-1] > int(first[2]), counts
    assert read_record(Path(tree.work_dir) / RESTORE_RECORD, RestoredTree) == tree
    assert "Restore finished successfully" in Path(tree.log_path).read_text()


def test_second_restore_after_the_first_is_stopped_and_reaped(
    criu: Criu, counter_image: CounterImage, restored: list[RestoredTree]
) -> None:
    first = criu.restore(counter_image.images)
    assert int(ask(first.pid, counter_image.log, REPORT)[3]) == counter_image.checksum
    criu.stop(first, timeout=5)
    wait_gone(first.pid, timeout=10)
    second = criu.restore(counter_image.images)
    restored.append(second)
    report = ask(second.pid, counter_image.log, REPORT)
    assert int(report[3]) == counter_image.checksum
    assert second.work_dir != first.work_dir


def test_pid_collision_is_reported_before_criu_runs(
    criu: Criu, counter_image: CounterImage, restored: list[RestoredTree]
) -> None:
    restored.append(criu.restore(counter_image.images))
    with pytest.raises(PidCollision) as info:
        criu.restore(counter_image.images)
    assert info.value.pid == counter_image.pid
    message = str(info.value)
    assert f"PID {counter_image.pid}" in message and "python" in message


def test_new_pid_namespace_while_the_original_is_alive(
    criu: Criu, counter_image: CounterImage, restored: list[RestoredTree]
) -> None:
    original = criu.restore(counter_image.images)
    restored.append(original)
    copy = criu.restore(counter_image.images, new_pid_namespace=True)
    restored.append(copy)
    assert copy.pid != original.pid and copy.criu_pid is not None and copy.new_pid_namespace
    status = Path(f"/proc/{copy.pid}/status").read_text()
    nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M)[1].split()  # type: ignore[index]
    assert nspid == [str(copy.pid), str(counter_image.pid)]
    report = ask(copy.pid, counter_image.log, REPORT)
    assert int(report[1]) == counter_image.pid  # its own getpid(), inside the namespace
    assert int(report[3]) == counter_image.checksum
    assert int(ask(original.pid, counter_image.log, REPORT)[3]) == counter_image.checksum


def test_restore_left_stopped(
    criu: Criu, counter_image: CounterImage, restored: list[RestoredTree]
) -> None:
    tree = criu.restore(counter_image.images, stopped=True)
    restored.append(tree)
    state = Path(f"/proc/{tree.pid}/stat").read_text().rpartition(")")[2].split()[0]
    assert state == "T"
    os.kill(tree.pid, 18)  # SIGCONT
    assert int(ask(tree.pid, counter_image.log, REPORT)[3]) == counter_image.checksum


def test_image_with_its_own_pid_namespace_restores_many_copies_at_once(
    criu: Criu, tmp_path: Path, restored: list[RestoredTree]
) -> None:
    """A tree launched in its own PID namespace (the template way): every restore gets a new
    namespace from CRIU, so copies live side by side with no PID to free."""
    log = tmp_path / "ns.log"
    proc = launch(target("counter.py", 1), log_path=log, new_pid_namespace=True)
    try:
        ready = wait_for_line(log, r"ready pid=(\d+) checksum=(\d+)")
        assert int(ready[1]) == 1  # the target is its namespace's init
        at_dump = int(ask(proc.pid, log, REPORT)[2])
        manifest = criu.dump(proc.pid, tmp_path / "image")
    finally:
        proc.stop(timeout=5)
    assert manifest.own_pid_namespace and manifest.root_pid == 1
    copies = [criu.restore(tmp_path / "image") for _ in range(3)]
    restored.extend(copies)
    assert len({c.pid for c in copies}) == 3 and all(c.new_pid_namespace for c in copies)
    mine = rf"report pid=1 count=(\d+) checksum={ready[2]}"
    for copy in copies:  # each copy is the dumped state, and runs on by itself
        first = int(ask(copy.pid, log, mine)[1])
        assert first >= at_dump
        assert _counts_past(copy.pid, log, mine, first)


def _counts_past(pid: int, log: Path, pattern: str, count: int, timeout: float = 10.0) -> bool:
    """Whether the counter `pid` reports a count above `count` within `timeout` (it counts
    every 5 ms while it runs; a busy host may not run it for a while)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(ask(pid, log, pattern)[1]) > count:
            return True
        time.sleep(0.05)
    return False


def test_a_tree_left_stopped_stops_on_sigterm(criu: Criu, counter_image: CounterImage) -> None:
    tree = criu.restore(counter_image.images, stopped=True)
    assert criu.stop(tree, timeout=20) == -signal.SIGTERM  # ended by it, not SIGKILL after 20 s
    assert not Path(f"/proc/{tree.pid}").exists()


def test_http_server_serves_again_after_restore(
    criu: Criu, tmp_path: Path, restored: list[RestoredTree]
) -> None:
    port = free_port()
    proc = launch(target("http_server.py", port), log_path=tmp_path / "http.log")
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_line(tmp_path / "http.log", "ready")
        with httpx.Client(timeout=10) as client:
            assert client.get(url).text.startswith("hits=1 ")
            assert client.get(url).text.startswith("hits=2 ")
        # Leave it running: the original goes on serving, the image keeps hits=2.
        criu.dump(proc.pid, tmp_path / "image", leave_running=True)
        assert httpx.get(url, timeout=10).text.startswith("hits=3 ")
    finally:
        proc.stop(timeout=5)
    tree = criu.restore(tmp_path / "image")
    restored.append(tree)
    with httpx.Client(timeout=10) as client:
        assert client.get(url).text == f"hits=3 pid={proc.pid}"
        assert client.get(url).text == f"hits=4 pid={proc.pid}"


@pytest.fixture
def unlink_after() -> Iterator[list[Path]]:
    """Files to remove after the test (a semaphore that a killed tree could not remove)."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.fixture
def shm_file() -> Iterator[Path]:
    path = Path(f"/dev/shm/coldsnap-test-{uuid.uuid4().hex[:8]}")
    path.write_bytes(b"snapshot content".ljust(4096, b"\0"))
    yield path
    path.unlink(missing_ok=True)


def test_dev_shm_files_and_link_remaps_are_kept_with_the_image(
    criu: Criu,
    tmp_path: Path,
    shm_file: Path,
    restored: list[RestoredTree],
    unlink_after: list[Path],
) -> None:
    log = tmp_path / "mapper.log"
    proc = launch(target("mapper.py", shm_file), log_path=log)
    try:
        unlink_after.append(Path(wait_for_line(log, r"ready .* sem=(\S+)")[1]))
        manifest = criu.dump(proc.pid, tmp_path / "image", leave_running=True)
    finally:
        proc.stop(timeout=5)
    saved = {f.path for f in manifest.saved_files}
    remaps = [p for p in saved if p.startswith("/dev/shm/link_remap.")]
    assert str(shm_file) in saved
    assert remaps, f"no link_remap file saved (the semaphore's); saved: {saved}"
    assert set(read_file_paths(tmp_path / "image")) >= saved
    for path in remaps:  # a --leave-running dump deletes them; the image keeps a copy
        assert not Path(path).exists()

    try:
        for _ in range(2):  # the same image, twice: files are put back each time
            shm_file.write_bytes(b"changed later".ljust(4096, b"\0"))
            tree = criu.restore(tmp_path / "image")
            assert ask(tree.pid, log, rf"map {shm_file} (.*)")[1].startswith("snapshot content")
            criu.stop(tree, timeout=5)
            wait_gone(tree.pid, timeout=10)
    finally:
        for path in remaps:
            Path(path).unlink(missing_ok=True)


def test_failure_carries_criu_first_error_and_keeps_the_log(
    criu: Criu, tmp_path: Path, unlink_after: list[Path]
) -> None:
    mapped = tmp_path / "mapped.bin"
    mapped.write_bytes(b"x" * 4096)
    log = tmp_path / "mapper.log"
    proc = launch(target("mapper.py", mapped), log_path=log)
    try:
        unlink_after.append(Path(wait_for_line(log, r"ready .* sem=(\S+)")[1]))
        criu.dump(proc.pid, tmp_path / "image")
    finally:
        proc.stop(timeout=5)
    tasks = read_pstree(tmp_path / "image")
    assert tasks[0].pid == proc.pid and len(tasks) == 2  # with the resource tracker
    mapped.unlink()  # the image needs it back
    with pytest.raises(CriuError) as info:
        criu.restore(tmp_path / "image", work_dir=tmp_path / "op")
    error = info.value
    assert error.first_error and error.first_error.startswith("Error (")
    assert "RLIMIT_NOFILE" not in error.first_error  # the harmless line is skipped
    assert error.log_path == tmp_path / "op" / "restore.log" and error.log_path.stat().st_size
    assert error.first_error in str(error) and str(error.log_path) in str(error)
    for task in tasks:  # what CRIU forked before failing is gone and reaped
        assert not Path(f"/proc/{task.pid}").exists()


def test_bad_requests_fail_before_side_effects(criu: Criu, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("x")
    with pytest.raises(ValueError, match="images_dir"):
        criu.dump(os.getpid(), busy)
    with pytest.raises(ValueError, match="extra_files"):
        criu.dump(os.getpid(), tmp_path / "new", extra_files=["relative/path"])
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match="not a CRIU image"):
        criu.restore(busy)
