"""Commands: capture, restore, resume, docs, demo. Parsing is click's; the work is the Machine's."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from coldsnap.machine import SPECS, Machine, Receipt, StepEvent, document, parse_request

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


def _components(request: Any, dry_run: bool) -> dict[str, Any]:
    if dry_run:
        from coldsnap.drivers.memory import MemoryWorld, memory_components

        return memory_components(MemoryWorld(), request.driver, request.provider, request.engine)
    from ._components import real_components

    return real_components(request)


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
@click.option("--dry-run", is_flag=True, help="Run on the in-memory driver: touches nothing.")
def capture(request_file: Any, dry_run: bool) -> None:
    """Capture an engine as described by REQUEST_FILE (JSON)."""
    request = parse_request(json.load(request_file))
    machine = Machine(**_components(request, dry_run), subscribers=[_print_event])
    _finish(machine.capture(request))


@main.command()
@click.argument("request_file", type=click.File())
@click.option("--dry-run", is_flag=True, help="Run on the in-memory driver: touches nothing.")
def restore(request_file: Any, dry_run: bool) -> None:
    """Restore a capsule as described by REQUEST_FILE (JSON)."""
    request = parse_request(json.load(request_file))
    machine = Machine(**_components(request, dry_run), subscribers=[_print_event])
    _finish(machine.restore(request))


@main.command()
@click.argument("workdir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def resume(workdir: Path) -> None:
    """Resume (or compensate) the operation journaled in WORKDIR."""
    from coldsnap.machine import JOURNAL_NAME, read_journal

    request = parse_request(read_journal(workdir / JOURNAL_NAME)[0].request or {})
    machine = Machine(**_components(request, False), subscribers=[_print_event])
    _finish(machine.resume(workdir))


@main.command()
@click.option("--check", is_flag=True, help="Fail if the file on disk is stale.")
@click.option("--out", type=click.Path(path_type=Path), default=DOCS, show_default=True)
def docs(check: bool, out: Path) -> None:
    """Generate docs/state-machines.md (mermaid diagrams and step tables) from the specs."""
    text = document(SPECS.values())
    if check:
        if not out.exists() or out.read_text() != text:
            raise click.ClickException(f"{out} is stale: run `coldsnap docs`")
        click.echo(f"{out} is up to date")
        return
    out.write_text(text)
    click.echo(f"wrote {out}")


@main.command()
@click.option("--dry-run", is_flag=True, help="Capture and restore on the in-memory driver.")
def demo(dry_run: bool) -> None:
    """Capture and restore a tiny real SGLang server; print cold-start vs restore time."""
    from ._demo import run_demo

    sys.exit(run_demo(dry_run=dry_run))
