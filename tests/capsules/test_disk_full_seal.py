"""A capture whose store is on another filesystem than its workdir: the seal copies the process
image and the payload in, and leaves no second copy of them (the engine's memory) in the
capture's workdir, as a move on one filesystem leaves none."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from coldsnap.artifacts import Store
from coldsnap.capsules import _steps
from coldsnap.machine import steps as s

from .test_store_steps import Ctx, Engine, _capture_request


@pytest.fixture
def elsewhere(tmp_path: Path):
    """A workdir on another filesystem than `tmp_path` (where the store is)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem for the workdir")
    workdir = shm / f"coldsnap-seal-{uuid.uuid4().hex}"
    workdir.mkdir(mode=0o700)
    yield workdir
    shutil.rmtree(workdir)


def test_a_seal_across_filesystems_leaves_no_copy_in_the_workdir(tmp_path, elsewhere) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 1000)
    files = {"image/pages-1.img": b"memory" * 2000, "image/core-1.img": b"core",
             "payload/tp0/w/index.json": b"{}", "payload/tp0/w/ab.pack": b"p" * 5000}  # fmt: skip
    for name, data in files.items():
        (elsewhere / name).parent.mkdir(parents=True, exist_ok=True)
        (elsewhere / name).write_bytes(data)
    facts = {s.IMAGE_DIR.name: str(elsewhere / "image"),
             s.PAYLOAD_DIR.name: str(elsewhere / "payload")}  # fmt: skip
    ctx = Ctx(_capture_request(tmp_path, model), elsewhere, facts, s.SEAL)
    ctx.facts.update(_steps.StoreArtifacts(Engine()).seal(ctx))
    store = Store(tmp_path / "store")
    members = {m.name: m for m in store.capsule("cap").members}
    for name, data in files.items():
        assert store.read_bytes(members[name].digest) == data
    left = [p for p in elsewhere.rglob("*") if p.is_file()]
    assert not left, f"the seal left copies in the workdir: {left}"
