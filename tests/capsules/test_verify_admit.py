"""Admission verifies every member a restore reads against the capsule's manifest, as laid out:
the process image, and the payload's packs and their index (whose checksums are all a later
stage checks the packs by). A pack edited in the store together with its index's checksum is
refused at admit; a store another user owns is laid out as private copies, never as links to
files that user could change after they were verified."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from coldsnap.artifacts import IntegrityError, Store
from coldsnap.capsules import StoreArtifacts
from coldsnap.capsules._verified import VerifiedObjects
from coldsnap.machine import steps as s
from coldsnap.providers.native import PackDirectory, export_pack, verify_pack

from .test_store_steps import Ctx, Engine, _capture_request, _restore_request

BLOCK = 4096


def _sealed(tmp_path: Path) -> Store:
    """A capsule with a one-file image and a real native payload (one embedding's pack)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    image = tmp_path / "op" / "image"
    image.mkdir(parents=True)
    (image / "pages-1.img").write_bytes(b"p" * 5000)
    payload = tmp_path / "op" / "payload"
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(64, 32)  # 8 KiB of float32: two blocks
    export_pack(embedding, payload / "tp0" / "target", block_bytes=BLOCK)
    facts: dict[str, Any] = {
        s.IMAGE_DIR.name: str(image),
        s.IMAGE_BYTES.name: 5000,
        s.PAYLOAD_DIR.name: str(payload),
    }
    seal = Ctx(_capture_request(tmp_path, model), tmp_path / "op", facts, s.SEAL)
    StoreArtifacts(Engine(), VerifiedObjects(tmp_path / "verified")).seal(seal)
    return Store(tmp_path / "store")


def _admit(tmp_path: Path) -> dict[str, Any]:
    ctx = Ctx(_restore_request(tmp_path), tmp_path / "res", {}, s.ADMIT)
    return StoreArtifacts(Engine(), VerifiedObjects(tmp_path / "verified")).admit(ctx)


def _object(store: Store, suffix: str) -> Path:
    (member,) = [m for m in store.capsule("cap").members if m.name.endswith(suffix)]
    return store.path(member.digest)


def _edit_in_place(path: Path, offset: int, data: bytes) -> None:
    """Rewrites bytes of a store object in place (its inode, name and size stay)."""
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_pack_edited_with_its_index_s_checksum_is_refused_at_admit(tmp_path: Path) -> None:
    store = _sealed(tmp_path)
    pack, index = _object(store, ".pack"), _object(store, "index.json")
    record = json.loads(index.read_bytes())
    extent = record["extents"][0]
    zeroed = bytes(128)  # one embedding row of float32
    _edit_in_place(pack, extent["offset"], zeroed)
    with open(pack, "rb") as f:
        f.seek(extent["offset"])
        first_block = f.read(min(BLOCK, extent["nbytes"]))
    old, new = extent["checksums"][0], xxhash.xxh3_64_hexdigest(first_block)
    text = index.read_bytes()
    assert text.count(old.encode()) == 1 and len(old) == len(new)
    _edit_in_place(index, text.index(old.encode()), new.encode())

    # What a stage checks the packs by now agrees with the edited pack...
    check = tmp_path / "check"
    check.mkdir()
    os.link(index, check / "index.json")
    os.link(pack, check / f"{pack.parent.name}{pack.name}.pack")  # named by its digest
    verify_pack(PackDirectory(check))
    # ...so admission must rehash both against the manifest, and it does.
    with pytest.raises(IntegrityError) as refused:
        _admit(tmp_path)
    assert "payload/tp0/target/index.json" in str(refused.value)
    assert ".pack" in str(refused.value)
    assert not (tmp_path / "res" / "payload").exists(), "an unverified payload stayed laid out"


def test_an_undamaged_payload_is_admitted_and_laid_out_as_links(tmp_path: Path) -> None:
    store = _sealed(tmp_path)
    made = _admit(tmp_path)
    laid_out = Path(made[s.PAYLOAD_DIR.name]) / "tp0" / "target" / "index.json"
    assert laid_out.stat().st_ino == _object(store, "index.json").stat().st_ino
    verify_pack(PackDirectory(laid_out.parent))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a store to another user needs root")
def test_a_store_another_user_owns_is_laid_out_as_private_copies(tmp_path: Path) -> None:
    store = _sealed(tmp_path)
    for path in (store.root / "objects").rglob("*"):
        os.chown(path, 12345, 12345, follow_symlinks=False)
    made = _admit(tmp_path)
    files = [
        p for key in (s.IMAGE_DIR.name, s.PAYLOAD_DIR.name) for p in Path(made[key]).rglob("*")
    ]
    for path in files:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == 0o700, path
            continue
        assert st.st_nlink == 1 and st.st_uid == os.geteuid(), f"{path} is the other user's file"
        assert stat.S_IMODE(st.st_mode) == 0o600, path
    assert any(p.name == "index.json" for p in files)
