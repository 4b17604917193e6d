"""Commands: capture, restore, resume, plan, docs, demo. Parsing is click's; the work is the
Machine's, over the components the registry builds for each request."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from coldsnap.machine import (
    JOURNAL_NAME,
    REGISTRY,
    Machine,
    Receipt,
    StepEvent,
    document,
    parse_request,
    read_journal,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "state-machines.md"


@click.group()
def main() -> None:
    """Snapshot and restore initialized inference servers."""


def _print_event(event: StepEvent) -> None:
    if event.phase in ("done", "skipped", "failed", "compensated", "compensation_failed"):
        detail = f"  ({event.detail})" if event.detail else ""
        click.echo(
            f"  {event.spec:<13} {event.step:<20} {event.phase:<20} {event.seconds:7.3f} s{detail}"
        )


def _finish(receipt: Receipt) -> None:
    click.echo(
        json.dumps(
            {
                "outcome": receipt.outcome,
                "error": receipt.error,
                "seconds": round(receipt.seconds, 3),
                "workdir": receipt.workdir,
            }
        )
    )
    sys.exit(0 if receipt.ok else 1)


@main.command()
@click.argument("request_file", type=click.File())
def capture(request_file: Any) -> None:
    """Capture an engine as described by REQUEST_FILE (JSON)."""
    request = parse_request(json.load(request_file))
    machine = Machine.for_request(request, subscribers=[_print_event])
    _finish(machine.capture(request))


@main.command()
@click.argument("request_file", type=click.File())
def restore(request_file: Any) -> None:
    """Restore a capsule as described by REQUEST_FILE (JSON)."""
    request = parse_request(json.load(request_file))
    machine = Machine.for_request(request, subscribers=[_print_event])
    _finish(machine.restore(request))


@main.command()
@click.argument("workdir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def resume(workdir: Path) -> None:
    """Resume (or compensate) the operation journaled in WORKDIR."""
    request = parse_request(read_journal(workdir / JOURNAL_NAME)[0].request or {})
    machine = Machine.for_request(request, subscribers=[_print_event])
    _finish(machine.resume(workdir))


@main.command()
@click.argument("request_file", type=click.File())
def plan(request_file: Any) -> None:
    """Print the steps REQUEST_FILE (JSON) would run, with their guards, needs and makes.

    The registered components are built to evaluate the guards; nothing is run."""
    from ._plan import plan_text

    request = parse_request(json.load(request_file))
    spec = REGISTRY.spec(request.operation, request.driver)
    click.echo(plan_text(spec, request, REGISTRY.components(request).by_role()))


@main.command()
@click.option("--check", is_flag=True, help="Fail if the file on disk is stale.")
@click.option("--out", type=click.Path(path_type=Path), default=DOCS, show_default=True)
def docs(check: bool, out: Path) -> None:
    """Generate docs/state-machines.md (mermaid diagrams and step tables) from the specs of
    the registered drivers."""
    text = document(REGISTRY.specs())
    if check:
        if not out.exists() or out.read_text() != text:
            raise click.ClickException(f"{out} is stale: run `coldsnap docs`")
        click.echo(f"{out} is up to date")
        return
    out.write_text(text)
    click.echo(f"wrote {out}")


@main.command()
def demo() -> None:
    """Capture and restore a tiny real SGLang server; print cold-start vs restore time."""
    from ._demo import run_demo

    sys.exit(run_demo())
