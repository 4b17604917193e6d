"""The content-addressed store: atomic writes and publishes, gc, concurrent writers,
permissions, symlink refusal, and verification catching corruption."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coldsnap import _atomic
from coldsnap.artifacts import (
    Capsule,
    IntegrityError,
    Member,
    RecordError,
    Store,
    StoreError,
    digest_problem,
    from_json,
    member_name_problem,
    to_json,
)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def capsule_of(store: Store, blobs: dict[str, bytes]) -> Capsule:
    members = [
        Member("pack", name, store.put_bytes(data), len(data)) for name, data in blobs.items()
    ]
    return Capsule(members=tuple(members))


def flip_byte(path: Path, offset: int = 0) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_objects_are_named_by_sha256_and_private(tmp_path):
    store = Store(tmp_path / "store")
    digest = store.put_bytes(b"hello")
    assert digest == sha(b"hello")
    assert store.read_bytes(digest) == b"hello"
    assert store.size(digest) == 5
    assert store.put_bytes(b"hello") == digest  # idempotent
    big = os.urandom(3 << 20)
    source = tmp_path / "big.bin"
    source.write_bytes(big)
    assert store.put_file(source) == sha(big)
    with open(source, "rb") as handle:
        assert store.put_stream(handle) == sha(big)
    store.publish(Capsule(members=(Member("pack", "big", sha(big), len(big)),)), tag="t")
    for dirpath, _, filenames in os.walk(store.root):
        assert stat.S_IMODE(os.lstat(dirpath).st_mode) == 0o700, dirpath
        for name in filenames:
            mode = stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode)
            assert mode == 0o600, os.path.join(dirpath, name)
    assert os.listdir(store.root / "tmp") == []


def test_an_existing_wide_open_store_is_made_private(tmp_path):
    root = tmp_path / "store"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    Store(root)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


def _shared_dir(root: Path) -> dict[str, int]:
    """A world-writable sticky directory (like /tmp) holding a user's files, and the modes of
    everything in it, to compare after."""
    root.mkdir()
    os.chmod(root, 0o1777)
    (root / "tmp").mkdir()
    (root / "tmp" / "someone-elses.part").write_bytes(b"keep me")
    (root / "notes.txt").write_text("mine")
    return {str(p): os.lstat(p).st_mode for p in [root, *root.rglob("*")]}


def test_opening_a_directory_that_is_not_a_store_refuses_and_changes_nothing(tmp_path):
    root = tmp_path / "shared"
    before = _shared_dir(root)
    with pytest.raises(StoreError, match="not a coldsnap store"):
        Store.open(root)
    with pytest.raises(StoreError, match="no store at"):
        Store.open(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()
    assert {str(p): os.lstat(p).st_mode for p in [root, *root.rglob("*")]} == before


def test_a_store_is_not_made_in_a_directory_holding_other_files(tmp_path):
    root = tmp_path / "shared"
    before = _shared_dir(root)
    with pytest.raises(StoreError, match="not a coldsnap store and not empty"):
        Store(root)
    assert {str(p): os.lstat(p).st_mode for p in [root, *root.rglob("*")]} == before


def test_opening_an_existing_store_changes_no_mode(tmp_path):
    root = tmp_path / "s"
    Store(root).put_bytes(b"x")
    os.chmod(root, 0o750)
    opened = Store.open(root)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o750
    assert list(opened.objects()) == [sha(b"x")]


def test_a_half_made_store_is_completed_by_a_writer(tmp_path):
    root = tmp_path / "s"
    root.mkdir()
    (root / "objects").mkdir()  # what a crash between two mkdirs leaves
    Store(root)
    Store.open(root)


def test_gc_removes_only_the_store_s_own_temporary_files(tmp_path):
    store = Store(tmp_path / "s")
    tmp = store.root / "tmp"
    ours = tmp / f"{uuid.uuid4().hex}.adopt"
    ours.write_bytes(b"a crash left it")
    foreign = [tmp / "notes.part", tmp / "ABCDEF.part", tmp / f"{uuid.uuid4().hex}.txt"]
    for path in foreign:
        path.write_bytes(b"not the store's")
    (tmp / "a-directory").mkdir()
    Store.open(store.root).gc(grace_s=0)
    assert not ours.exists()
    assert all(path.exists() for path in foreign) and (tmp / "a-directory").is_dir()


def test_writer_streams_and_an_aborted_writer_leaves_nothing(tmp_path):
    store = Store(tmp_path / "s")
    with store.writer() as writer:
        for part in (b"a" * 1000, b"b" * 5000):
            writer.write(part)
        digest = writer.commit()
    assert digest == sha(b"a" * 1000 + b"b" * 5000)
    with pytest.raises(RuntimeError), store.writer() as writer:
        writer.write(b"half")
        raise RuntimeError("crash while writing")
    assert os.listdir(store.root / "tmp") == []
    assert list(store.objects()) == [digest]


def test_adopt_moves_a_file_in_without_copying(tmp_path):
    store = Store(tmp_path / "s")
    source = tmp_path / "pages-1.img"
    source.write_bytes(os.urandom(1 << 20))
    inode = source.stat().st_ino
    expected = sha(source.read_bytes())
    digest = store.adopt(source)
    assert digest == expected and not source.exists()
    assert os.stat(store.path(digest)).st_ino == inode  # the same file, not a copy
    assert stat.S_IMODE(os.stat(store.path(digest)).st_mode) == 0o600
    kept = tmp_path / "kept.img"
    kept.write_bytes(b"keep me")
    digest = store.adopt(kept, keep_original=True)
    assert kept.exists() and os.stat(store.path(digest)).st_ino == kept.stat().st_ino


def test_adopt_refuses_another_filesystem_and_symlinks(tmp_path):
    store = Store(tmp_path / "s")
    link = tmp_path / "link"
    target = tmp_path / "target"
    target.write_bytes(b"x")
    link.symlink_to(target)
    with pytest.raises(StoreError, match="symlink"):
        store.adopt(link)
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to adopt from")
    other = shm / f"coldsnap-test-{os.getpid()}"
    other.write_bytes(b"elsewhere")
    try:
        with pytest.raises(StoreError, match="another filesystem"):
            store.adopt(other)
        assert other.exists()
    finally:
        other.unlink()


def test_symlinks_inside_the_store_are_refused(tmp_path):
    store = Store(tmp_path / "s")
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    fake = sha(b"secret")
    hexdigest = fake.removeprefix("sha256:")
    (store.root / "objects" / "sha256" / hexdigest[:2]).mkdir(mode=0o700)
    (store.root / "objects" / "sha256" / hexdigest[:2] / hexdigest[2:]).symlink_to(outside)
    with pytest.raises(StoreError, match="symlink"):
        store.read_bytes(fake)
    with pytest.raises(StoreError, match="symlink"):
        store.has(fake)
    report = store.verify()
    assert not report.ok and any("symlink" in why for _, why in report.bad)
    with pytest.raises(StoreError, match="symlink"):
        store.gc(grace_s=0)
    (store.root / "tags" / "evil").symlink_to(outside)
    with pytest.raises(StoreError, match="symlink"):
        store.resolve("evil")
    linked_root = tmp_path / "linked"
    linked_root.symlink_to(store.root)
    with pytest.raises(StoreError, match="symlink"):
        Store(linked_root)


def test_verify_catches_corruption(tmp_path):
    store = Store(tmp_path / "s")
    good = store.put_bytes(b"good bytes")
    bad = store.put_bytes(os.urandom(100_000))
    assert store.verify().ok
    flip_byte(store.path(bad), 50_000)
    report = store.verify()
    assert report.checked == 2 and [d for d, _ in report.bad] == [bad]
    with pytest.raises(IntegrityError, match="corrupt"):
        store.verify_object(bad)
    with pytest.raises(IntegrityError):
        store.read_bytes(bad)
    store.verify_object(good)


def test_publish_checks_members_and_is_all_or_nothing(tmp_path, monkeypatch):
    store = Store(tmp_path / "s")
    present = store.put_bytes(b"present")
    missing = sha(b"never written")
    with pytest.raises(StoreError, match="missing"):
        store.publish(
            Capsule(members=(Member("pack", "a", present, 7), Member("pack", "b", missing, 3))),
            tag="x",
        )
    with pytest.raises(StoreError, match="size"):
        store.publish(Capsule(members=(Member("pack", "a", present, 8),)))
    assert store.capsules() == [] and store.tags() == {}

    real = _atomic.durable_replace

    def crash(tmp, final):
        if final.parent.name == "capsules":
            raise OSError("power cut")
        real(tmp, final)

    monkeypatch.setattr(_atomic, "durable_replace", crash)
    with pytest.raises(OSError, match="power cut"):
        store.publish(Capsule(members=(Member("pack", "a", present, 7),)), tag="x")
    assert store.capsules() == [] and store.tags() == {}
    assert os.listdir(store.root / "tmp") == []  # the marker's temporary file is gone too
    monkeypatch.setattr(_atomic, "durable_replace", real)
    digest = store.publish(Capsule(members=(Member("pack", "a", present, 7),)), tag="x")
    assert store.capsules() == [digest] and store.resolve("x") == digest


def test_readers_never_see_a_partial_capsule(tmp_path):
    store = Store(tmp_path / "s")
    stop = threading.Event()
    seen: list[int] = []
    problems: list[str] = []

    def reader() -> None:
        reader_store = Store(store.root)
        while not stop.is_set():
            for digest in reader_store.capsules():
                capsule = reader_store.capsule(digest)
                for member in capsule.members:
                    if not reader_store.has(member.digest):
                        problems.append(f"{digest}: {member.name} missing")
                    elif reader_store.size(member.digest) != member.size:
                        problems.append(f"{digest}: {member.name} short")
                seen.append(len(capsule.members))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(15):
            blobs = {f"part-{j}": os.urandom(4096 * (j + 1)) + bytes([i]) for j in range(4)}
            store.publish(capsule_of(store, blobs), tag=f"cap-{i}")
    finally:
        stop.set()
        thread.join()
    assert problems == []
    assert seen and set(seen) == {4}
    assert len(store.capsules()) == 15


def test_gc_removes_only_unreferenced_objects(tmp_path):
    store = Store(tmp_path / "s")
    keep = capsule_of(store, {"a": b"alpha", "b": b"beta"})
    keep_digest = store.publish(keep, tag="keep")
    drop = capsule_of(store, {"c": b"gamma"})
    drop_digest = store.publish(drop, tag="drop")
    loose = store.put_bytes(b"never published")
    stale = store.root / "tmp" / f"{uuid.uuid4().hex}.part"
    stale.write_bytes(b"half a write")

    young = store.gc()  # default grace: nothing young is touched
    assert young.removed == () and stale.exists()

    report = store.gc(grace_s=0)
    assert report.removed == (loose,)
    assert not stale.exists()
    store.unpublish("drop")
    assert store.tags() == {"keep": keep_digest}
    report = store.gc(grace_s=0)
    assert set(report.removed) == {drop_digest, sha(b"gamma")}
    assert report.freed_bytes == len(b"gamma") + len(to_json(drop))
    assert set(store.objects()) == {keep_digest, sha(b"alpha"), sha(b"beta")}
    assert store.verify().ok and store.capsule("keep") == keep


def test_gc_unpublishes_untagged_capsules_only_when_asked(tmp_path):
    store = Store(tmp_path / "s")
    earlier = store.publish(capsule_of(store, {"a": b"first", "b": b"shared"}), tag="tiny")
    current = store.publish(capsule_of(store, {"a": b"second", "b": b"shared"}), tag="tiny")
    kept = store.gc(grace_s=0)  # the Python API keeps untagged capsules unless told
    assert kept.unpublished == () and set(store.capsules()) == {earlier, current}
    served = store.gc(grace_s=0, untagged=True, in_use=[earlier])
    assert served.in_use_capsules == (earlier,) and earlier in store.capsules()
    report = store.gc(grace_s=0, untagged=True)
    assert report.unpublished == (earlier,)
    assert set(report.removed) == {earlier, sha(b"first")}
    assert store.capsules() == [current] and store.has(sha(b"shared"))
    assert report.reached.count == 3 and report.young.count == 0
    assert store.verify().ok


def test_remove_frees_only_what_no_other_capsule_uses(tmp_path):
    store = Store(tmp_path / "s")
    gone = store.publish(capsule_of(store, {"a": b"mine", "b": b"shared"}), tag="gone")
    store.publish(capsule_of(store, {"b": b"shared"}), tag="stays")
    done = store.remove("gone")
    assert done.tags == ("gone",) and done.digest == gone
    assert set(done.freed) == {gone, sha(b"mine")}
    assert done.shared.count == 1 and store.has(sha(b"shared"))
    assert store.tags().keys() == {"stays"} and store.verify().ok


def test_open_tells_a_missing_store_from_a_file(tmp_path):
    with pytest.raises(StoreError, match="it does not exist"):
        Store.open(tmp_path / "nowhere")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreError, match="not a directory"):
        Store.open(tmp_path / "file")


def test_gc_fails_closed_on_an_unreadable_manifest(tmp_path):
    store = Store(tmp_path / "s")
    digest = store.publish(capsule_of(store, {"a": b"alpha"}))
    loose = store.put_bytes(b"loose")
    flip_byte(store.path(digest), 3)
    with pytest.raises(StoreError, match="gc refused"):
        store.gc(grace_s=0)
    assert store.has(loose)


def test_tags_name_capsules(tmp_path):
    store = Store(tmp_path / "s")
    first = store.publish(capsule_of(store, {"a": b"1"}), tag="tiny-llama")
    second = store.publish(capsule_of(store, {"a": b"2"}))
    assert store.resolve("tiny-llama") == first
    assert store.resolve(second) == second
    store.tag("tiny-llama", second)
    assert store.capsule("tiny-llama").members[0].digest == sha(b"2")
    for bad in ("../etc", "/abs", "a/b", "", "sha256:" + "0" * 64, "-dash"):
        with pytest.raises(StoreError):
            store.tag(bad, second)
    with pytest.raises(StoreError, match="no published capsule"):
        store.resolve(sha(b"not a capsule"))
    with pytest.raises(StoreError, match="no tag"):
        store.resolve("unknown")
    store.untag("tiny-llama")
    assert store.tags() == {}


def test_a_tampered_manifest_is_refused_on_read(tmp_path):
    store = Store(tmp_path / "s")
    digest = store.publish(capsule_of(store, {"a": b"alpha"}), tag="t")
    flip_byte(store.path(digest), 10)
    with pytest.raises(IntegrityError):
        store.capsule("t")


_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from coldsnap.artifacts import Store
    root, start, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = Store(root)
    shared = bytes(range(256)) * (64 << 12)          # 64 MiB, the same in both processes
    own = os.urandom(1 << 20) + bytes([seed])
    while not os.path.exists(start):
        time.sleep(0.001)
    digests = [store.put_bytes(shared) for _ in range(3)] + [store.put_bytes(own)]
    print(" ".join(digests))
    """
)


