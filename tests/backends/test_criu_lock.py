"""One CRIU dump or restore at a time on a host: CRIU names its links to deleted files
/dev/shm/link_remap.<file id>, two images of the same process shape use the same ids, and a
restore puts its image's saved links back at those paths while CRIU runs. A dump beside such a
restore failed with "Can't link remap ... File exists" (seen with two SGLang servers on one
GPU host). Real CRIU, real processes."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock
import pytest

from coldsnap.backends import Criu, DumpManifest, launch
from coldsnap.backends import criu as criu_module
from coldsnap.backends._files import put_back

from .conftest import target, wait_for_line

pytestmark = [pytest.mark.criu, pytest.mark.xdist_group("toys")]


@pytest.fixture
def cleanup() -> Iterator[list[Path]]:
    """Files to remove after the test: the targets' semaphores and any link_remap left."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


def _dump_mapper(criu: Criu, work: Path, name: str, cleanup: list[Path]) -> DumpManifest:
    shm = Path(f"/dev/shm/coldsnap-test-{uuid.uuid4().hex[:8]}")
    shm.write_bytes(b"x" * 4096)
    cleanup.append(shm)
    log = work / f"{name}.log"
    proc = launch(target("mapper.py", shm), log_path=log)
    try:
        cleanup.append(Path(wait_for_line(log, r"ready .* sem=(\S+)", pid=proc.pid)[1]))
        return criu.dump(proc.pid, work / name, leave_running=True)
    finally:
        proc.stop(timeout=5)


def _remaps(manifest: DumpManifest) -> list[str]:
    return sorted(f.path for f in manifest.saved_files if "/link_remap." in f.path)


OCCUPIED = range(1, 1024)
"""The link ids a simulated restore holds: every id a small process's image can give its
links. Which ids a dump uses depends on how many files its tree has open and mapped at that
moment (the target's resource tracker may still be starting), so the first dump's ids alone
need not be the second's; a file at each of these paths makes an unlocked dump of the target
fail whatever its ids."""


def test_a_dump_waits_while_a_restore_holds_its_link_remaps_back(
    criu: Criu, tmp_path: Path, cleanup: list[Path]
) -> None:
    first = _dump_mapper(criu, tmp_path, "first", cleanup)
    links = _remaps(first)
    assert links, "the target's semaphore gave no link_remap file"
    cleanup.extend(Path(p) for p in links)

    # A restore in progress: the lock held, its saved links back at their paths, and a link at
    # every other id such an image could have.
    held = filelock.FileLock(criu_module._CRIU_LOCK, is_singleton=False)
    held.acquire()
    placed: list[Path] = []
    try:
        for path in links:
            put_back(tmp_path / "first", path)
        for number in OCCUPIED:
            path = Path(f"/dev/shm/link_remap.{number}")
            with contextlib.suppress(FileExistsError):
                path.open("x").close()
                placed.append(path)
        outcome: list[object] = []
        second = threading.Thread(
            target=lambda: outcome.append(_try(_dump_mapper, criu, tmp_path, "second", cleanup))
        )
        second.start()
        wait_for_line(tmp_path / "second.log", r"ready ", timeout=60.0)
        second.join(timeout=5.0)  # long enough for an unlocked dump to reach the link step
        assert second.is_alive(), f"the second dump ended while the lock was held: {outcome}"
        for path in links:  # the restore consumed them, then lets go
            Path(path).unlink(missing_ok=True)
    finally:
        for path in placed:
            path.unlink(missing_ok=True)
        held.release()
    second.join(timeout=120)
    assert not second.is_alive()
    [result] = outcome
    assert isinstance(result, DumpManifest), f"the second dump failed: {result!r}"
    ids = {int(path.rsplit(".", 1)[1]) for path in _remaps(result)}
    assert ids and ids <= set(OCCUPIED), f"the second dump's link ids {ids} were never occupied"


def _try(function: Callable[..., object], *args: object) -> object:
    """The thread's result, or its error, handed to the test's thread to assert on."""
    try:
        return function(*args)
    except Exception as exc:
        return exc
