"""A capsule is self-contained: a real SGLang on CPU captured, then its whole store moved to
another directory and the capture's workdir deleted; the restore from the moved store answers
like a cold server, token for token.

What the image could still need from the capture's workdir is its engine's log (the tree's
stdout and stderr at dump): the drivers re-point it at the restore's workdir (CRIU's
--inherit-fd). Any other file of the capture's workdir that the image references would make the
capsule depend on that folder: the test names it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from coldsnap import Machine
from coldsnap.backends._images import read_file_paths
from coldsnap.backends._stdio import read_stdio_paths

from .conftest import answers, capture_request, leftovers, model_ref, restore_request, watch, why

pytestmark = [pytest.mark.criu, pytest.mark.sglang, pytest.mark.slow]
DRIVERS = ("n610", "n580")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("portable")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny(e2e_ready: None, root: Path) -> Path:
    from coldsnap.tiny_models import build_model

    return build_model(root / "tiny-llama", arch="llama", size="tiny", seed=0).path


@pytest.fixture(scope="module")
def cold(tiny: Path, root: Path) -> list[tuple[int, ...]]:
    from coldsnap.cli._demo import start_plain_server, wait_first_answer

    server = start_plain_server(tiny, root / "cold.log")
    try:
        wait_first_answer(server)
        return answers(server.url)
    finally:
        server.stop()


def _links_out_of(store: Path) -> list[str]:
    """Symbolic links in the store that point outside it (or by an absolute path)."""
    found = []
    for path in store.rglob("*"):
        if path.is_symlink():
            target = os.readlink(path)
            resolved = (path.parent / target).resolve()
            if os.path.isabs(target) or not resolved.is_relative_to(store.resolve()):
                found.append(f"{path} -> {target}")
    return found


def _naming(store: Path, text: str) -> list[Path]:
    """Files of the store (up to 1 MB: records, manifests, tags) that hold `text`."""
    needle = text.encode()
    return [
        p
        for p in store.rglob("*")
        if p.is_file() and p.stat().st_size < 1 << 20 and needle in p.read_bytes()
    ]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_moved_store_restores_without_the_capture_workdir(
    driver: str, root: Path, tiny: Path, cold: list[tuple[int, ...]]
) -> None:
    base = root / driver
    base.mkdir()
    model = model_ref(tiny)
    try:
        capture = capture_request(base, model, driver, "native", driver)
        receipt = Machine.for_request(capture).capture(capture)
        assert receipt.ok, why(receipt)
        dirs, pids = watch(receipt)
        workdir = Path(capture.workdir).resolve()

        moved = root / f"elsewhere-{driver}" / "store"
        moved.parent.mkdir()
        os.rename(base / "store", moved)
        shutil.rmtree(workdir)
        assert not _links_out_of(moved)
        assert not _naming(moved, str(base / "store")), "the store names its old path"

        restore = attrs.evolve(
            restore_request(base, model, driver, "native", driver, "res"), store=str(moved)
        )
        machine = Machine.for_request(restore)
        restored = machine.restore(restore)
        assert restored.ok, why(restored)
        more_dirs, more_pids = watch(restored)
        dirs, pids = dirs | more_dirs, pids | more_pids
        try:
            images = Path(restored.facts["image_dir"])  # the capsule's image, laid out here
            assert (images / "files.img").is_file(), f"no image at {images}"
            stdio = read_stdio_paths(images)
            assert [Path(p).parent for p in stdio] == [workdir], stdio  # the capture's log
            outside = [p for p in read_file_paths(images) if Path(p).is_relative_to(workdir)]
            assert set(outside) == set(stdio), f"the image needs capture files: {outside}"
            got = answers(restored.facts["engine_url"])
            log = Path(restore.workdir) / "engine.log"
            assert log.stat().st_size > 0, "the restored engine writes nothing to its new log"
        finally:
            machine.stop(restored)
        assert got == cold
        assert not workdir.exists(), "the restored engine wrote into the old capture workdir"
        assert not leftovers(dirs, pids)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(root / f"elsewhere-{driver}", ignore_errors=True)
