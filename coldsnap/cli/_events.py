"""`--json` on capture and restore: one JSON object per line per step event, for a program
that follows an operation as it runs. Each line is an `EventLine` (`kind` coldsnap.event,
`format` 2; its JSON Schema is docs/schema/event.schema.json); the last line is the
`finished` event, which carries the receipt and the command's result (URL, PID, ...)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import click
from attrs import frozen

from coldsnap.machine import Receipt, StepEvent

EVENT_FORMAT = 2
"""2: `detail` is an object (format 1 had a text, "k=v, ..." for a step's facts)."""
EVENTS = {
    "started": "step_started",
    "done": "step_ended",
    "skipped": "step_ended",
    "failed": "step_failed",
    "compensating": "compensation_started",
    "compensated": "step_compensated",
    "compensation_failed": "compensation_failed",
    "progress": "step_progress",
}
"""The machine's step phases, as events on the wire."""


@frozen(kw_only=True)
class EventLine:
    """One event of a capture or restore as it runs."""

    KIND: ClassVar[str] = "coldsnap.event"

    event: str
    """step_started, step_ended, step_failed, compensation_started, step_compensated,
    compensation_failed, step_progress, or finished (the last line)."""
    operation: str
    spec: str
    step: str = ""
    status: str = ""
    """For step_ended: done or skipped; for finished: the outcome."""
    seconds: float = 0.0
    detail: dict[str, Any] = attrs.field(factory=dict)
    """For step_progress: the facts the step recorded, by name, or {"message": text} for what a
    step shows as it runs; for step_failed and compensation_failed: {"message": the error};
    else empty."""
    at: float = 0.0
    """Unix time the command saw the event."""
    result: dict[str, Any] | None = None
    """For finished: the command's result (outcome, error, workdir, and for a restore the URL,
    PID, capsule digest and timings)."""
    receipt: dict[str, Any] | None = None
    """For finished: the receipt, as receipt.json holds it."""
    format: int = EVENT_FORMAT
    kind: str = "coldsnap.event"


def line_of(event: StepEvent) -> EventLine | None:
    """The wire event of a step event; None for the machine's own `finished`, which the
    command replaces with one that carries the receipt."""
    name = EVENTS.get(event.phase)
    if name is None:
        return None
    status = event.phase if name == "step_ended" else ""
    if event.facts is not None:
        detail: dict[str, Any] = dict(event.facts)
    else:
        detail = {"message": event.detail} if event.detail else {}
    return EventLine(event=name, operation=event.operation, spec=event.spec, step=event.step,
                     status=status, seconds=round(event.seconds, 6), detail=detail,
                     at=time.time())  # fmt: skip


def finished(receipt: Receipt, result: Mapping[str, Any]) -> EventLine:
    return EventLine(event="finished", operation=receipt.operation, spec=receipt.spec,
                     status=receipt.outcome, seconds=round(receipt.seconds, 6), at=time.time(),
                     result=dict(result), receipt=attrs.asdict(receipt))  # fmt: skip


def dumps(line: EventLine) -> str:
    return json.dumps(attrs.asdict(line), separators=(",", ":"))


def print_json_event(event: StepEvent) -> None:
    """A step-event subscriber: one JSON line on stdout per event."""
    line = line_of(event)
    if line is not None:
        click.echo(dumps(line))


def schema() -> dict[str, Any]:
    from ._schema import object_schema

    body = object_schema(EventLine)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://coldsnap.dev/schema/event.json",
        "title": "coldsnap event (one line of `--json` output)",
        "description": (EventLine.__doc__ or "").strip(),
        **body,
    }


def schema_text() -> str:
    return json.dumps(schema(), indent=2) + "\n"


__all__ = ["EVENTS", "EVENT_FORMAT", "EventLine", "dumps", "finished", "line_of",
           "print_json_event", "schema", "schema_text"]  # fmt: skip