def test_two_processes_writing_the_same_object_are_safe(tmp_path):
    root = tmp_path / "s"
    Store(root)
    start = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root), str(start), str(seed)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    start.write_text("go")
    outputs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    shared = bytes(range(256)) * (64 << 12)
    assert {out[0] for out in outputs} == {sha(shared)}
    store = Store(root)
    assert set(store.objects()) == {sha(shared), outputs[0][3], outputs[1][3]}
    assert store.verify().ok
    assert os.listdir(root / "tmp") == []


_names = st.one_of(
    st.sampled_from(["..", "../x", "/abs/path", "a//b", "./a", "a/../b", "a\\b", "", "a/./b"]),
    st.text(alphabet="ab/.\\\0 ", min_size=1, max_size=8),
)


# An "extra" key that is a member's own field replaces that field instead of adding one.
_MEMBER_FIELDS = ("role", "name", "digest", "size")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    damage=st.one_of(
        st.tuples(st.just("name"), _names),
        st.tuples(st.just("digest"), st.text(max_size=70)),
        st.tuples(st.just("size"), st.one_of(st.integers(max_value=-1), st.text(max_size=3))),
        st.tuples(st.just("duplicate"), st.none()),
        st.tuples(
            st.just("extra"),
            st.text(min_size=1, max_size=5).filter(lambda k: k not in _MEMBER_FIELDS),
        ),
        st.tuples(st.just("kind"), st.text(max_size=10)),
        st.tuples(st.just("format"), st.integers().filter(lambda n: n != 1)),
    )
)
def test_damaged_capsule_manifests_are_refused(damage):
    what, value = damage
    good = {"role": "pack", "name": "weights/a.pack", "digest": sha(b"x"), "size": 1}
    data = json.loads(to_json(Capsule(members=(Member(**good),))))
    member = data["members"][0]
    if what == "name":
        if member_name_problem(value) is None:
            return
        member["name"] = value
    elif what == "digest":
        if digest_problem(value) is None:
            return
        member["digest"] = value
    elif what == "size":
        member["size"] = value
    elif what == "duplicate":
        data["members"].append(dict(member, digest=sha(b"y")))
    elif what == "extra":
        member[value] = 1
    elif what == "kind":
        if value == "coldsnap.capsule":
            return
        data["kind"] = value
    else:
        data["format"] = value
    with pytest.raises(RecordError) as info:
        from_json(data, Capsule)
    assert str(info.value).startswith("coldsnap.capsule: ")
    named = {
        "name": "members[0].name",
        "digest": "members[0].digest",
        "size": "members[0].size",
        "duplicate": "members",
        "extra": "members[0]",
        "kind": "kind",
        "format": "format",
    }
    assert info.value.fields == (named[what],), str(info.value)


