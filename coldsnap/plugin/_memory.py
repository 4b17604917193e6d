"""coldsnap's memory-saver adapter: SGLang's adapter, plus a host backend for CPU weights.

On CUDA, torch_memory_saver frees the weights, KV cache and graph regions at the same virtual
addresses and the wrapped adapter does all the work; this adapter only waits for the device
before each pause, since the saver unmaps at once and a kernel still queued on those pages
would fault. On CPU torch_memory_saver cannot run, so
released weights would stay resident (and inside an n610 image). The host backend returns
the pages of every registered weight storage to the kernel with madvise(MADV_DONTNEED): the
storage objects and their addresses stay exactly as they were, memory use drops at once, a
process dump skips the absent pages, and hydration refills the same bytes in place (the pages
come back zero-filled on first write). Bytes sharing a page with other data are kept.

The KV cache on CPU: SGLang allocates its pools inside `region(kv_cache)` and, like
torch_memory_saver without a CPU backup, expects nothing of their contents after a pause (it
flushes the cache first). The host backend records the host tensors allocated inside that
region (a dispatch mode sees every allocating op) and pause(kv_cache) returns their pages the
same way; they come back zero-filled, as the pools were made, on first touch after resume.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from coldsnap._errors import PluginError
from coldsnap._wire import KV_CACHE, LIVE_BACKINGS, WEIGHTS

from ._storages import REGISTRY, StorageRegistry

logger = logging.getLogger("coldsnap.plugin")

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4


class MemoryBackendError(PluginError, RuntimeError):
    """Released memory cannot be freed the way the settings ask."""


def _libc() -> Any:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.madvise.restype = ctypes.c_int
    return lib


def discard_pages(address: int, nbytes: int) -> int:
    """Drops the whole pages inside [address, address+nbytes); returns the bytes dropped."""
    start = -(-address // PAGE) * PAGE
    end = (address + nbytes) // PAGE * PAGE
    if end <= start:
        return 0
    if _LIBC.madvise(start, end - start, _MADV_DONTNEED) != 0:
        err = ctypes.get_errno()
        raise MemoryBackendError(
            f"madvise(DONTNEED) of {end - start} bytes at {start:#x} failed: errno {err}"
        )
    return end - start


_LIBC = _libc()


def _merge(extents: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(extents):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class HostDiscardBackend:
    """Frees the host pages of registered weight storages on pause(weights)."""

    def __init__(self, registry: StorageRegistry = REGISTRY) -> None:
        self.registry = registry
        self.released: set[str] = set()
        self.last_discarded_bytes = 0
        self.region_bytes: dict[str, int] = {}  # per tag, freed by its last pause
        # per tag: (weak reference to a storage, its address, its size) as allocated
        self._regions: dict[str, list[tuple[Any, int, int]]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def record(self, tag: str) -> Iterator[None]:
        """Remembers the host storages that ops inside the block allocate, as region `tag`."""
        mode = _allocations()
        with mode:
            yield
        with self._lock:
            self._regions.setdefault(tag, []).extend(mode.storages)

    def _discard_region(self, tag: str) -> int:
        live = [(a, a + n) for ref, a, n in self._regions.get(tag, []) if not ref.expired()]
        total = sum(discard_pages(a, b - a) for a, b in _merge(live))
        self.region_bytes[tag] = total
        logger.info("coldsnap: released %d bytes of host %s pages", total, tag)
        return total

    def pause(self, tag: str) -> int:
        with self._lock:
            if tag != WEIGHTS:
                self.released.add(tag)
                return self._discard_region(tag)
            total = 0
            for entry in self.registry.models():
                entry.check_live()
                for ptr, (tensor, extents) in entry.storages().items():
                    if tensor.device.type != "cpu":
                        continue
                    for a, b in _merge(extents):
                        total += discard_pages(ptr + a, b - a)
            self.released.add(tag)
            self.last_discarded_bytes = total
            logger.info("coldsnap: released %d bytes of host weight pages", total)
            return total

    def resume(self, tag: str) -> None:
        # Nothing to allocate: the mappings are intact and the pages fault back in on the
        # first write (hydration) or read (zeros, until hydrated).
        with self._lock:
            self.released.discard(tag)


HOST_BACKEND = HostDiscardBackend()


def _allocations() -> Any:
    """A dispatch mode that notes every host storage an op allocates (an output whose storage
    is none of the op's inputs'; views and in-place results are not allocations), weakly: a
    storage SGLang drops is not kept alive, and is skipped at pause."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _Allocations(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.storages: list[tuple[Any, int, int]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            out = func(*args, **(kwargs or {}))
            inputs = {
                t.untyped_storage().data_ptr()
                for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)
            }
            for t in tree_leaves(out):
                if (
                    isinstance(t, torch.Tensor)
                    and t.device.type == "cpu"
                    and t.untyped_storage().data_ptr() not in inputs
                ):
                    storage = t.untyped_storage()
                    self.storages.append(
                        (StorageWeakRef(storage), storage.data_ptr(), storage.nbytes())
                    )
            return out

    return _Allocations()


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _synchronize_device() -> None:
    """Waits for every stream of the current device."""
    import torch

    torch.cuda.synchronize()


