"""Sealing at disk/CPU speed: `Store.take` reads each byte once for the object's name
and its block digests (moving a file on the store's filesystem, copying one from elsewhere in
the kernel first), and the seal takes many files at once. What the store guarantees stays:
objects named by the sha256 of their bytes, block digests as a separate pass would compute
them, the same capsule for the same capture, a failed take gives the file back."""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coldsnap.artifacts import Store, StoreError
from coldsnap.artifacts import _store as store_module
from coldsnap.capsules import _steps
from coldsnap.capsules._verified import VerifiedObjects
from coldsnap.machine import InstalledBuild
from coldsnap.machine import steps as s

from .test_store_steps import Ctx, Engine, _capture_request

BLOCK = 4096


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blocks(data: bytes, block: int) -> tuple[str, ...]:
    return tuple(
        hashlib.sha256(data[i : i + block]).hexdigest() for i in range(0, len(data), block)
    )


def _other_filesystem(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to copy from")
    return shm


@pytest.mark.parametrize("size", [0, 1, BLOCK - 1, BLOCK, 3 * BLOCK + 5])
@pytest.mark.parametrize("helpers", [False, True], ids=["in-turn", "helpers"])
def test_take_moves_a_file_in_and_hashes_it_whole_and_by_block(
    tmp_path: Path, size: int, helpers: bool
) -> None:
    store = Store(tmp_path / "s")
    data = os.urandom(size)
    source = tmp_path / "pages-1.img"
    source.write_bytes(data)
    inode = source.stat().st_ino
    with ThreadPoolExecutor(3) as pool:
        taken = store.take(source, block_bytes=BLOCK, helpers=pool if helpers else None)
    assert (taken.digest, taken.size, taken.blocks) == (_sha(data), size, _blocks(data, BLOCK))
    assert not source.exists() and store.path(taken.digest).stat().st_ino == inode  # moved
    assert taken.hashed is not None and taken.hashed.st_ino == inode
    assert store.read_bytes(taken.digest) == data
    assert os.listdir(store.root / "tmp") == []


def test_take_fsyncs_on_its_own_pool_while_it_hashes(tmp_path: Path, monkeypatch) -> None:
    """A slow fsync (GBs of writeback) holds up neither the block hashes nor the read: it runs
    on `syncs`, and the object is renamed in only after it ended."""
    store = Store(tmp_path / "s")
    source = tmp_path / "pages-1.img"
    source.write_bytes(os.urandom(6 * BLOCK))
    hashing_done = threading.Event()
    synced_after_hash: list[bool] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        synced_after_hash.append(hashing_done.wait(timeout=5))  # in turn, it would wait in vain
        real_fsync(fd)

    real_one_pass = store_module._one_pass

    def one_pass(*args: Any) -> Any:
        out = real_one_pass(*args)
        hashing_done.set()
        assert list(store.objects()) == []  # not installed before its fsync ended
        return out

    monkeypatch.setattr(os, "fsync", slow_fsync)
    monkeypatch.setattr(store_module, "_one_pass", one_pass)
    with ThreadPoolExecutor(1) as helpers, ThreadPoolExecutor(1) as syncs:
        taken = store.take(source, block_bytes=BLOCK, helpers=helpers, syncs=syncs)
    assert synced_after_hash[0] is True and store.has(taken.digest)


def test_take_without_blocks_names_the_object_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    source = tmp_path / "x.pack"
    source.write_bytes(b"pack" * 5000)
    taken = store.take(source)
    assert (taken.digest, taken.blocks) == (_sha(b"pack" * 5000), ())


@pytest.mark.parametrize("blocks", [None, BLOCK])
def test_take_copies_a_file_from_another_filesystem(tmp_path: Path, blocks: int | None) -> None:
    shm = _other_filesystem(tmp_path)
    store = Store(tmp_path / "s")
    data = os.urandom(5 * BLOCK + 17)
    source = shm / f"coldsnap-seal-test-{os.getpid()}"
    source.write_bytes(data)
    try:
        with ThreadPoolExecutor(2) as pool:
            taken = store.take(source, block_bytes=blocks, helpers=pool)
        assert taken.digest == _sha(data) and store.read_bytes(taken.digest) == data
        assert taken.blocks == (_blocks(data, BLOCK) if blocks else ())
        assert source.read_bytes() == data  # a copy leaves the source where it was
        assert store.path(taken.digest).stat().st_dev != source.stat().st_dev
        assert os.listdir(store.root / "tmp") == []
    finally:
        source.unlink()


def test_a_copy_falls_back_to_a_buffer_where_sendfile_is_refused(
    tmp_path: Path, monkeypatch
) -> None:
    import errno

    shm = _other_filesystem(tmp_path)
    store = Store(tmp_path / "s")
    data = os.urandom(3 * BLOCK + 1)
    source = shm / f"coldsnap-seal-test-nosendfile-{os.getpid()}"
    source.write_bytes(data)

    def refused(*args: Any) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "sendfile", refused)
    try:
        taken = store.take(source, block_bytes=BLOCK)
        assert store.read_bytes(taken.digest) == data and taken.blocks == _blocks(data, BLOCK)
    finally:
        source.unlink()