# -- verify sees what is missing or stray; gc and publish fail clearly -----------------------------


def _published(tmp_path: Path) -> tuple[Store, str, Capsule]:
    store = Store(tmp_path / "s")
    capsule = capsule_of(store, {"a": b"alpha", "b": b"beta"})
    return store, store.publish(capsule, tag="cap"), capsule


def _bad(store: Store) -> str:
    report = store.verify()
    assert not report.ok
    return "\n".join(f"{where}: {why}" for where, why in report.bad)


def test_verify_reports_a_missing_member_object(tmp_path):
    store, _, capsule = _published(tmp_path)
    store.path(capsule.members[0].digest).unlink()
    assert "member 'a'" in _bad(store) and "missing" in _bad(store)


def test_verify_reports_a_missing_manifest_object(tmp_path):
    store, digest, _ = _published(tmp_path)
    store.path(digest).unlink()
    assert digest in _bad(store) and "manifest" in _bad(store)


def test_verify_reports_a_stray_file_in_a_shard(tmp_path):
    store, _, capsule = _published(tmp_path)
    shard = store.path(capsule.members[0].digest).parent
    (shard / "not-an-object").write_bytes(b"x")
    assert "not-an-object" in _bad(store)


def test_verify_reports_a_garbage_tag_file(tmp_path):
    store, _, _ = _published(tmp_path)
    (store.root / "tags" / "cap").write_bytes(b"\x00garbage")
    assert "tag 'cap'" in _bad(store)


