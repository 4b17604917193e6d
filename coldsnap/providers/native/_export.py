"""Export: write each final storage of a model once, 4 KiB-aligned, into pack files, and an index
that names every alias. Packs go to an export directory or straight into a store (hashed while
written, so a multi-GB pack is never read back to be named)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash
from attrs import frozen

from coldsnap._atomic import durable_replace, write_bytes_atomic
from coldsnap.artifacts import DIGEST_PREFIX, ObjectWriter, Store

from .._convert import dumps
from .._layout import StorageGroup, Tensors, as_mapping, group_storages, layout_digest
from . import _cuda
from ._index import ALIGNMENT, Extent, PackFile, PackIndex
from ._source import INDEX_NAME, pack_file_name

DEFAULT_BLOCK_BYTES = 8 << 20
# Packs of about 1 GiB: each is written and hashed on its own thread (a pack's sha256 is one
# sequential stream, 1.5-2 GB/s per core), and a store hashes each object apart again at seal.
DEFAULT_PACK_BYTES = 1 << 30
DEFAULT_THREADS = 8
_ZEROS = bytes(ALIGNMENT)


@frozen
class ExportResult:
    """What `export_pack` wrote: the index, and where (a store's index digest or a directory)."""

    index: PackIndex
    index_digest: str | None
    directory: Path | None
    seconds: float

    @property
    def nbytes(self) -> int:
        return self.index.nbytes


def _directory_writer(directory: Path) -> ObjectWriter:
    """A pack file in an export directory, hashed while written, named by its digest."""

    def install(tmp: Path, digest: str) -> None:
        durable_replace(tmp, directory / pack_file_name(digest))

    return ObjectWriter(directory / f".part-{uuid.uuid4().hex}", install)


def export_pack(
    tensors: Tensors,
    target: Store | str | os.PathLike[str],
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    pack_bytes: int = DEFAULT_PACK_BYTES,
    threads: int = DEFAULT_THREADS,
) -> ExportResult:
    """Writes the final storages of `tensors` (a module: its parameters and persistent buffers;
    or a name -> tensor mapping, e.g. from an engine's weight registry) as packs plus an index.

    `target` is a Store (packs and index become objects; `index_digest` names the index) or a
    directory (created if absent; `index.json` and `<sha256>.pack` files; must not hold an
    index already). Each storage is written once however many names alias it. Packs are
    written by up to `threads` threads at once, each pack by one."""
    if block_bytes <= 0 or block_bytes % ALIGNMENT:
        raise ValueError(f"block_bytes: {block_bytes} is not a positive multiple of 4096")
    start = time.perf_counter()
    groups = group_storages(as_mapping(tensors))
    directory = None if isinstance(target, Store) else Path(target)
    if directory is not None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if (directory / INDEX_NAME).exists():
            raise FileExistsError(f"{directory} already holds a pack index")

    def new_writer() -> ObjectWriter:
        if isinstance(target, Store):
            return target.writer()
        assert directory is not None
        return _directory_writer(directory)

    batches = list(_batches(groups, pack_bytes))

    def write_pack(batch: list[StorageGroup]) -> tuple[PackFile, list[Extent]]:
        on_cuda = [g.device for g in batch if g.device.type == "cuda"]
        if on_cuda:  # a new thread's current device is 0: no context on GPU 0 for rank r
            _cuda.use_device(on_cuda[0])
        writer = new_writer()
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="coldsnap-export-hash") as hasher:
                offset = 0
                written: list[tuple[StorageGroup, int, str, tuple[str, ...]]] = []
                for group in batch:
                    pad = -offset % ALIGNMENT
                    writer.write(_ZEROS[:pad])
                    offset += pad
                    sha, checksums = _write_storage(group, writer, block_bytes, hasher)
                    written.append((group, offset, sha, checksums))
                    offset += group.nbytes
            digest = writer.commit()
        except BaseException:
            writer.abort()
            raise
        extents = [
            Extent(views=g.views, nbytes=g.nbytes, pack=digest, offset=o, sha256=s, checksums=c)
            for g, o, s, c in written
        ]
        return PackFile(digest=digest, size=offset), extents

    workers = max(1, min(threads, len(batches)))
    with ThreadPoolExecutor(workers, thread_name_prefix="coldsnap-export") as pool:
        futures = [pool.submit(write_pack, batch) for batch in batches]
        results = [f.result() for f in futures]  # the first failure raises, after all ended
    packs = [pack for pack, _ in results]
    extents = [extent for _, pack_extents in results for extent in pack_extents]
    index = PackIndex(
        packs=tuple(packs),
        extents=tuple(extents),
        layout_digest=layout_digest(groups),
        block_bytes=block_bytes,
    )
    data = dumps(index)
    index_digest = None
    if isinstance(target, Store):
        index_digest = target.put_bytes(data)
    else:
        assert directory is not None
        write_bytes_atomic(directory / INDEX_NAME, data)
    return ExportResult(index, index_digest, directory, time.perf_counter() - start)


def _batches(groups: list[StorageGroup], pack_bytes: int) -> Iterator[list[StorageGroup]]:
    """Groups storages into packs of at most `pack_bytes` (a larger storage gets its own)."""
    batch: list[StorageGroup] = []
    size = 0
    for group in groups:
        aligned = -(-group.nbytes // ALIGNMENT) * ALIGNMENT
        if batch and size + aligned > pack_bytes:
            yield batch
            batch, size = [], 0
        batch.append(group)
        size += aligned
    if batch or not groups:
        yield batch


def _write_storage(
    group: StorageGroup, writer: ObjectWriter, block_bytes: int, hasher: ThreadPoolExecutor
) -> tuple[str, tuple[str, ...]]:
    """Writes one storage block by block; the extent's sha256 and block checksums are computed
    on a second thread while the pack writer hashes and writes the same block."""
    sha = hashlib.sha256()
    checksums: list[str] = []

    def digest_block(block: memoryview) -> None:
        sha.update(block)
        h = xxhash.xxh3_64()
        h.update(block)
        checksums.append(h.hexdigest())

    for block in _storage_blocks(group, block_bytes):
        pending = hasher.submit(digest_block, block)
        writer.write(block)
        pending.result()
    return DIGEST_PREFIX + sha.hexdigest(), tuple(checksums)


def _storage_blocks(group: StorageGroup, block_bytes: int) -> Iterator[memoryview]:
    """The storage's bytes as host memory, one block at a time (zero-copy on CPU; through a
    pinned buffer for CUDA storages)."""
    nbytes = group.nbytes
    if not nbytes:
        return
    if group.device.type == "cpu":
        raw = (ctypes.c_char * nbytes).from_address(group.data_ptr())
        view = memoryview(raw).cast("B")
        for start in range(0, nbytes, block_bytes):
            yield view[start : start + block_bytes]
        return
    if group.device.type == "cuda":
        yield from _cuda.download_blocks(group.bytes_view(), block_bytes)
        return
    raise ValueError(f"{group.name}: cannot export a storage on device {group.device}")