def test_a_move_refused_across_mounts_is_a_copy(tmp_path: Path, monkeypatch) -> None:
    """Two mounts of one filesystem share a device number, yet rename refuses (EXDEV)."""
    import errno

    store = Store(tmp_path / "s")
    source = tmp_path / "pages-1.img"
    data = os.urandom(2 * BLOCK + 9)
    source.write_bytes(data)
    real = os.rename

    def across_mounts(src: Any, dst: Any) -> None:
        if str(dst).endswith(".adopt"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real(src, dst)

    monkeypatch.setattr(os, "rename", across_mounts)
    taken = store.take(source, block_bytes=BLOCK)
    assert (taken.digest, taken.blocks) == (_sha(data), _blocks(data, BLOCK))
    assert source.read_bytes() == data and os.listdir(store.root / "tmp") == []


def test_taking_bytes_the_store_holds_keeps_its_object(tmp_path: Path) -> None:
    """The second equal file is not the object: its inode was hashed, not the object's, so
    nothing may be remembered as verified for it."""
    store = Store(tmp_path / "s")
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(b"same" * 100)
    first = store.take(tmp_path / "a", block_bytes=BLOCK)
    object_inode = store.path(first.digest).stat().st_ino
    again = store.take(tmp_path / "b", block_bytes=BLOCK)
    assert again.digest == first.digest and again.blocks == first.blocks
    assert first.hashed is not None and again.hashed is None
    assert store.path(first.digest).stat().st_ino == object_inode
    assert os.listdir(store.root / "tmp") == []


@pytest.mark.parametrize("helpers", [False, True], ids=["in-turn", "helpers"])
def test_a_failed_take_gives_the_file_back(tmp_path: Path, monkeypatch, helpers: bool) -> None:
    store = Store(tmp_path / "s")
    data = os.urandom(4 * BLOCK)
    source = tmp_path / "pages-1.img"
    source.write_bytes(data)

    def broken(data: memoryview) -> str:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store_module, "_sha256_hex", broken)
    with ThreadPoolExecutor(2) as pool, pytest.raises(OSError, match="Input/output"):
        store.take(source, block_bytes=BLOCK, helpers=pool if helpers else None)
    assert source.read_bytes() == data
    assert os.listdir(store.root / "tmp") == [] and list(store.objects()) == []


