"""An append-only JSON-lines journal of every step, fsynced, so a new machine can pick up a run.

The journal is the only state a run keeps outside memory: replaying it tells which steps ended,
which one was interrupted, which compensations ran and the facts recorded so far.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from attrs import define, field, frozen

from ._errors import JournalError

JOURNAL_NAME = "journal.jsonl"
RECORD_KIND = "coldsnap.journal-record"
RECORD_FORMAT = 1

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
    detail: str | None = None
    spec: str | None = None
    request: dict[str, Any] | None = None
    outcome: str | None = None
    format: int = RECORD_FORMAT
    kind: str = RECORD_KIND


class Journal:
    """Appends records; each is flushed and fsynced before the call returns."""

    def __init__(self, path: Path, next_seq: int = 0) -> None:
        self.path = path
        self._seq = next_seq

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
        records = read_journal(workdir / JOURNAL_NAME)
        return cls(workdir / JOURNAL_NAME, records[-1].seq + 1 if records else 0), records

    def append(self, event: Event, **fields: Any) -> JournalRecord:
        record = JournalRecord(seq=self._seq, at=time.time(), event=event, **fields)
        data = {k: v for k, v in _as_dict(record).items() if v is not None}
        line = json.dumps(data, sort_keys=True, default=str) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._seq += 1
        return record


def _as_dict(record: JournalRecord) -> dict[str, Any]:
    from ._convert import unstructure

    return unstructure(record)


def read_journal(path: Path) -> list[JournalRecord]:
    """Reads a journal; a torn last line (the writer died mid-write) is dropped; others fail."""
    from ._convert import converter

    if not path.exists():
        raise JournalError(f"no journal at {path}")
    lines = path.read_text().splitlines()
    records: list[JournalRecord] = []
    for number, line in enumerate(lines, 1):
        try:
            data = json.loads(line)
            if data.get("kind") != RECORD_KIND or data.get("format") != RECORD_FORMAT:
                raise ValueError(f"kind/format {data.get('kind')!r}/{data.get('format')!r}")
            records.append(converter.structure(data, JournalRecord))
        except Exception as exc:
            if number == len(lines):
                break
            raise JournalError(f"{path}:{number}: not a journal record ({exc})") from None
    if not records or records[0].event != "begin":
        raise JournalError(f"{path}: the journal does not start with a 'begin' record")
    return records


@define
class Replay:
    """What a journal says happened, in the terms the runner resumes from."""

    spec: str
    request: dict[str, Any]
    facts: dict[str, Any] = field(factory=dict)
    completed: list[JournalRecord] = field(factory=list)
    interrupted: str | None = None
    failed: JournalRecord | None = None
    compensations: dict[str, JournalRecord] = field(factory=dict)
    compensating: bool = False
    end: JournalRecord | None = None

    @classmethod
    def of(cls, records: list[JournalRecord]) -> Replay:
        begin = records[0]
        replay = cls(spec=begin.spec or "", request=begin.request or {})
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
