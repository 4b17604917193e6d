"""The CUDA side of packs, kept small and apart so it can be qualified and tuned on a GPU host.

Interface used by the rest of the provider:
- `CudaStager(device, slot_bytes=, slots=)`: one pinned host ring (allocated once, reused for
  every hydration) and one dedicated stream. `copy_from_file(fd, offset, nbytes, dest)` is
  called by several reader threads at once: each piece is read with os.preadv into a free
  slot, then copied to `dest` (a flat uint8 CUDA tensor) with a non-blocking host-to-device
  copy on the stream; a slot is reused only after the event recorded behind its copy has
  completed. `begin()` orders the copies after the work already queued on the device;
  `synchronize()` waits for every copy issued so far.
- `download_blocks(src, block_bytes)`: a CUDA storage's bytes as host memory, block by block,
  through one pinned buffer (used by export).
- `RegisteredPacks(source)` / `hydrate_registered(tensors, source, verify=)`: the registered
  mapping path (below): the GPU reads the page-cached pack itself, no staging copy.

The registered path. The pack files are mapped read-only and shared (their page-cache pages),
page-locked with cudaHostRegister window by window, and each extent piece inside a registered
window is copied on one dedicated stream (a copy never spans two registrations: the driver would
treat it as pageable). Verification hashes every block (xxh3_64, GIL released) from the mapping,
the bytes the GPU reads, on CPU threads while the copies run; a mismatch raises HydrationFailed
after the copy (the storages hold damaged bytes and must not be served). A refused
registration raises RegistrationRefused (the copies already queued finish; nothing is checked):
take the pinned ring, which rewrites every byte.
Measured on the H200 (docs/qualification.md; 7.80 GiB pack, warm page cache, pinned H2D
51 GiB/s): registered first and then copied, 48.9 GiB/s = 0.955-0.963 of the pinned copy with
verification off (0.845 with 16 hashing threads during the copy); registered inside the copy
only 17.7-21.4 GiB/s: the copies did not overlap the registration, and 1 to 16 registration
threads all registered at 26-34 GiB/s. So register ahead of the critical path where the
hydrating process allows it; otherwise the ring (25-29 GiB/s warm) is as fast.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import xxhash
from attrs import frozen

from .._closing import Closing
from .._errors import HydrationFailed, ProviderError
from .._layout import as_mapping
from ._plan import Job, plan
from ._source import PackSource

if TYPE_CHECKING:
    import torch  # imported where it is used: reading or verifying a pack needs no torch


def host_view(buffer: torch.Tensor, nbytes: int | None = None) -> memoryview:
    """A writable memoryview over a (pinned) host tensor's first nbytes bytes, no copy."""
    size = buffer.numel() if nbytes is None else nbytes
    return memoryview((ctypes.c_char * size).from_address(buffer.data_ptr())).cast("B")


def use_device(device: torch.device) -> None:
    """Makes `device` this thread's current CUDA device (a new thread's is device 0)."""
    import torch

    torch.cuda.set_device(device)


def pinned(nbytes: int) -> torch.Tensor:
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class CudaStager:
    """A pinned ring of `slots` slots of `slot_bytes`, and a dedicated stream on `device`."""

    def __init__(self, device: torch.device, *, slot_bytes: int, slots: int) -> None:
        import torch

        self.device = torch.device(device)
        self.slot_bytes = slot_bytes
        self.ring = pinned(slot_bytes * slots)
        self.stream = torch.cuda.Stream(device=self.device)
        self._slots = [self.ring[i * slot_bytes : (i + 1) * slot_bytes] for i in range(slots)]
        self._views = [host_view(s) for s in self._slots]
        self._events = [torch.cuda.Event() for _ in range(slots)]
        self._free: queue.SimpleQueue[tuple[int, bool]] = queue.SimpleQueue()
        for i in range(slots):
            self._free.put((i, False))

    def begin(self) -> None:
        """Orders the copies after work already queued on the device's current stream."""
        import torch

        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def copy_from_file(self, fd: int, offset: int, nbytes: int, dest: torch.Tensor) -> None:
        """Reads file bytes [offset, offset + nbytes) and copies them into dest[:nbytes]."""
        import torch

        done = 0
        while done < nbytes:
            size = min(self.slot_bytes, nbytes - done)
            slot, used = self._free.get()
            try:
                if used:
                    self._events[slot].synchronize()  # the slot's previous copy has landed
                got = os.preadv(fd, [self._views[slot][:size]], offset + done)
                if got != size:
                    raise EOFError(f"short read at byte {offset + done}: {got} of {size}")
                with torch.cuda.stream(self.stream):
                    dest[done : done + size].copy_(self._slots[slot][:size], non_blocking=True)
                    self._events[slot].record(self.stream)
            except BaseException:
                self._free.put((slot, used))
                raise
            self._free.put((slot, True))
            done += size

    def synchronize(self) -> None:
        self.stream.synchronize()


