"""A runtime fact computed from source files (an engine's contract digest), computed again only
when one of those files, or a directory that could gain one, has changed.

The SGLang contract digest reads the source of about 60 functions and classes (inspect
re-tokenizes each, and re-parses a whole module per class: about 0.1 s a call on CPU, and an
allocation storm that makes the collector walk a large GPU orchestrator's heap), yet its inputs
are files whose stat changes when they do. So the value is kept with the stat (device, inode,
size, mtime) of every file and directory `sources()` names after the computation, and handed
back while all of them are as they were (the node's stamps: coldsnap.artifacts._nodememo).
What stat cannot see is not caught: a writer that puts the mtime back, or bytes changed under
an unchanged inode by something other than a write. A value whose inputs were written just
before or during the computation is not kept, since a file's time ticks coarsely.

With `Persisted`, the value also outlives the process: it is written, with the stamps and what
selects it (the interpreter, the import path, the environment variables the computation reads),
to a node-local record under /run (coldsnap.artifacts._nodememo: a reboot
forgets it, its folder is private (0700), and a record that cannot be read, is another user's,
of another format or kind, or selected by something else is not used). A fresh process
(`coldsnap restore`) whose every stamp still matches takes the value from the record instead of
importing the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from attrs import field, frozen
from cattrs import BaseValidationError

from coldsnap._paths import SOURCES_ROOT

from ._convert import converter
from ._nodememo import read_record, settled, write_record

T = TypeVar("T")

_FORMAT = 1
_KIND = "coldsnap.source-memo"
Origin = Literal["memory", "record", "computed"]

Stamp = tuple[str, int, int, int, int]


def stamps(paths: Iterable[str]) -> tuple[Stamp, ...]:
    """(path, device, inode, size, mtime) of each path, in sorted order; a path that cannot be
    stat'ed is stamped with zeros (its coming back is then a change too).

    A directory is stamped by what it lists, not by its times: its `size` is a digest of the
    names in it (hidden ones and `__pycache__` left out) and its `mtime` 0. A directory is named
    so that a module or distribution added to it, or one removed or renamed, is a change;
    Python writing bytecode caches, or a tool its dot-folder, beside the sources is not one,
    and counting it would make the first use of every fresh install compute twice."""
    out = []
    for path in sorted(set(paths)):
        try:
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                out.append((path, st.st_dev, st.st_ino, _listing(path), 0))
                continue
        except OSError:
            out.append((path, 0, 0, -1, 0))
            continue
        out.append((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _listing(folder: str) -> int:
    """A digest of the names `folder` holds, other than hidden ones and bytecode caches."""
    names = sorted(n for n in os.listdir(folder) if not n.startswith(".") and n != "__pycache__")
    digest = hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:7], "big")  # fits a JSON number exactly


@frozen
class SeenFile:
    """A stamp as a record holds it."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int


@frozen
class MemoRecord:
    """A persisted value: what selects it, the value (unstructured), and its inputs' stamps."""

    KIND = _KIND

    format: int = field()
    kind: str
    name: str
    selector: dict[str, str]
    value: Any
    seen: tuple[SeenFile, ...]

    @format.validator
    def _check_format(self, _: Any, value: int) -> None:
        if value != _FORMAT:
            raise ValueError(f"format: expected {_FORMAT}, found {value!r}")


@frozen
class Persisted(Generic[T]):
    """Where and how a `SourceMemo` keeps its value across processes.

    name: the record's name (one file per name and selector).
    selector: what, besides the stamped files, the value depends on (the interpreter, sys.path,
        environment variables); asked on every call, so it must be cheap and import nothing.
    value_type: the attrs class of the value (structured strictly from the record).
    root: the records' folder; None: SOURCES_ROOT.
    """

    name: str
    selector: Callable[[], dict[str, str]]
    value_type: type[T]
    root: Path | None = None

    def _path(self, selector: dict[str, str]) -> Path:
        key = json.dumps([self.name, selector], sort_keys=True).encode()
        root = SOURCES_ROOT if self.root is None else self.root
        return root / f"{self.name}-{hashlib.sha256(key).hexdigest()[:32]}.json"

    def load(self) -> tuple[tuple[Stamp, ...], T] | None:
        """The recorded stamps and value for this selector; None when there is no usable record
        (absent, unreadable, another format or kind, another selector, a value that does not
        structure)."""
        selector = self.selector()
        record = read_record(self._path(selector), MemoRecord)
        if record is None or record.name != self.name or record.selector != selector:
            return None
        try:
            value = converter.structure(record.value, self.value_type)
        except (BaseValidationError, ValueError, TypeError, KeyError):
            return None  # a value that does not structure is no record
        return tuple((f.path, f.dev, f.ino, f.size, f.mtime_ns) for f in record.seen), value

    def save(self, seen: tuple[Stamp, ...], value: T) -> None:
        """Writes the record atomically (folder mode 0700); a record not written costs an
        import next time, nothing else."""
        selector = self.selector()
        record = MemoRecord(
            format=_FORMAT,
            kind=_KIND,
            name=self.name,
            selector=selector,
            value=converter.unstructure(value),
            seen=tuple(SeenFile(*stamp) for stamp in seen),
        )
        write_record(self._path(selector), record)


class SourceMemo(Generic[T]):
    """`compute()`, kept while the files and directories `sources()` names are unchanged.
    `sources()` is asked after each computation (the modules it imported are then loaded), so
    it names at least what the computation read. With `persist`, a value not kept in this
    process is looked up in (and a computed one written to) the node's record. `last` says
    where the latest value came from (its record, a computation, or this process's memory).
    Thread-safe; a failing computation keeps nothing and raises."""

    def __init__(
        self,
        compute: Callable[[], T],
        sources: Callable[[], Iterable[str]],
        *,
        persist: Persisted[T] | None = None,
    ) -> None:
        self._compute = compute
        self._sources = sources
        self._persist = persist
        self._lock = threading.Lock()
        self._kept: tuple[tuple[Stamp, ...], T, bool] | None = None
        self.last: Origin | None = None

    def __call__(self) -> T:
        return self.fetch()[0]

    def fetch(self) -> tuple[T, bool]:
        """The value, and whether it was read from the record rather than computed in this
        process (a caller may owe this process what the computation would have left in it)."""
        with self._lock:
            if self._kept is not None:
                seen, value, recorded = self._kept
                if stamps(p for p, *_ in seen) == seen:
                    self.last = "memory"
                    return value, recorded
                self._kept = None
            found = self._persist.load() if self._persist is not None else None
            if found is not None and stamps(p for p, *_ in found[0]) == found[0]:
                self._kept = (*found, True)
                self.last = "record"
                return found[1], True
            began = time.time_ns()
            value = self._compute()
            seen = stamps(self._sources())
            if all(settled(mtime, began) for *_, mtime in seen):
                self._kept = (seen, value, False)
                if self._persist is not None:
                    self._persist.save(seen, value)
            self.last = "computed"
            return value, False

    def forget(self) -> None:
        """Forgets the value kept in this process (a persisted record stays: its stamps decide)."""
        with self._lock:
            self._kept = None


__all__ = ["SOURCES_ROOT", "MemoRecord", "Persisted", "SeenFile", "SourceMemo", "stamps"]
