"""Bench helpers for native hydration on a GPU. The registered-mapping path itself lives in
the native provider's CUDA module (coldsnap/providers/native/_cuda.py, moved there unchanged
after the H200 runs of docs/qualification.md, which ran it from this file); it is re-exported
here for the workload, the harness and tests/gpu."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from coldsnap.providers.native._cuda import (
    DEFAULT_WINDOW_BYTES,
    GIB,
    RegisteredFile,
    RegisteredPacks,
    RegisteredReport,
    RegistrationRefused,
    cudart,
    hydrate_registered,
    pieces_of,
)

__all__ = [
    "DEFAULT_WINDOW_BYTES",
    "GIB",
    "RegisteredFile",
    "RegisteredPacks",
    "RegisteredReport",
    "RegistrationRefused",
    "cudart",
    "hydrate_registered",
    "pieces_of",
    "pinned_h2d_gib_per_s",
    "touch_page_cache",
]


def pinned_h2d_gib_per_s(nbytes: int, *, buffer_bytes: int = GIB, reps: int = 3) -> list[float]:
    """The reference: one pinned host buffer (allocated once) copied to the GPU until `nbytes`
    have moved, on a dedicated stream; GiB/s per repetition."""
    host = torch.empty(min(buffer_bytes, nbytes), dtype=torch.uint8, pin_memory=True)
    host.fill_(7)
    dest = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.stream(stream):
            for begin in range(0, nbytes, host.numel()):
                size = min(host.numel(), nbytes - begin)
                dest[begin : begin + size].copy_(host[:size], non_blocking=True)
        stream.synchronize()
        out.append(nbytes / GIB / (time.perf_counter() - start))
    del dest, host
    return out


def touch_page_cache(paths: Mapping[str, str] | Sequence[str]) -> None:
    """Reads files once so they sit in the page cache."""
    for path in paths.values() if isinstance(paths, Mapping) else paths:
        with open(path, "rb", buffering=0) as handle:
            buf = bytearray(64 << 20)
            while handle.readinto(buf):
                pass
