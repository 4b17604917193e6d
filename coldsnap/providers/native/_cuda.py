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
"""

from __future__ import annotations

import ctypes
import os
import queue
from collections.abc import Iterator

import torch


def host_view(buffer: torch.Tensor, nbytes: int | None = None) -> memoryview:
    """A writable memoryview over a (pinned) host tensor's first nbytes bytes, no copy."""
    size = buffer.numel() if nbytes is None else nbytes
    return memoryview((ctypes.c_char * size).from_address(buffer.data_ptr())).cast("B")


def pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class CudaStager:
    """A pinned ring of `slots` slots of `slot_bytes`, and a dedicated stream on `device`."""

    def __init__(self, device: torch.device, *, slot_bytes: int, slots: int) -> None:
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
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def copy_from_file(self, fd: int, offset: int, nbytes: int, dest: torch.Tensor) -> None:
        """Reads file bytes [offset, offset + nbytes) and copies them into dest[:nbytes]."""
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
