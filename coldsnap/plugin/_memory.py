"""coldsnap's memory-saver adapter: SGLang's adapter, plus a host backend for CPU weights.

On CUDA, torch_memory_saver frees the weights, KV cache and graph regions at the same virtual
addresses and the wrapped adapter does all the work. On CPU torch_memory_saver cannot run, so
released weights would stay resident (and inside an n610 image). The host backend returns
the pages of every registered weight storage to the kernel with madvise(MADV_DONTNEED): the
storage objects and their addresses stay exactly as they were, memory use drops at once, a
process dump skips the absent pages, and hydration refills the same bytes in place (the pages
come back zero-filled on first write). Bytes sharing a page with other data are kept.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from coldsnap._errors import PluginError
from coldsnap._wire import WEIGHTS

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
        self._lock = threading.Lock()

    def pause(self, tag: str) -> int:
        with self._lock:
            if tag != WEIGHTS:
                self.released.add(tag)
                return 0
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


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class ColdsnapMemorySaverAdapter:
    """Wraps the adapter SGLang created; adds host discard for CPU weight storages.

    It offers exactly the adapter interface SGLang calls (region, cuda_graph, pause, resume,
    configure_subprocess, disable, check_validity, enabled), so any call site works unchanged.
    """

    def __init__(
        self, inner: Any, *, live_backing: str, host: HostDiscardBackend = HOST_BACKEND
    ) -> None:
        self.inner = inner
        self.live_backing = live_backing
        self.host = host
        self.cuda = _cuda_available()
        if self.cuda and live_backing in ("host_discard", "none"):
            # Neither frees device memory: released weights and KV would stay resident.
            raise MemoryBackendError(
                f"COLDSNAP_LIVE_BACKING={live_backing} frees no device memory; on CUDA use "
                "torch_memory_saver or auto, and start SGLang with --enable-memory-saver"
            )

    def _host_active(self) -> bool:
        if self.cuda:
            return False  # device memory: the memory saver's work, measured at release
        if self.live_backing == "host_discard":
            return True
        if self.live_backing == "auto":
            return not bool(self.inner.enabled)
        return False

    # --- the TorchMemorySaverAdapter interface ---
    def check_validity(self, caller_name: str) -> None:
        if not self._host_active():
            self.inner.check_validity(caller_name)

    def configure_subprocess(self) -> Any:
        return self.inner.configure_subprocess()

    @contextmanager
    def region(self, tag: str, enable_cpu_backup: bool = False) -> Iterator[None]:
        with self.inner.region(tag, enable_cpu_backup=enable_cpu_backup):
            yield

    def cuda_graph(self, **kwargs: Any) -> Any:
        return self.inner.cuda_graph(**kwargs)

    def disable(self) -> Any:
        return self.inner.disable()

    def pause(self, tag: str) -> Any:
        if self.live_backing == "torch_memory_saver" and not self.inner.enabled:
            raise MemoryBackendError(
                "COLDSNAP_LIVE_BACKING=torch_memory_saver but SGLang's memory saver is not "
                "enabled (start SGLang with --enable-memory-saver)"
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
