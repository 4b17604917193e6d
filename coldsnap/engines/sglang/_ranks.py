"""What the scheduler ranks of an SGLang engine reported: one status record per rank, written by
coldsnap's plugin (coldsnap._wire.status_path, named `scheduler-tp<rank>`), holding the rank's
pid, its place (tp_rank, tp_size) and the outcome of the last operation it took part in.

The machine counts ranks from these records, never from the engine's word that it is ready:
a rank that never reported, reported a failure, or whose process has ended is named.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
from attrs import frozen

from coldsnap._wire import ProcessStatus, StatusError, read_status_as_written, status_path
from coldsnap.backends.procs import host_pid
from coldsnap.engines import EngineError


@frozen
class RankReport:
    """One rank's status record as the machine reads it: `status` typed and checked
    (coldsnap._wire.ProcessStatus), `record` the same record as written."""

    name: str
    rank: int
    pid: int | None
    running: bool
    record: dict[str, Any]
    status: ProcessStatus

    @property
    def outcome(self) -> str | None:
        return self.status.outcome

    @property
    def last_event(self) -> str | None:
        return self.status.last_event

    def describe(self) -> str:
        return f"rank {self.rank} ({self.name}, pid {self.pid})"


def rank_names(tp: int) -> list[str]:
    """The status-record names of the scheduler ranks of a `tp`-rank engine."""
    return [f"scheduler-tp{rank}" for rank in range(tp)]


def read_ranks(
    step: str, runtime_dir: Path, tp: int, engine_pid: int | None
) -> tuple[list[RankReport], list[str]]:
    """(the reports found, one line per rank that has none) for ranks 0..tp-1; a rank runs when
    its pid is a live process of the engine's tree (`engine_pid` its root). EngineError (naming
    the file and the field) for a record that cannot be read or is not the plugin's."""
    found, missing = [], []
    for rank, name in enumerate(rank_names(tp)):
        path = status_path(runtime_dir, name)
        try:
            record, status = read_status_as_written(path)
        except FileNotFoundError:
            missing.append(f"rank {rank} ({name}): no status record at {path}")
            continue
        except StatusError as exc:
            raise EngineError(step, str(exc)) from None
        running = _why_not_running(status.pid, engine_pid) is None
        found.append(RankReport(name, rank, status.pid, running, record, status))
    return found, missing


def scheduler_statuses(runtime_dir: Path, step: str) -> dict[str, ProcessStatus]:
    """process name -> the typed status record of every scheduler (one per TP rank);
    EngineError of `step` naming a record that cannot be read or is not the plugin's."""
    folder = status_path(runtime_dir, "scheduler").parent
    out: dict[str, ProcessStatus] = {}
    for path in sorted(folder.glob("scheduler*.json")):
        try:
            out[path.stem] = read_status_as_written(path)[1]
        except (FileNotFoundError, StatusError) as exc:
            raise EngineError(step, str(exc)) from None
    return out


def extra_ranks(runtime_dir: Path, tp: int) -> list[str]:
    """Scheduler records beyond ranks 0..tp-1: an engine with more ranks than the request's."""
    folder = status_path(runtime_dir, "scheduler").parent
    expected = set(rank_names(tp))
    return sorted(p.stem for p in folder.glob("scheduler*.json") if p.stem not in expected)


def absent_ranks(engine_pid: int | None, pids: Mapping[str, Any], tp: int) -> list[str]:
    """One line per rank 0..tp-1 that `pids` (process name -> pid, as the capsule carries
    them) does not name or whose process is not a live process of the engine's tree."""
    lines = []
    for rank, name in enumerate(rank_names(tp)):
        pid = pids.get(name)
        if not isinstance(pid, int) or isinstance(pid, bool):
            lines.append(f"rank {rank} ({name}): the capsule names no pid for it")
        elif (why := _why_not_running(pid, engine_pid)) is not None:
            lines.append(f"rank {rank} ({name}, pid {pid}) is not running: {why}")
    return lines


def census(
    runtime_dir: Path | str | None,
    tp: int,
    engine_pid: int | None,
    pids: Mapping[str, Any] | None = None,
) -> str:
    """A sentence naming each rank whose process has ended ("" when all run), appended to the
    error of a step that failed talking to the engine: from the captured pids when given,
    else from the ranks' status records."""
    if tp < 1:
        return ""
    if pids:
        lines = absent_ranks(engine_pid, pids, tp)
    elif runtime_dir:
        try:
            found, lines = read_ranks("census", Path(runtime_dir), tp, engine_pid)
        except EngineError as exc:
            return f"; the ranks' records cannot be read: {exc}"
        lines = [f"{r.describe()} is not running" for r in found if not r.running] + lines
    else:
        return ""
    return "; " + "; ".join(lines) if lines else ""


def _why_not_running(pid: int, engine_pid: int | None) -> str | None:
    """None when `pid` is a live process of the engine's tree (the root `engine_pid` or one of
    its descendants: a reused pid is not taken for the rank), else why not. (SGLang renames
    its processes, which overwrites their environment, so the tree is what identifies them.
    The records and the capsule hold the pids a rank sees: in an engine restored into a PID
    namespace of its own, they are mapped to this host's through the engine's tree.)"""
    try:
        if engine_pid is not None:
            pid = host_pid(engine_pid, pid)
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return "it has ended (zombie)"
        if engine_pid is None or pid == engine_pid:
            return None
        root = psutil.Process(engine_pid)
        if pid not in {p.pid for p in root.children(recursive=True)}:
            return f"pid {pid} is not in the engine's tree (root {engine_pid})"
    except psutil.NoSuchProcess:
        return "no such process"
    return None


__all__ = ["RankReport", "absent_ranks", "census", "extra_ranks", "rank_names", "read_ranks"]