def test_take_refuses_symlinks_and_bad_block_sizes(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(StoreError, match="symlinks are refused"):
        store.take(tmp_path / "link")
    with pytest.raises(StoreError, match="block_bytes: 0 is not a positive"):
        store.take(tmp_path / "target", block_bytes=0)
    assert (tmp_path / "target").read_bytes() == b"x"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(size=st.integers(0, 9 * 512 + 3), block=st.sampled_from([512, 1024, 4096]))
def test_take_agrees_with_a_separate_pass(tmp_path: Path, size: int, block: int) -> None:
    store = Store(tmp_path / "s")
    data = os.urandom(size)
    source = tmp_path / f"f-{size}-{block}"
    source.write_bytes(data)
    with ThreadPoolExecutor(2) as pool:
        taken = store.take(source, block_bytes=block, helpers=pool)
    assert (taken.digest, taken.size, taken.blocks) == (_sha(data), size, _blocks(data, block))


# -- the seal step ---------------------------------------------------------------------------


@pytest.fixture
def blocks_of_4k(monkeypatch) -> int:
    from coldsnap.artifacts import _capsule

    monkeypatch.setattr(_capsule, "BLOCK_BYTES", BLOCK)
    monkeypatch.setattr(_steps, "BLOCK_BYTES", BLOCK)
    return BLOCK


IMAGE = {"pages-1.img": 9 * BLOCK + 3, "core-1.img": 700, "sub/pages-2.img": 2 * BLOCK}
PAYLOAD = {"tp0/weights/index.json": 40, "tp0/weights/ab.pack": 6 * BLOCK + 1}


def _seal(root: Path, model: Path, verified: VerifiedObjects | None = None) -> tuple[Ctx, dict]:
    """Seals an image and a payload of random bytes (seeded by name: two roots hold the same
    capture); returns the step context and each file's bytes by member name."""
    import random

    written: dict[str, bytes] = {}
    facts: dict[str, Any] = {}
    for fact, prefix, files in ((s.IMAGE_DIR, "image", IMAGE), (s.PAYLOAD_DIR, "payload", PAYLOAD)):
        for name, size in files.items():
            path = root / "op" / prefix / name
            path.parent.mkdir(parents=True, exist_ok=True)
            written[f"{prefix}/{name}"] = random.Random(name).randbytes(size)
            path.write_bytes(written[f"{prefix}/{name}"])
        facts[fact.name] = str(root / "op" / prefix)
    ctx = Ctx(_capture_request(root, model), root / "op", facts, s.SEAL)
    ctx.facts.update(_steps.StoreArtifacts(Engine(), verified).seal(ctx))
    return ctx, written


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"w" * 1000)
    return path


def test_seal_members_are_what_separate_passes_would_make(
    tmp_path: Path, model: Path, blocks_of_4k: int
) -> None:
    _, written = _seal(tmp_path / "a", model)
    capsule = Store(tmp_path / "a" / "store").capsule("cap")
    members = [m for m in capsule.members if m.role != "record"]
    assert [m.name for m in members] == sorted(n for n in written if n.startswith("image/")) + (
        sorted(n for n in written if n.startswith("payload/"))
    )  # image first, then payload, each by path: the order a capsule always listed
    for member in members:
        data = written[member.name]
        assert (member.digest, member.size) == (_sha(data), len(data))
        image = member.name.startswith("image/")
        assert member.blocks == (_blocks(data, BLOCK) if image else ())


def test_the_same_capture_seals_to_the_same_capsule(
    tmp_path: Path, model: Path, blocks_of_4k: int, monkeypatch
) -> None:
    """Files sealed in any order on any thread: the capsule digest stays the same."""
    monkeypatch.setattr(_steps, "VERIFY_THREADS", 4)
    first, _ = _seal(tmp_path / "a", model)
    second, _ = _seal(tmp_path / "b", model)
    assert first.facts[s.CAPSULE_DIGEST.name] == second.facts[s.CAPSULE_DIGEST.name]


