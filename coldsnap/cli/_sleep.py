"""`coldsnap stop`, `coldsnap sleep` and `coldsnap wake` of an engine a restore left serving:
each builds a request on the restore's workdir (its target) and runs it through the Machine,
which runs the driver's stop spec or the engine's sleep and wake specs, journaled in
`<target>/ops/<operation>-<n>` (so `coldsnap resume` finishes or rolls back one whose
orchestrator died). Nothing here talks to the engine.

Whether an engine is asleep is read from those journals: the last sleep or wake on a target
says it (a sleep done or a wake rolled back: asleep; a wake done or a sleep rolled back: awake).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attrs import frozen

from coldsnap.machine import (
    JOURNAL_NAME,
    JournalError,
    Machine,
    Receipt,
    Replay,
    RequestError,
    StepEvent,
    lifecycle_request,
    read_journal,
)

OPS = "ops"
"""Where the lifecycle operations on a target are journaled: `<target>/ops/<operation>-<n>`."""
LIFECYCLE = ("stop", "sleep", "wake")


@frozen
class Op:
    """One lifecycle operation journaled on a target: where, which, when it began, and how it
    ended (None while it has no end: running, or its orchestrator died)."""

    workdir: Path
    operation: str
    began: float
    outcome: str | None
    interrupted: str | None


def operations(target: Path) -> list[Op]:
    """The stop, sleep and wake operations journaled on `target`, oldest first."""
    folder = target / OPS
    found: list[Op] = []
    for journal in sorted(folder.glob(f"*/{JOURNAL_NAME}")) if folder.is_dir() else ():
        operation = journal.parent.name.rsplit("-", 1)[0]
        if operation not in LIFECYCLE:
            continue
        try:
            records = read_journal(journal)
        except JournalError:
            continue  # an operation that died before its journal's first record: never began
        if not records:
            continue
        replay = Replay.of(records)
        outcome = replay.end.outcome if replay.end is not None else None
        found.append(Op(journal.parent, operation, records[0].at, outcome, replay.interrupted))
    return sorted(found, key=lambda op: op.began)


def unfinished(target: Path) -> Op | None:
    """The lifecycle operation on `target` that has no end (its orchestrator died), if any."""
    return next((op for op in reversed(operations(target)) if op.outcome is None), None)


def sleep_state(ops: Iterable[Op]) -> str:
    """'asleep' or 'awake' by the last sleep or wake; 'unknown' when it failed with leftovers
    or has not ended."""
    last = next((op for op in reversed(list(ops)) if op.operation in ("sleep", "wake")), None)
    if last is None:
        return "awake"
    if last.outcome == "done":
        return "asleep" if last.operation == "sleep" else "awake"
    if last.outcome == "rolled_back":
        return "awake" if last.operation == "sleep" else "asleep"
    return "unknown"


def stopped(ops: Iterable[Op]) -> bool:
    """Whether a stop on the target is done."""
    return any(op.operation == "stop" and op.outcome == "done" for op in ops)


def run(
    operation: str, target: Path, subscribers: Iterable[Callable[[StepEvent], None]] = ()
) -> Receipt:
    """Runs `operation` (stop, sleep or wake) on the engine of `target` through the Machine,
    with the components the target's request names. Refused (RequestError naming `target`)
    while an earlier lifecycle operation on it has not ended: that one is resumed first."""
    pending = unfinished(target)
    if pending is not None:
        where = f" at step {pending.interrupted}" if pending.interrupted else ""
        raise RequestError(
            [
                (
                    "target",
                    f"{target}: its {pending.operation} {pending.workdir} did not end{where}; "
                    f"finish it first with: coldsnap resume {pending.workdir}",
                )
            ]
        )
    request = lifecycle_request(operation, target)
    machine = Machine.for_request(request, subscribers=list(subscribers))
    return getattr(machine, operation)(request)  # type: ignore[no-any-return]


def sleep_summary(receipt: Receipt) -> dict[str, Any]:
    """What a sleep's receipt says it released (its sleep record), for the command's output."""
    return dict(receipt.facts.get("sleep_record") or {})


__all__ = [
    "LIFECYCLE",
    "OPS",
    "Op",
    "operations",
    "run",
    "sleep_state",
    "sleep_summary",
    "stopped",
    "unfinished",
]
