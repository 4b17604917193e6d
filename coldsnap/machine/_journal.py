"""An append-only JSON-lines journal of every step, fsynced, so a new machine can pick up a run.

The journal is the only state a run keeps outside memory: replaying it tells which steps ended,
which one was interrupted, which compensations ran and the facts recorded so far.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import filelock
from attrs import define, field, frozen

from ._errors import JournalError, JournalUnwritable, RequestError
from ._receipt import ErrorRecord

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = ".coldsnap.lock"
RECORD_KIND = "coldsnap.journal-record"
RECORD_FORMAT = 3
"""Format 2: the `begin` record names the components (role -> name) and whether the operation
is a dry run, so that a resume is refused with components other than those that started it.
Format 3: it also keeps each component's capabilities (role -> sorted names), so that a resume
whose components would select other steps than the run it resumes is refused; a `step_fail`
record keeps the error typed (`failure`, an ErrorRecord) beside its one line (`error`)."""


class WorkdirBusy(JournalError):
    """Another operation (capture, restore, resume or stop) holds the workdir's lock."""


@contextlib.contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """Holds the workdir's lock for the life of an operation: one orchestrator per workdir.

    The lock is an flock on `LOCK_NAME` through its own open file, so a second holder is refused
    in this process as in any other; the kernel drops it when the holder dies. The workdir is
    made private first (`private_workdir`)."""
    private_workdir(workdir)
    lock = filelock.FileLock(workdir / LOCK_NAME, timeout=0, thread_local=False, is_singleton=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise WorkdirBusy(
            f"{workdir}: another coldsnap operation holds this workdir ({LOCK_NAME}); "
            "wait for it to end, or stop it"
        ) from None
    try:
        yield
    finally:
        lock.release()


WORKDIR_MODE = 0o700


def private_workdir(workdir: Path) -> None:
    """Makes `workdir` (and its missing parents) or, where it exists, makes it mode 0700: it
    holds the process image (the engine's memory, its secrets with it) and the capsule's layout,
    and a directory the user made beforehand with the usual 0755 would let every user read them.
    Refused (RequestError naming `workdir`) where changing its mode would take a directory from
    others: one another user owns, or a shared one (sticky bit, as /tmp)."""
    workdir.mkdir(parents=True, exist_ok=True, mode=WORKDIR_MODE)
    st = os.stat(workdir)
    if st.st_uid != os.geteuid():
        raise RequestError([("workdir", f"{workdir} belongs to uid {st.st_uid}, not to this user "
                             f"(uid {os.geteuid()}): give a directory of your own")])  # fmt: skip
    if st.st_mode & stat.S_ISVTX:
        raise RequestError([("workdir", f"{workdir} is a shared directory (sticky bit): give "
                             "a directory of its own, inside it")])  # fmt: skip
    if stat.S_IMODE(st.st_mode) != WORKDIR_MODE:
        os.chmod(workdir, WORKDIR_MODE)


Event = Literal[
    "begin",
    "step_start",
    "progress",
    "step_end",
    "step_fail",
    "comp_start",
    "comp_end",
    "comp_fail",
    "end",
]


@frozen(kw_only=True)
class JournalRecord:
    seq: int
    at: float
    event: str
    step: str | None = None
    status: str | None = None
    seconds: float | None = None
    facts: dict[str, Any] | None = None
    error: str | None = None
    failure: ErrorRecord | None = None
    detail: str | None = None
    spec: str | None = None
    request: dict[str, Any] | None = None
    components: dict[str, str] | None = None
    capabilities: dict[str, list[str]] | None = None
    dry_run: bool | None = None
    outcome: str | None = None
    format: int = RECORD_FORMAT
    kind: str = RECORD_KIND


class Journal:
    """Appends records; each is flushed and fsynced before the call returns.

    A record that cannot be written (the disk is full, the filesystem went read-only) is kept,
    in order, and written before the next record: a run that goes on to compensate after a
    failed append leaves a whole journal once the disk has room again, and `unwritten` says
    what is still missing. A short or failed write is cut off the file again, so the journal
    on disk never holds a torn line in its middle."""

    def __init__(self, path: Path, next_seq: int = 0) -> None:
        self.path = path
        self._seq = next_seq
        self._unwritten: list[bytes] = []
        # A step's worker thread records facts while it runs; one abandoned at its timeout may
        # still do so while the runner's thread journals the compensation.
        self._lock = threading.Lock()

    @property
    def unwritten(self) -> int:
        """How many records this journal holds that are not on disk yet."""
        return len(self._unwritten)

    @classmethod
    def create(cls, workdir: Path) -> Journal:
        workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = workdir / JOURNAL_NAME
        if path.exists() and path.stat().st_size:
            raise JournalError(
                f"{path} holds an earlier operation's journal: resume it, or use a new workdir"
            )
        return cls(path)

    @classmethod
    def reopen(cls, workdir: Path) -> tuple[Journal, list[JournalRecord]]:
        """The journal in `workdir` and its records; a torn last line is cut off the file first,
        so that the next append does not leave it in the middle."""
        path = workdir / JOURNAL_NAME
        records, good = _scan(path)
        size = path.stat().st_size
        if good != size:
            fd = os.open(path, os.O_WRONLY)
            try:
                if good < size:  # a torn or garbage last line: cut it
                    os.ftruncate(fd, good)
                else:  # the last record lost only its newline
                    os.lseek(fd, 0, os.SEEK_END)
                    os.write(fd, b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        return cls(path, records[-1].seq + 1), records

    def append(self, event: Event, **fields: Any) -> JournalRecord:
        """Writes the records not written yet, then this one, each one line, with one write(2),
        then fsyncs. Raises JournalUnwritable (the records kept for the next append) when
        the write or the fsync fails."""
        with self._lock:
            record = JournalRecord(seq=self._seq, at=time.time(), event=event, **fields)
            data = {k: v for k, v in _as_dict(record).items() if v is not None}
            line = json.dumps(data, sort_keys=True, default=str) + "\n"
            self._unwritten.append(line.encode())
            self._seq += 1
            self._flush()
        return record

    def flush(self) -> None:
        """Writes the records not written yet; JournalUnwritable if they still cannot be."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if not self._unwritten:
            return
        lines = b"".join(self._unwritten)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise self._unwritable(exc) from exc
        try:
            start = os.fstat(fd).st_size  # the one writer: the workdir's lock holder
            try:
                written = os.write(fd, lines)
                if written != len(lines):
                    raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: wrote "
                                  f"{written} of {len(lines)} bytes")
                os.fsync(fd)
            except OSError as exc:
                _cut(fd, start)
                raise self._unwritable(exc) from exc
        finally:
            os.close(fd)
        self._unwritten.clear()

    def _unwritable(self, exc: OSError) -> JournalUnwritable:
        return JournalUnwritable(
            f"{self.path}: cannot write the journal ({exc.strerror or exc}); "
            f"{len(self._unwritten)} record(s) not written"
        )


def _cut(fd: int, size: int) -> None:
    """Cuts a failed write off the journal: what was written of it is not a whole record, and
    would be a torn line in the middle once the next append succeeds. Cutting frees blocks, so
    it succeeds on a full disk; if it fails too, the failed write's error is what the caller
    reports, and reading the journal names the torn line."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, size)
        os.fsync(fd)


def _as_dict(record: JournalRecord) -> dict[str, Any]:
    from ._convert import unstructure

    return unstructure(record)


def read_journal(path: Path) -> list[JournalRecord]:
    """Reads a journal; a torn last line (the writer died mid-write) is dropped; others fail."""
    return _scan(path)[0]


def _scan(path: Path) -> tuple[list[JournalRecord], int]:
    """The records of the journal at `path` and the length of the prefix they fill: every line
    must be a record of this format (strictly typed), except a torn or garbage last line."""
    from ._convert import converter

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise JournalError(f"no journal at {path}") from None
    except OSError as exc:
        raise JournalError(f"{path}: cannot read the journal ({exc})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    records: list[JournalRecord] = []
    good = 0
    for number, line in enumerate(lines, 1):
        try:
            item = json.loads(line.decode("utf-8"))
            if not isinstance(item, dict):
                raise ValueError(f"a record is a JSON object, got {type(item).__name__}")
            if item.get("kind") != RECORD_KIND or item.get("format") != RECORD_FORMAT:
                raise ValueError(f"kind/format {item.get('kind')!r}/{item.get('format')!r}")
            record = converter.structure(item, JournalRecord)
            if record.seq != len(records):
                raise ValueError(f"seq {record.seq}, expected {len(records)}")
            records.append(record)
        except Exception as exc:
            if number == len(lines):
                break
            raise JournalError(f"{path}:{number}: not a journal record ({_why(exc)})") from None
        good += len(line) + 1
    if not records or records[0].event != "begin":
        raise JournalError(f"{path}: the journal does not start with a 'begin' record")
    return records, good


def _why(exc: Exception) -> str:
    import cattrs

    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc))
    return str(exc)


@define
class Replay:
    """What a journal says happened, in the terms the runner resumes from."""

    spec: str
    request: dict[str, Any]
    components: dict[str, str] = field(factory=dict)
    capabilities: dict[str, list[str]] = field(factory=dict)
    dry_run: bool = False
    facts: dict[str, Any] = field(factory=dict)
    completed: list[JournalRecord] = field(factory=list)
    interrupted: str | None = None
    failed: JournalRecord | None = None
    compensations: dict[str, JournalRecord] = field(factory=dict)
    compensating: bool = False
    end: JournalRecord | None = None
    records: list[JournalRecord] = field(factory=list)
    """Every record, in order (a record's line in the journal is its `seq` plus one)."""

    @classmethod
    def of(cls, records: list[JournalRecord]) -> Replay:
        begin = records[0]
        replay = cls(
            records=list(records),
            spec=begin.spec or "",
            request=begin.request or {},
            components=begin.components or {},
            capabilities=begin.capabilities or {},
            dry_run=bool(begin.dry_run),
            facts=dict(begin.facts or {}),  # seeded from a lifecycle operation's target
        )
        for record in records[1:]:
            if record.facts:
                replay.facts.update(record.facts)
            match record.event:
                case "step_start":
                    replay.interrupted = record.step
                case "step_end":
                    replay.completed.append(record)
                    replay.interrupted = None
                case "step_fail":
                    replay.failed = record
                    replay.interrupted = None
                    replay.compensating = True
                case "comp_start":
                    replay.compensating = True
                case "comp_end" | "comp_fail":
                    replay.compensations[record.step or ""] = record
                case "end":
                    replay.end = record
        return replay
