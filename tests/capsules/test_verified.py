"""Verification once per node: a member laid out as an unchanged, already verified inode is not
hashed again; any write, a fresh file or a foreign record makes it hashed as before."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from coldsnap.artifacts import IntegrityError, Member
from coldsnap.capsules._steps import verify_layout
from coldsnap.capsules._verified import Seen, VerifiedObjects

OLD = time.time() - 3600  # an object adopted an hour ago: its mtime has settled


def _member(tmp_path: Path, name: str, data: bytes, *, settled: bool = True) -> Member:
    path = tmp_path / "image" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    if settled:
        os.utime(path, (OLD, OLD))
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return Member(role="process-image", name=f"image/{name}", digest=digest, size=len(data))


def _flip(path: Path) -> None:
    with open(path, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 1]))


def test_a_verified_unchanged_member_is_not_hashed_again(tmp_path: Path) -> None:
    cache = VerifiedObjects(tmp_path / "verified")
    members = [_member(tmp_path, "pages-1.img", b"a" * 5000), _member(tmp_path, "mm.img", b"mm")]
    assert verify_layout(members, "image", tmp_path / "image", cache) == 5002
    assert verify_layout(members, "image", tmp_path / "image", cache) == 0
    assert verify_layout(members, "image", tmp_path / "image") == 5002  # without: every byte


def test_a_write_after_verification_is_caught(tmp_path: Path) -> None:
    cache = VerifiedObjects(tmp_path / "verified")
    members = [_member(tmp_path, "pages-1.img", b"b" * 4096)]
    verify_layout(members, "image", tmp_path / "image", cache)
    _flip(tmp_path / "image" / "pages-1.img")  # the write moves the mtime
    with pytest.raises(IntegrityError, match=r"pages-1\.img"):
        verify_layout(members, "image", tmp_path / "image", cache)


def test_a_fresh_object_is_not_remembered(tmp_path: Path) -> None:
    """Its mtime may not have ticked yet: a write in the same tick would go unseen."""
    cache = VerifiedObjects(tmp_path / "verified")
    members = [_member(tmp_path, "pages-1.img", b"c" * 100, settled=False)]
    verify_layout(members, "image", tmp_path / "image", cache)
    assert verify_layout(members, "image", tmp_path / "image", cache) == 100


def test_another_inode_with_the_same_bytes_is_hashed(tmp_path: Path) -> None:
    cache = VerifiedObjects(tmp_path / "verified")
    members = [_member(tmp_path, "pages-1.img", b"d" * 100)]
    verify_layout(members, "image", tmp_path / "image", cache)
    path = tmp_path / "image" / "pages-1.img"
    copy = path.with_name("copy")
    copy.write_bytes(path.read_bytes())
    os.utime(copy, (OLD, OLD))
    os.replace(copy, path)  # same bytes, same mtime, another inode
    assert verify_layout(members, "image", tmp_path / "image", cache) == 100


@pytest.mark.parametrize(
    "record",
    ["not json", json.dumps([1]), json.dumps({"format": 2, "kind": "coldsnap.verified-object"})],
)
def test_an_unreadable_or_foreign_record_means_hash_again(tmp_path: Path, record: str) -> None:
    cache = VerifiedObjects(tmp_path / "verified")
    member = _member(tmp_path, "pages-1.img", b"e" * 10)
    path = tmp_path / "image" / "pages-1.img"
    cache.remember(member.digest, path, Seen.of(path))
    assert cache.unchanged(member.digest, path)
    record_path = next((tmp_path / "verified").rglob("*.json"))
    record_path.write_text(record)
    assert not cache.unchanged(member.digest, path)


def test_a_digest_that_is_no_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an object digest"):
        VerifiedObjects(tmp_path).unchanged("sha256:../../etc", tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_another_user_owns_is_hashed_at_every_use(tmp_path: Path) -> None:
    """Its owner may write it and put the mtime back: its stamp proves nothing."""
    cache = VerifiedObjects(tmp_path / "verified")
    members = [_member(tmp_path, "pages-1.img", b"f" * 4096)]
    path = tmp_path / "image" / "pages-1.img"
    os.chown(path, 12345, 12345)
    verify_layout(members, "image", tmp_path / "image", cache)
    before = os.lstat(path)
    _flip(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(IntegrityError, match=r"pages-1\.img"):
        verify_layout(members, "image", tmp_path / "image", cache)


def test_a_file_others_may_write_is_hashed_at_every_use(tmp_path: Path) -> None:
    cache = VerifiedObjects(tmp_path / "verified")
    members = [_member(tmp_path, "pages-1.img", b"g" * 4096)]
    path = tmp_path / "image" / "pages-1.img"
    os.chmod(path, 0o666)
    verify_layout(members, "image", tmp_path / "image", cache)
    before = os.lstat(path)
    _flip(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(IntegrityError, match=r"pages-1\.img"):
        verify_layout(members, "image", tmp_path / "image", cache)


def test_a_record_of_the_former_format_is_not_taken(tmp_path: Path) -> None:
    """Records that named no owner are read as no record: the member is hashed once more."""
    cache = VerifiedObjects(tmp_path / "verified")
    members = [_member(tmp_path, "pages-1.img", b"h" * 100)]
    verify_layout(members, "image", tmp_path / "image", cache)
    record_path = next((tmp_path / "verified").rglob("*.json"))
    old = json.loads(record_path.read_text())
    old.pop("owner")
    record_path.write_text(json.dumps({**old, "format": 1}))
    assert verify_layout(members, "image", tmp_path / "image", cache) == 100
