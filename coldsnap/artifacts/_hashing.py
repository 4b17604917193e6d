"""The one streaming sha256 of coldsnap: whole files and byte ranges, read in large pieces
without moving the file's offset (several threads may hash one descriptor) and never through a
symbolic link unless asked. Digests are written `sha256:<hex>` (`DIGEST_PREFIX`)."""

from __future__ import annotations

import hashlib
import os

from ._names import DIGEST_PREFIX

CHUNK = 8 << 20
"""Bytes read per call: large enough that the hash, not the system call, is the cost."""


def sha256_range(fd: int, offset: int = 0, end: int | None = None) -> str:
    """The hex sha256 of the bytes of `fd` from `offset` up to `end` (None: the end of the
    file), read with preadv so the descriptor's offset does not move."""
    sha = hashlib.sha256()
    view = memoryview(bytearray(CHUNK))
    while end is None or offset < end:
        want = len(view) if end is None else min(len(view), end - offset)
        n = os.preadv(fd, [view[:want]], offset)
        if n == 0:
            break
        sha.update(view[:n])
        offset += n
    return sha.hexdigest()


def sha256_fd(fd: int) -> str:
    """`sha256:<hex>` of the whole file open at `fd`."""
    return DIGEST_PREFIX + sha256_range(fd)


def sha256_file(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> str:
    """`sha256:<hex>` of the file at `path` (a symbolic link at `path` itself is refused with
    OSError unless `follow_symlinks`: a Hugging Face snapshot is made of them, a store is not)."""
    flags = os.O_RDONLY | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


__all__ = ["CHUNK", "DIGEST_PREFIX", "sha256_fd", "sha256_file", "sha256_range"]
