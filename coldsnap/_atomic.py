"""Atomic, durable file writes, shared by every package that writes files others read (machine,
plugin, artifacts, providers, backends).

A leaf that imports nothing of coldsnap's, so the packages that must not import each other can
all use it. Every write goes to a temporary file in the target's folder, is flushed and fsynced,
renamed over the target, and the folder is fsynced: a reader sees the old file or the new one,
never a part of either, and the rename survives a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def fsync_dir(path: Path) -> None:
    """Makes the entries of folder `path` (a rename, a new or removed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_replace(tmp: Path, final: Path) -> None:
    """A complete, fsynced `tmp` becomes `final` in one step; the folder entry is made durable.
    For writers that must place their temporary file themselves (the store keeps its own)."""
    os.replace(tmp, final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Yields a temporary file (mode 0600) in `path`'s folder, created if missing. On a clean
    exit it is flushed, fsynced and renamed onto `path`; on an error it is removed and `path`
    is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        durable_replace(Path(tmp), path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes | bytearray | memoryview) -> Path:
    with atomic_write(path) as handle:
        handle.write(data)
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    with atomic_write(path, "w") as handle:
        handle.write(text)
    return path


def write_json_atomic(path: Path, data: Any, *, indent: int = 1) -> Path:
    """`data` as sorted, indented JSON with a final newline (values JSON cannot hold as str)."""
    text = json.dumps(data, indent=indent, sort_keys=True, default=str)
    return write_text_atomic(path, text + "\n")


__all__ = [
    "atomic_write",
    "durable_replace",
    "fsync_dir",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]