def download_blocks(src: torch.Tensor, block_bytes: int) -> Iterator[memoryview]:
    """Yields src's bytes block by block as host memory; each view is valid until the next."""
    import torch

    nbytes = src.numel()
    buffer = pinned(min(block_bytes, nbytes))
    view = host_view(buffer)
    stream = torch.cuda.Stream(device=src.device)
    stream.wait_stream(torch.cuda.current_stream(src.device))  # after the writes already queued
    for start in range(0, nbytes, block_bytes):
        size = min(block_bytes, nbytes - start)
        with torch.cuda.stream(stream):
            buffer[:size].copy_(src[start : start + size], non_blocking=True)
        stream.synchronize()
        yield view[:size]


# -- the registered path ----------------------------------------------------------------

GIB = 1 << 30
DEFAULT_WINDOW_BYTES = 256 << 20
_HOST_REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly
_PROT_READ, _MAP_SHARED = 0x1, 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


class RegistrationRefused(ProviderError):
    """cudaHostRegister refused the mapping: take the pinned ring instead."""


def _libc() -> Any:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


_LIBC = _libc()
_cudart_lib: Any = None


def cudart() -> Any:
    """The CUDA runtime torch loaded (the same instance, so registrations are its own)."""
    import torch

    global _cudart_lib
    if _cudart_lib is None:
        torch.cuda.init()
        path = None
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libcudart.so" in line:
                    path = line.split(None, 5)[-1].strip()
                    break
        lib = ctypes.CDLL(path or "libcudart.so", use_errno=True)
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
        ]  # fmt: skip
        lib.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcHandle), ctypes.c_void_p]
        lib.cudaIpcOpenMemHandle.argtypes = [
            ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint,
        ]  # fmt: skip
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        _cudart_lib = lib
    return _cudart_lib


class IpcHandle(ctypes.Structure):
    """cudaIpcMemHandle_t: 64 opaque bytes, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * 64)]


def check(code: int, what: str, error: type[Exception]) -> None:
    """Raises `error` naming `what` and the runtime's name for `code` unless it is success,
    after clearing the error so that torch's next check does not trip on it."""
    if code != 0:
        lib = cudart()
        lib.cudaGetLastError()
        raise error(f"{what}: {lib.cudaGetErrorName(code).decode()}")


class RegisteredFile:
    """A whole file mapped read-only and shared, page-locked for the GPU in windows."""

    def __init__(self, fd: int, size: int, *, window_bytes: int = DEFAULT_WINDOW_BYTES) -> None:
        if size <= 0:
            raise ValueError(f"size: {size} is not positive")
        self.size = size
        address = _LIBC.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {size} bytes: {os.strerror(err)}")
        self.address = int(address)
        self.windows = [
            (start, min(window_bytes, size - start)) for start in range(0, size, window_bytes)
        ]
        self.window_bytes = window_bytes
        self._registered = [False] * len(self.windows)

    def register(self, i: int) -> None:
        """Page-locks window i (idempotent). Raises RegistrationRefused on failure."""
        if self._registered[i]:
            return
        start, length = self.windows[i]
        lib = cudart()
        code = lib.cudaHostRegister(self.address + start, length, _HOST_REGISTER_READ_ONLY)
        check(code, f"cudaHostRegister of window {i}", RegistrationRefused)
        self._registered[i] = True

    def unregister(self) -> float:
        start = time.perf_counter()
        lib = cudart()
        for i, (offset, _) in enumerate(self.windows):
            if self._registered[i]:
                lib.cudaHostUnregister(self.address + offset)
                self._registered[i] = False
        return time.perf_counter() - start

    def close(self) -> None:
        if self.address:
            self.unregister()
            _LIBC.munmap(self.address, self.size)
            self.address = 0

    def host(self, offset: int, nbytes: int) -> torch.Tensor:
        """A CPU uint8 tensor over [offset, offset+nbytes) of the mapping (no copy; read only)."""
        import torch

        raw = (ctypes.c_char * nbytes).from_address(self.address + offset)
        return torch.frombuffer(raw, dtype=torch.uint8)

    def memory(self, offset: int, nbytes: int) -> memoryview:
        raw = (ctypes.c_char * nbytes).from_address(self.address + offset)
        return memoryview(raw).cast("B")

    def window_of(self, offset: int) -> int:
        return offset // self.window_bytes


