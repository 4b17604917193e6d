"""Hydration: fill the registered storages in place from a pack (data_ptr unchanged).

Order of work, so that a bad pack never leaves a storage partly written:
1. plan: the destination's layout must match the index exactly (`_plan`); pack files must be
   regular files of their recorded size. Nothing is read yet.
2. verify (unless preverified): reader threads read every block of every extent into the
   staging ring with os.preadv and check its xxh3_64 checksum. Any failure stops here, with
   every destination byte untouched. This is "verify extents into staging before writing".
3. copy: CPU storages are filled by os.preadv straight into their memory (one copy, the same
   as a memcpy from the page cache: a staging hop on CPU would be a second memcpy). CUDA
   storages are copied by the GPU straight from the pack's page-cache pages, mapped and
   page-locked window by window while the copies run (`_cuda.RegisteredPacks`: no staging
   copy; 0.40 of the pinned bus speed through the ring on the H200 with an 8 GiB pack, where
   registration pipelined with the copy measured about 0.68 in isolation). Where the driver
   refuses to register the mapping, the pinned ring (`_cuda.CudaStager`) copies instead, and
   the report says so (`cuda_path`).

One pass (`one_pass=True`): steps 2 and 3 fuse for CPU storages. The pack files are mapped
read-only and shared (their page-cache pages, as `_cuda.RegisteredFile` maps them); each block
is copied into its storage piece by piece and every piece is hashed in the destination while
it is still in the core's cache, so the pack is read once instead of twice (1.57x the two
passes on the 2-core CPU host: bench/bench_hydrate.py, docs/performance.md). Every byte served
is checked where it landed, but a bad block is found after it was written: the error is then
HydrationFailed (storages partly written, must not be served) instead of PackDamaged. A pack
file truncated while it is mapped faults the process (SIGBUS): it stops, it serves nothing.
CUDA storages keep step 2.

Verification costs one extra read of the pack. A controller that has already verified the
payload (for example while preparing a restore, before the old workload stops) sets
verify=False and skips step 2 (the plugin passes its one reading of COLDSNAP_ARTIFACT_PREVERIFIED,
coldsnap.plugin.Settings.artifact_preverified; nothing here reads the environment).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import xxhash
from attrs import frozen

from .._closing import Closing
from .._errors import HydrationFailed, PackDamaged
from .._layout import Tensors, as_mapping
from . import _cuda
from ._index import PackIndex
from ._plan import Job, plan
from ._source import PackSource

if TYPE_CHECKING:
    import torch

# The variable's name, for callers; only the plugin's settings read it (verify= is explicit).
PREVERIFIED_ENV = "COLDSNAP_ARTIFACT_PREVERIFIED"
DEFAULT_SLOT_BYTES = 8 << 20
_VERIFY_PIECE = 2 << 20  # read-then-hash in pieces that stay in a core's L2 cache
_CHECK_PIECE = 1 << 20  # one pass: copy-then-hash pieces of the destination, half a core's L2
_PROT_READ, _MAP_SHARED = 0x1, 0x01
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def default_threads() -> int:
    return max(2, min(16, os.cpu_count() or 2))


@frozen
class HydrateReport:
    nbytes: int
    extents: int
    verified: bool
    verify_seconds: float
    copy_seconds: float
    threads: int
    checked_in_copy: bool = False  # one pass: CPU blocks were checked inside copy_seconds
    cuda_path: str = ""  # "registered", or "ring: <why registration was refused>"; "" no CUDA

    @property
    def seconds(self) -> float:
        return self.verify_seconds + self.copy_seconds

    @property
    def gib_per_s(self) -> float:
        return self.nbytes / (1 << 30) / self.seconds if self.seconds else float("inf")


class Hydrator(Closing):
    """Reusable hydration machinery: reader threads and the staging ring, allocated once
    (page-aligned anonymous memory for checking; a pinned ring per CUDA device, on first use)
    and reused by every call. Not for concurrent calls; use one per thread of control."""

    def __init__(
        self,
        *,
        threads: int | None = None,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        cuda_slots: int | None = None,
    ) -> None:
        self.threads = threads or default_threads()
        self.slot_bytes = slot_bytes
        self.cuda_slots = cuda_slots or 2 * self.threads
        self._ring = mmap.mmap(-1, self.threads * slot_bytes)  # page-aligned, private
        self._ring_view = memoryview(self._ring)
        self._stagers: dict[torch.device, _cuda.CudaStager] = {}
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="coldsnap-hydrate")
        self._busy = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown()
        self._stagers.clear()
        self._ring_view.release()
        self._ring.close()

    # public -------------------------------------------------------------------------------

    def verify(self, source: PackSource, *, strong: bool = False) -> float:
        """Checks every block of every extent against its checksum (and, with strong=True,
        every extent against its sha256); PackDamaged if any fails. Returns the seconds."""
        with _PackFiles(source) as files, self._busy:
            extents = [(e, files) for e in source.index.extents]
            seconds = self._verify(source.index, extents)
            if strong:
                seconds += self._verify_sha256(extents)
            return seconds

    def hydrate(
        self,
        tensors: Tensors,
        source: PackSource,
        *,
        verify: bool = True,
        one_pass: bool = False,
    ) -> HydrateReport:
        """Copies the pack into the storages of `tensors` (a module, or a name -> tensor
        mapping of the final storages) in place. Raises LayoutMismatch or PackDamaged with
        nothing written; HydrationFailed if the copy itself fails part-way. With verify and
        one_pass, CPU storages are checked as they are filled (module docstring): a bad block
        then raises HydrationFailed, with storages partly written."""
        mapping = as_mapping(tensors)
        index = source.index
        jobs = plan(index, mapping)
        in_copy = verify and one_pass
        before = [job for job in jobs if not (in_copy and job.group.device.type == "cpu")]
        on_cuda = [job for job in jobs if job.group.device.type == "cuda"]
        rest = [job for job in jobs if job.group.device.type != "cuda"]
        cuda_path = ""
        with _PackFiles(source) as files, self._busy:
            verify_seconds = (
                self._verify(index, [(job.extent, files) for job in before])
                if verify and before
                else 0.0
            )
            if in_copy:
                copy_seconds = self._copy(rest, files, check_block=index.block_bytes)
            else:
                copy_seconds = self._copy(rest, files)
            if on_cuda:
                seconds, cuda_path = self._copy_cuda(on_cuda, source, files)
                copy_seconds += seconds
            files.check_unchanged()
        return HydrateReport(
            nbytes=sum(job.extent.nbytes for job in jobs),
            extents=len(jobs),
            verified=verify,
            verify_seconds=verify_seconds,
            copy_seconds=copy_seconds,
            threads=self.threads,
            checked_in_copy=in_copy,
            cuda_path=cuda_path,
        )

    # steps --------------------------------------------------------------------------------

    def _verify(self, index: PackIndex, extents: Sequence[tuple[Any, _PackFiles]]) -> float:
        start = time.perf_counter()
        block = index.block_bytes
        tasks = [
            (files.fd(extent.pack), extent, b)
            for extent, files in extents
            for b in range(len(extent.checksums))
        ]
        failures: list[str] = []

        def check(task: tuple[int, Any, int], slot: memoryview) -> None:
            fd, extent, b = task
            begin = b * block
            size = min(block, extent.nbytes - begin)
            h = xxhash.xxh3_64()
            done = 0
            while done < size:
                piece = min(len(slot), _VERIFY_PIECE, size - done)
                got = os.preadv(fd, [slot[:piece]], extent.offset + begin + done)
                if got != piece:
                    failures.append(f"{extent.name}: block {b}: the pack ends early (short read)")
                    return
                h.update(slot[:piece])
                done += piece
            if h.hexdigest() != extent.checksums[b]:
                failures.append(
                    f"{extent.name}: block {b} (bytes {begin}..{begin + size} of the storage, "
                    f"pack {extent.pack}): checksum expected {extent.checksums[b]}, "
                    f"found {h.hexdigest()}"
                )

        self._run(tasks, check, stop=lambda: bool(failures))
        if failures:
            raise PackDamaged("the pack is damaged (nothing was written):", failures[:20])
        return time.perf_counter() - start

    def _verify_sha256(self, extents: Sequence[tuple[Any, _PackFiles]]) -> float:
        start = time.perf_counter()
        failures: list[str] = []

        def check(task: tuple[Any, _PackFiles], slot: memoryview) -> None:
            extent, files = task
            sha = hashlib.sha256()
            done = 0
            while done < extent.nbytes:
                piece = min(len(slot), extent.nbytes - done)
                got = os.preadv(files.fd(extent.pack), [slot[:piece]], extent.offset + done)
                if got != piece:
                    failures.append(f"{extent.name}: the pack ends early (short read)")
                    return
                sha.update(slot[:piece])
                done += piece
            found = "sha256:" + sha.hexdigest()
            if found != extent.sha256:
                failures.append(f"{extent.name}: sha256 expected {extent.sha256}, found {found}")

        self._run(list(extents), check, stop=lambda: bool(failures))
        if failures:
            raise PackDamaged("the pack is damaged:", failures[:20])
        return time.perf_counter() - start

    def _copy(self, jobs: list[Job], files: _PackFiles, *, check_block: int = 0) -> float:
        """Fills every storage; with check_block (the index's block size), each CPU task is
        one block, hashed piece by piece as it lands and compared with its checksum."""
        start = time.perf_counter()
        tasks: list[tuple[int, int, int, Job, int]] = []
        stagers = []
        for job in jobs:
            extent, group = job.extent, job.group
            chunk = self.slot_bytes
            if group.device.type == "cuda":
                stager = self._stager(group.device)
                if stager not in stagers:
                    stagers.append(stager)
            elif check_block:
                chunk = check_block
            for begin in range(0, extent.nbytes, chunk):
                size = min(chunk, extent.nbytes - begin)
                tasks.append((files.fd(extent.pack), extent.offset + begin, size, job, begin))
        targets: dict[int, Any] = {}
        for job in jobs:  # resolve destination memory once per storage, before threads start
            if job.group.device.type == "cpu" and job.group.nbytes:
                targets[id(job)] = job.group.data_ptr()
            elif job.group.device.type == "cuda":
                targets[id(job)] = job.group.bytes_view()
        if check_block:
            files.map_all()
        for stager in stagers:
            stager.begin()
        errors: list[str] = []
        damaged: list[str] = []

        def copy(task: tuple[int, int, int, Job, int], _: memoryview) -> None:
            fd, offset, size, job, begin = task
            try:
                if job.group.device.type == "cpu" and check_block:
                    source = files.address(job.extent.pack) + offset
                    found = _copy_checked(source, targets[id(job)] + begin, size)
                    b = begin // check_block
                    if found != job.extent.checksums[b]:
                        damaged.append(
                            f"{job.extent.name}: block {b} (bytes {begin}..{begin + size} of the "
                            f"storage, pack {job.extent.pack}): checksum expected "
                            f"{job.extent.checksums[b]}, found {found}"
                        )
                elif job.group.device.type == "cpu":
                    _read_into(fd, offset, targets[id(job)] + begin, size)
                else:
                    dest = targets[id(job)][begin : begin + size]
                    self._stager(job.group.device).copy_from_file(fd, offset, size, dest)
            except (OSError, EOFError, RuntimeError) as exc:
                errors.append(f"{job.extent.name}: {exc}")

        self._run(tasks, copy, stop=lambda: bool(errors or damaged))
        for stager in stagers:
            stager.synchronize()
        if damaged:
            raise HydrationFailed(
                "the pack is damaged: these blocks failed their checksum as they were copied; "
                "the storages are partly written and must not be served:\n  "
                + "\n  ".join(damaged[:20])
            )
        if errors:
            raise HydrationFailed(
                "the copy failed part-way; these storages may be partly written and must not "
                "be served:\n  " + "\n  ".join(errors[:20])
            )
        return time.perf_counter() - start

    def _copy_cuda(
        self, jobs: list[Job], source: PackSource, files: _PackFiles
    ) -> tuple[float, str]:
        """CUDA storages from the registered mapping of the packs (already verified, or
        preverified, by the caller); the pinned ring where registration is refused."""
        start = time.perf_counter()
        devices = {job.group.device for job in jobs}
        if len(devices) != 1:
            raise HydrationFailed(f"one process hydrates one GPU; these storages are on {devices}")
        try:
            packs = _cuda.RegisteredPacks(source, register_threads=4, device=devices.pop())
            try:
                packs.copy(jobs, verify=False, unregister=False)
            except BaseException:
                packs.close()
                raise
            # Unpinning and unmapping 8 GiB takes a tenth of a second the engine need not wait
            # for: every copy has landed (copy() synchronized its stream).
            threading.Thread(target=packs.close, name="coldsnap-unregister", daemon=True).start()
            return time.perf_counter() - start, "registered"
        except _cuda.RegistrationRefused as exc:
            # Registration failed before a window's copy was queued, or after the copies queued
            # so far landed: the ring rewrites every byte of every CUDA storage.
            seconds = time.perf_counter() - start
            return seconds + self._copy(jobs, files), f"ring: {exc}"

    # machinery ----------------------------------------------------------------------------

    def _stager(self, device: torch.device) -> _cuda.CudaStager:
        stager = self._stagers.get(device)
        if stager is None:
            stager = _cuda.CudaStager(device, slot_bytes=self.slot_bytes, slots=self.cuda_slots)
            self._stagers[device] = stager
        return stager

    def _run(
        self,
        tasks: Sequence[Any],
        work: Callable[[Any, memoryview], None],
        *,
        stop: Callable[[], bool],
    ) -> None:
        """Runs `work(task, slot)` over tasks on the reader threads; each thread owns one slot
        of the ring. Stops taking tasks once `stop()` is true."""
        if not tasks:
            return
        counter = itertools.count()  # next() on a count is atomic under the GIL

        def loop(slot: memoryview) -> None:
            while not stop():
                i = next(counter)
                if i >= len(tasks):
                    return
                work(tasks[i], slot)

        n = min(self.threads, len(tasks))
        slots = [self._ring_view[i * self.slot_bytes : (i + 1) * self.slot_bytes] for i in range(n)]
        futures = [self._pool.submit(loop, slot) for slot in slots]
        for future in futures:
            future.result()


def _read_into(fd: int, offset: int, address: int, size: int) -> None:
    """os.preadv straight into destination memory at `address`."""
    view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
    done = 0
    while done < size:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise EOFError(f"short read at byte {offset + done} of the pack")
        done += got


def _copy_checked(source: int, address: int, size: int) -> str:
    """Copies one block from the mapped pack to `address` in pieces (memmove releases the GIL,
    so does xxhash), hashing each piece in the destination while it is still in the cache;
    returns the xxh3_64 hex digest of the bytes that landed."""
    h = xxhash.xxh3_64()
    done = 0
    while done < size:
        piece = min(_CHECK_PIECE, size - done)
        ctypes.memmove(address + done, source + done, piece)
        h.update((ctypes.c_char * piece).from_address(address + done))
        done += piece
    return h.hexdigest()


_LIBC = _cuda._LIBC  # libc's mmap and munmap, typed once (the registered path maps packs too)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _PackFiles(Closing):
    """The pack files of a source, opened (no-follow) and checked against their recorded sizes
    before any byte is read."""

    def __init__(self, source: PackSource) -> None:
        self._fds: dict[str, int] = {}
        self._maps: dict[str, tuple[int, int]] = {}  # digest -> (address, size), read-only
        problems = []
        self._stats: dict[str, tuple[int, int, int, int]] = {}
        for pack in source.index.packs:
            try:
                path = source.pack_path(pack.digest)
                # O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _O_NOFOLLOW | os.O_CLOEXEC)
            except PackDamaged as exc:
                problems += list(exc.lines)
                continue
            except OSError as exc:
                problems.append(f"pack {pack.digest}: cannot open: {exc.strerror}")
                continue
            self._fds[pack.digest] = fd
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"pack {pack.digest}: not a regular file")
                continue
            os.set_blocking(fd, True)
            self._stats[pack.digest] = _identity(st)
            if st.st_size != pack.size:
                what = "truncated" if st.st_size < pack.size else "longer than recorded"
                problems.append(
                    f"pack {pack.digest}: {what}: {st.st_size} bytes, the index says {pack.size}"
                )
        if problems:
            self.close()
            raise PackDamaged("the pack files are not usable (nothing was written):", problems)

    def fd(self, digest: str) -> int:
        return self._fds[digest]

    def map_all(self) -> None:
        """Maps every pack file read-only and shared, once (before reader threads start)."""
        for digest, fd in self._fds.items():
            size = self._stats[digest][2]
            if digest in self._maps or size == 0:
                continue
            address = _LIBC.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
            if address in (None, ctypes.c_void_p(-1).value):
                err = ctypes.get_errno()
                raise HydrationFailed(f"pack {digest}: mmap of {size} bytes: {os.strerror(err)}")
            self._maps[digest] = (int(address), size)

    def address(self, digest: str) -> int:
        return self._maps[digest][0]

    def check_unchanged(self) -> None:
        """HydrationFailed when a pack file changed (size, modification time, inode) since it
        was opened: what was copied may not be what was verified."""
        changed = [
            digest
            for digest, fd in self._fds.items()
            if _identity(os.fstat(fd)) != self._stats.get(digest)
        ]
        if changed:
            raise HydrationFailed(
                "pack file(s) changed during hydration; the storages hold bytes that were not "
                "verified and must not be served: " + ", ".join(changed)
            )

    def close(self) -> None:
        for address, size in self._maps.values():
            _LIBC.munmap(address, size)
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


_default: Hydrator | None = None
_default_lock = threading.Lock()


def _shared() -> Hydrator:
    global _default
    with _default_lock:
        if _default is None:
            _default = Hydrator()
        return _default


def hydrate_pack(
    tensors: Tensors, source: PackSource, *, verify: bool = True, one_pass: bool = False
) -> HydrateReport:
    """`Hydrator.hydrate` on a process-wide Hydrator (its ring is allocated once per process)."""
    return _shared().hydrate(tensors, source, verify=verify, one_pass=one_pass)


def verify_pack(source: PackSource, *, strong: bool = False) -> float:
    """`Hydrator.verify` on the process-wide Hydrator: every block checksum, and with
    strong=True every extent's sha256 too."""
    return _shared().verify(source, strong=strong)