class ColdsnapMemorySaverAdapter:
    """Wraps the adapter SGLang created; adds host discard for CPU weight storages.

    It offers exactly the adapter interface SGLang calls (region, cuda_graph, pause, resume,
    configure_subprocess, disable, check_validity, enabled), so any call site works unchanged.

    live_backing (COLDSNAP_LIVE_BACKING) says what released weights keep, and where:
    discard: nothing (CPU: the pages go back to the kernel; CUDA: torch_memory_saver frees the
        region), the resume refills them from the plan's source;
    cpu: a copy in host memory (CPU: the pages simply stay; CUDA: the weights region is created
        with torch_memory_saver's CPU backup, which copies it out at pause and back at resume);
    disk: like discard, after the scheduler has written them under the process artifact root
        (coldsnap.plugin._scheduler, which knows the operation and the rank).
    """

    def __init__(
        self,
        inner: Any,
        *,
        live_backing: str,
        host: HostDiscardBackend = HOST_BACKEND,
        synchronize: Callable[[], None] = _synchronize_device,
    ) -> None:
        if live_backing not in LIVE_BACKINGS:
            raise MemoryBackendError(
                f"COLDSNAP_LIVE_BACKING={live_backing!r} is not one of: {', '.join(LIVE_BACKINGS)}"
            )
        self.inner = inner
        self.live_backing = live_backing
        self.host = host
        self.cuda = _cuda_available()
        self._synchronize = synchronize
        # the regions whose pause began since the scheduler last cleared this: after a release
        # that failed part way, what may have changed (and must be resumed) is these only
        self.pauses_begun: set[str] = set()

    def _host_active(self) -> bool:
        """Whether pausing the weights returns their host pages (CPU, nothing kept in RAM)."""
        if self.cuda or self.live_backing == "cpu":
            return False  # CUDA: the memory saver's work, measured at release; cpu: kept
        return not bool(self.inner.enabled)

    # --- the TorchMemorySaverAdapter interface ---
    def check_validity(self, caller_name: str) -> None:
        if not self._host_active():
            self.inner.check_validity(caller_name)

    def configure_subprocess(self) -> Any:
        return self.inner.configure_subprocess()

    @contextmanager
    def region(self, tag: str, enable_cpu_backup: bool = False) -> Iterator[None]:
        # cpu backing: the saver keeps a host copy of the weights region while it is paused
        backup = enable_cpu_backup or (tag == WEIGHTS and self.live_backing == "cpu")
        # CPU: the KV pools' pages are returned at pause (module docstring); kept ones are not
        keep = backup or tag != KV_CACHE or not self._host_active()
        recording = nullcontext() if keep else self.host.record(tag)
        with self.inner.region(tag, enable_cpu_backup=backup), recording:
            yield

    def cuda_graph(self, **kwargs: Any) -> Any:
        return self.inner.cuda_graph(**kwargs)

    def disable(self) -> Any:
        return self.inner.disable()

    def pause(self, tag: str) -> Any:
        if self.cuda and self.inner.enabled:
            # torch_memory_saver unmaps the region's pages at once, without waiting for the
            # device: a kernel still queued that reads them then faults (an illegal memory
            # access, fatal to the whole context). SGLang's release launches such kernels
            # right before it pauses the weights (copies of every model buffer, taken
            # asynchronously), and an overlapped forward may still be finishing on its own
            # stream. Waiting for every stream first makes the unmap safe; a fault that
            # already happened surfaces here, before this region is paused.
            self._synchronize()
        self.pauses_begun.add(tag)
        if self.cuda and self.live_backing == "cpu" and tag == WEIGHTS and not self.inner.enabled:
            raise MemoryBackendError(
                "COLDSNAP_LIVE_BACKING=cpu on CUDA keeps the weights through torch_memory_saver's "
                "CPU backup, but SGLang's memory saver is not enabled (start SGLang with "
                "--enable-memory-saver)"
            )
        result = self.inner.pause(tag)
        if self._host_active():
            self.host.pause(tag)
        return result

    def resume(self, tag: str) -> Any:
        result = self.inner.resume(tag)
        if self._host_active():
            self.host.resume(tag)
        return result

    @property
    def enabled(self) -> bool:
        # SGLang reads this to decide whether graph capture runs inside the saver's context;
        # the host backend must not change that, so report the wrapped adapter's answer.
        return bool(self.inner.enabled)

    def freed_by(self) -> str:
        if self.inner.enabled:
            return "torch_memory_saver"
        return "host_discard" if self._host_active() else "none"