@frozen
class RegisteredReport:
    nbytes: int
    pieces: int
    windows: int
    verified: bool
    seconds: float  # first mapping to last byte landed (and verified)
    register_seconds: float  # sum over threads would overstate: wall time until the last window
    copy_wait_seconds: float  # after the last copy was queued, until the stream finished
    verify_seconds: float  # wall time of the verification threads
    unregister_seconds: float

    @property
    def gib_per_s(self) -> float:
        return self.nbytes / GIB / self.seconds if self.seconds else float("inf")


@frozen
class _Piece:
    digest: str
    offset: int  # in the pack file
    nbytes: int
    dest: torch.Tensor  # flat uint8 CUDA view


def pieces_of(jobs: Sequence[Job], window_bytes: int) -> list[_Piece]:
    """The copies to make: each extent cut at window boundaries of its pack."""
    out: list[_Piece] = []
    for job in jobs:
        if job.group.device.type != "cuda":
            raise ValueError(f"{job.extent.name}: the registered path fills CUDA storages only")
        flat = job.group.bytes_view()
        done = 0
        while done < job.extent.nbytes:
            offset = job.extent.offset + done
            room = window_bytes - offset % window_bytes
            size = min(room, job.extent.nbytes - done)
            out.append(_Piece(job.extent.pack, offset, size, flat[done : done + size]))
            done += size
    return out


def _verify_tasks(jobs: Sequence[Job], block_bytes: int) -> list[tuple[str, int, int, str, str]]:
    tasks = []
    for job in jobs:
        e = job.extent
        for b, expected in enumerate(e.checksums):
            begin = b * block_bytes
            size = min(block_bytes, e.nbytes - begin)
            tasks.append((e.pack, e.offset + begin, size, expected, f"{e.name}: block {b}"))
    return tasks


