"""Small file-system moves the store is made of: private directories, no-follow opens, exclusive
creates. Every path handled here is inside the store and must not be a symlink. (Durable renames
are coldsnap._atomic's.)"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from ._errors import StoreError

DIR_MODE = 0o700
FILE_MODE = 0o600
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def refuse_symlink(path: Path) -> os.stat_result | None:
    """lstat `path`; None when it does not exist; StoreError when it is a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path} is a symlink; the store refuses symlinks")
    return st


def private_dir(path: Path) -> Path:
    """Creates `path` (mode 0700), or checks that the existing one is a real directory and
    narrows its mode to 0700."""
    st = refuse_symlink(path)
    if st is None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, DIR_MODE)
        st = refuse_symlink(path)
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{path} is not a directory")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        try:
            os.chmod(path, DIR_MODE, follow_symlinks=False)
        except OSError as exc:
            raise StoreError(f"cannot make {path} private (0700): {exc.strerror}") from None
    return path


def regular_file(path: Path) -> os.stat_result | None:
    """lstat a file of the store: None when absent; StoreError for a symlink or non-file."""
    st = refuse_symlink(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path} is not a regular file")
    return st


def open_read(path: Path) -> int:
    """An fd for reading a store file; never follows a symlink."""
    try:
        return os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symlink; the store refuses symlinks") from None
        raise StoreError(f"cannot open {path}: {exc.strerror}") from None


def create_exclusive(path: Path) -> int:
    """A new private file; fails if anything (a symlink included) is already there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]