def test_seal_reads_each_byte_once_on_several_threads(
    tmp_path: Path, model: Path, blocks_of_4k: int, monkeypatch
) -> None:
    """No second pass for the blocks (the admit's block hasher is not called) and no byte read
    twice; the files are taken on several seal threads, the model hashed beside them."""
    monkeypatch.setattr(_steps, "VERIFY_THREADS", 4)
    reads: list[tuple[str, int]] = []
    lock = threading.Lock()
    real_read = store_module._read_full

    def counting(fd: int, view: memoryview, offset: int) -> int:
        n = real_read(fd, view, offset)
        with lock:
            reads.append((threading.current_thread().name, n))
        return n

    def no_second_pass(path: Path, block: int) -> str:
        raise AssertionError("the seal hashed a block in a second pass")

    hashed_on: list[str] = []
    real_digests = _steps.checkpoint_digests

    def spy(path: Any) -> Any:
        hashed_on.append(threading.current_thread().name)
        return real_digests(path)

    monkeypatch.setattr(store_module, "_read_full", counting)
    monkeypatch.setattr(_steps, "_hash_block", no_second_pass)
    monkeypatch.setattr(_steps, "checkpoint_digests", spy)
    _, written = _seal(tmp_path, model)
    assert sum(n for _, n in reads) == sum(len(d) for d in written.values())
    threads = {name.rsplit("_", 1)[0] for name, _ in reads}
    assert threads == {"coldsnap-seal"}
    assert len({name for name, _ in reads}) > 1
    assert len(hashed_on) == 1 and hashed_on[0].startswith("coldsnap-seal-side")


def test_the_first_admit_after_a_seal_hashes_nothing_it_hashed(
    tmp_path: Path, model: Path, blocks_of_4k: int, monkeypatch
) -> None:
    """The seal's one pass counts as verification of the image objects it moved in (an hour
    old, so their mtime is settled); the admit then hashes no block of them."""
    old = 1_700_000_000
    real_take = Store.take

    def aged(self: Store, path: Any, **kw: Any) -> Any:
        os.utime(path, (old, old))
        return real_take(self, path, **kw)

    monkeypatch.setattr(Store, "take", aged)
    verified = VerifiedObjects(tmp_path / "verified")
    _seal(tmp_path, model, verified)
    hashed: list[int] = []
    monkeypatch.setattr(_steps, "_hash_block", lambda path, block: hashed.append(block) or "")
    from .test_store_steps import _restore_request

    admit = Ctx(_restore_request(tmp_path), tmp_path / "res", {}, s.ADMIT)
    _steps.StoreArtifacts(Engine(), verified).admit(admit)
    assert hashed == []


def test_a_seal_that_fails_on_one_file_publishes_nothing(
    tmp_path: Path, model: Path, blocks_of_4k: int, monkeypatch
) -> None:
    real_take = Store.take

    def failing(self: Store, path: Any, **kw: Any) -> Any:
        if Path(path).name == "core-1.img":
            raise StoreError(f"cannot read {path}")
        return real_take(self, path, **kw)

    monkeypatch.setattr(Store, "take", failing)
    with pytest.raises(StoreError, match=r"core-1\.img"):
        _seal(tmp_path, model)
    store = Store(tmp_path / "store")
    assert store.capsules() == [] and store.tags() == {}
    assert (tmp_path / "op" / "image" / "core-1.img").exists()


def test_the_engine_build_is_taken_on_the_caller_s_thread_while_the_files_are_sealed(
    tmp_path: Path, model: Path, monkeypatch
) -> None:
    """A first build imports the engine (seconds on a GPU orchestrator): it overlaps the
    hashing, yet stays on the thread that called seal, where imports belong."""
    caller = threading.current_thread()
    built_on: list[threading.Thread] = []
    overlapped: list[bool] = []
    building = threading.Event()
    real_take = Store.take

    def take(self: Store, path: Any, **kw: Any) -> Any:
        overlapped.append(building.wait(timeout=5))  # a seal in turn would wait in vain
        return real_take(self, path, **kw)

    class SlowEngine(Engine):
        def build(self) -> InstalledBuild:
            building.set()
            built_on.append(threading.current_thread())
            return super().build()

    monkeypatch.setattr(Store, "take", take)
    root = tmp_path / "x"
    image = root / "op" / "image"
    image.mkdir(parents=True)
    (image / "pages-1.img").write_bytes(b"p" * 5000)
    ctx = Ctx(_capture_request(root, model), root / "op", {s.IMAGE_DIR.name: str(image)}, s.SEAL)
    _steps.StoreArtifacts(SlowEngine()).seal(ctx)
    assert built_on == [caller] and overlapped == [True]