class RegisteredPacks(Closing):
    """The mapped (and, once `register_all` or a copy ran, registered) files of one pack
    source. Registration can run ahead of the copy (`register_all`, while a restore is
    prepared) or inside it (`copy_registered` pipelines it)."""

    def __init__(
        self,
        source: PackSource,
        *,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        register_threads: int = 4,
        verify_threads: int = 8,
        device: torch.device | None = None,
    ) -> None:
        import torch

        self.source = source
        self.window_bytes = window_bytes
        self.files: dict[str, RegisteredFile] = {}
        self._fds: list[int] = []
        # A new thread's current CUDA device is 0: a registration there would make a context
        # on GPU 0 in every rank's process. Each registering thread takes this device first.
        if device is None or device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self._pool = ThreadPoolExecutor(
            register_threads,
            thread_name_prefix="coldsnap-register",
            initializer=torch.cuda.set_device,
            initargs=(device,),
        )
        self._verify_pool = ThreadPoolExecutor(verify_threads, thread_name_prefix="coldsnap-xxh3")
        self.verify_threads = verify_threads
        try:
            for pack in source.index.packs:
                fd = os.open(source.pack_path(pack.digest), os.O_RDONLY | os.O_CLOEXEC)
                self._fds.append(fd)
                if os.fstat(fd).st_size != pack.size:
                    raise HydrationFailed(f"pack {pack.digest}: size differs from the index")
                self.files[pack.digest] = RegisteredFile(fd, pack.size, window_bytes=window_bytes)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self._pool.shutdown()
        self._verify_pool.shutdown()

    def _submit_all(self) -> dict[tuple[str, int], Future[None]]:
        return {
            (digest, i): self._pool.submit(f.register, i)
            for digest, f in self.files.items()
            for i in range(len(f.windows))
        }

    def register_all(self) -> float:
        """Registers every window now (in threads); returns the seconds it took."""
        start = time.perf_counter()
        for future in self._submit_all().values():
            future.result()
        return time.perf_counter() - start

    def unregister_all(self) -> float:
        return sum(f.unregister() for f in self.files.values())

    def copy(
        self,
        tensors_or_jobs: Any,
        *,
        verify: bool,
        stream: torch.cuda.Stream | None = None,
        unregister: bool = True,
    ) -> RegisteredReport:
        """Fills the destination storages from the mapped packs (see the module docstring).
        `tensors_or_jobs`: a module, a name -> tensor mapping, or jobs from `plan()`."""
        import torch

        start = time.perf_counter()
        index = self.source.index
        if isinstance(tensors_or_jobs, list) and all(isinstance(j, Job) for j in tensors_or_jobs):
            jobs = tensors_or_jobs
        else:
            jobs = plan(index, as_mapping(tensors_or_jobs))
        pieces = pieces_of(jobs, self.window_bytes)
        failures: list[str] = []
        verify_wall = [0.0]
        if verify:
            verify_futures = self._start_verify(jobs, index.block_bytes, failures, verify_wall)
        registrations = self._submit_all()
        device = pieces[0].dest.device if pieces else torch.device("cuda")
        stream = stream or torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        register_done = start
        try:
            with torch.cuda.stream(stream):
                for piece in pieces:
                    f = self.files[piece.digest]
                    registrations[(piece.digest, f.window_of(piece.offset))].result()
                    register_done = max(register_done, time.perf_counter())
                    piece.dest.copy_(f.host(piece.offset, piece.nbytes), non_blocking=True)
            for future in registrations.values():
                future.result()
            register_done = time.perf_counter()
            stream.synchronize()
        except RegistrationRefused:
            stream.synchronize()
            for future in registrations.values():
                future.exception()
            self.unregister_all()
            raise
        copy_wait = time.perf_counter() - register_done
        if verify:
            for future in verify_futures:
                future.result()
        seconds = time.perf_counter() - start
        unregister_seconds = self.unregister_all() if unregister else 0.0
        if failures:
            raise HydrationFailed(
                "block checksums failed while copying; these storages hold damaged bytes and "
                "must not be served:\n  " + "\n  ".join(failures[:20])
            )
        return RegisteredReport(
            nbytes=sum(p.nbytes for p in pieces),
            pieces=len(pieces),
            windows=len(registrations),
            verified=verify,
            seconds=seconds,
            register_seconds=register_done - start,
            copy_wait_seconds=copy_wait,
            verify_seconds=verify_wall[0],
            unregister_seconds=unregister_seconds,
        )

    def _start_verify(
        self, jobs: Sequence[Job], block_bytes: int, failures: list[str], wall: list[float]
    ) -> list[Future[None]]:
        tasks = _verify_tasks(jobs, block_bytes)
        start = time.perf_counter()
        counter = iter(range(len(tasks)))
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    break
                digest, offset, size, expected, what = tasks[i]
                found = xxhash.xxh3_64(self.files[digest].memory(offset, size)).hexdigest()
                if found != expected:
                    failures.append(f"{what}: checksum expected {expected}, found {found}")
            wall[0] = max(wall[0], time.perf_counter() - start)

        return [self._verify_pool.submit(worker) for _ in range(self.verify_threads)]


def hydrate_registered(
    tensors: Any,
    source: PackSource,
    *,
    verify: bool,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    register_threads: int = 4,
    verify_threads: int = 8,
    device: torch.device | None = None,
) -> RegisteredReport:
    """Maps, registers (pipelined with the copy), copies and unregisters in one call."""
    with RegisteredPacks(
        source,
        window_bytes=window_bytes,
        register_threads=register_threads,
        verify_threads=verify_threads,
        device=device,
    ) as packs:
        return packs.copy(tensors, verify=verify)