def test_verify_reports_a_tag_naming_no_capsule(tmp_path):
    store, digest, _ = _published(tmp_path)
    (store.root / "capsules" / digest.removeprefix("sha256:")).unlink()
    assert "tag 'cap'" in _bad(store)


def test_gc_leaves_a_directory_in_tmp_alone(tmp_path):
    store, _, _ = _published(tmp_path)
    stale = store.root / "tmp" / "leftover"
    (stale / "deeper").mkdir(parents=True)
    (stale / "deeper" / "f").write_bytes(b"x")
    store.gc(grace_s=0)  # the store writes no directory there: not its own to remove
    assert (stale / "deeper" / "f").read_bytes() == b"x"
    assert store.verify().ok


def test_a_member_name_segment_over_255_characters_is_refused(tmp_path):
    long = "a" * 256
    assert "255" in (member_name_problem(f"image/{long}") or "")
    assert member_name_problem("image/" + "a" * 255) is None
    with pytest.raises((RecordError, ValueError), match="255"):
        Member("process-image", f"image/{long}", sha(b"x"), 1)


_STORE_DIRS = ["", "objects", "objects/sha256", "capsules", "tags", "tmp", "locks"]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_damaged_store_layout_is_reported_never_crashes(tmp_path_factory, data):
    """Damage of any kind to a store: verify reports, gc and reads fail closed with a StoreError
    or RecordError, never a raw OSError or KeyError."""
    from coldsnap.artifacts import ArtifactError

    store, digest, _ = _published(tmp_path_factory.mktemp("store"))
    files = sorted(p for p in store.root.rglob("*") if p.is_file() and "locks" not in p.parts)
    how = data.draw(st.sampled_from(["garbage", "truncate", "remove", "dir", "fifo", "file"]))
    if how in ("garbage", "truncate", "remove"):
        victim = data.draw(st.sampled_from(files))
        if how == "garbage":
            victim.write_bytes(data.draw(st.binary(max_size=64)))
        elif how == "truncate":
            victim.write_bytes(victim.read_bytes()[: data.draw(st.integers(0, 5))])
        else:
            victim.unlink()
    else:
        where = store.root / data.draw(
            st.sampled_from([*_STORE_DIRS, "objects/sha256/" + digest[7:9]])
        )
        name = data.draw(st.text("abcdef0123456789xyz.-", min_size=1, max_size=70))
        target = where / name
        if target.exists():
            return
        if how == "dir":
            target.mkdir()
        elif how == "fifo":
            os.mkfifo(target)
        else:
            target.write_bytes(b"stray")
    store = Store(store.root)
    report = store.verify()
    assert isinstance(report.ok, bool)
    for action in (lambda: store.capsule("cap"), lambda: store.gc(grace_s=0), store.tags):
        with contextlib.suppress(ArtifactError):
            action()
