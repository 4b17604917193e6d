"""What this node remembers about files whose bytes are costly to read again (a store object
verified in full, the sources an engine's build was computed from): each file's stat stamp
(device, inode, size, mtime) when it was read, kept in small records under /run (forgotten at
reboot, in folders private to their writer). A file whose stamp is unchanged has not been
written since; what stat cannot see is not caught (a writer that puts the mtime back, bytes
changed under an unchanged inode by something other than a write). File times tick coarsely, so
what was written just before it was read is never remembered (`settled`).

One reader and one writer of those records: a record that is absent, unreadable, another
user's, or does not structure strictly is no record (the caller reads the file again); a record
that cannot be written costs a re-read next time, nothing else.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TypeVar

from attrs import frozen
from cattrs import BaseValidationError

from coldsnap._atomic import write_json_atomic

from ._convert import converter, from_json
from ._errors import RecordError

T = TypeVar("T")

SETTLED_NS = 2_000_000_000
"""A file written later than this before it was read is not remembered."""


@frozen
class Stamp:
    """What identifies the bytes of a file's inode as they were when they were read."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> Stamp:
        st = os.stat(path, follow_symlinks=follow_symlinks)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def settled(mtime_ns: int, began_ns: int | None = None) -> bool:
    """Whether a file last written at `mtime_ns` may be remembered as read at `began_ns`
    (default: now)."""
    began = time.time_ns() if began_ns is None else began_ns
    return mtime_ns < began - SETTLED_NS


def read_record(path: Path, record_type: type[T]) -> T | None:
    """The record at `path`, structured strictly as `record_type`, when this process's user
    owns it; None for anything else."""
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_uid != os.geteuid():
                return None  # another user's record is never taken on its word
            data = f.read()
        return from_json(data, record_type)
    except (OSError, RecordError, BaseValidationError, ValueError, TypeError, KeyError):
        return None


def write_record(path: Path, record: object) -> None:
    """Writes `record` atomically at `path` (its folder made private, 0700); a record that
    cannot be written is left unwritten."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_json_atomic(path, converter.unstructure(record), indent=0)
    except OSError:
        return


__all__ = ["SETTLED_NS", "Stamp", "read_record", "settled", "write_record"]
