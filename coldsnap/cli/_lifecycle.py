"""`coldsnap status`, `coldsnap stop`, `coldsnap sleep` and `coldsnap wake` (engines a restore
left serving, by serving name or workdir: coldsnap.cli._serving, coldsnap.cli._sleep) and
`coldsnap schema` (the request files' and events' JSON Schemas)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from coldsnap.machine import Receipt

from . import _events, _schema, _serving, _sleep
from ._errors import finish, reported
from ._operations import print_event


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _line(name: str | None, state: dict[str, Any]) -> str:
    running = "running" if state["running"] else "not running"
    if state["running"] and not state["listening"]:
        running += " (not listening yet)"
    parts = [name or state["workdir"], running]
    if state["running"] and state.get("sleep") != "awake":
        parts.append(f"{state['sleep']} (coldsnap wake)")
    if state.get("pending"):
        parts.append(f"unfinished: coldsnap resume {state['pending']}")
    if state.get("url"):
        parts.append(f"url {state['url']}")
    if state.get("pid"):
        parts.append(f"pid {state['pid']}")
    parts.append(f"{state.get('operation') or 'operation'} {state['state']}")
    return "  ".join(parts)


@click.command("status")
@click.argument("target", required=False, metavar="[NAME|WORKDIR]")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
def status(target: str | None, as_json: bool) -> None:
    """Whether an engine coldsnap restored runs: its URL, PID and the operation's state (from
    the workdir's journal and receipt). Without NAME|WORKDIR: every engine recorded as serving
    (in $COLDSNAP_SERVING_DIR, default /run/coldsnap/serving)."""
    with reported(_debug):
        if target is not None:
            workdir, name = _serving.workdir_of(target)
            rows = [{"name": name, **_serving.state(workdir)}]
        else:
            rows = [{"name": s.name, **_serving.state(Path(s.workdir))} for s in _serving.records()]
    if as_json:
        click.echo(json.dumps(rows[0] if target is not None else rows, indent=2))
        return
    if not rows:
        click.echo(f"nothing serving (no records in {_serving.serving_dir()})")
    for row in rows:
        click.echo(_line(row["name"], row))


def _run(operation: str, target: str, as_json: bool) -> tuple[Receipt, str]:
    """Runs `operation` on the engine `target` names, printing each ended step (or one JSON
    event per line); returns the receipt and what to call the engine."""
    with reported(_debug):
        workdir, name = _serving.workdir_of(target)
        printer = _events.print_json_event if as_json else print_event
        if operation == "stop":
            receipt = _serving.stop(workdir, [printer])
        else:
            receipt = _sleep.run(operation, workdir, [printer])
    return receipt, name or str(workdir)


def _already(target: str, operation: str) -> str | None:
    """Why `operation` has nothing to do on `target` (an engine stopped, asleep or awake
    already), or None."""
    with reported(_debug):
        workdir, name = _serving.workdir_of(target)
        ops = _sleep.operations(workdir)
    what = name or str(workdir)
    if _sleep.stopped(ops):
        return f"{what} was stopped"
    state = _sleep.sleep_state(ops)
    if operation == "sleep" and state == "asleep":
        return f"{what} was already asleep"
    if operation == "wake" and state == "awake":
        return f"{what} was awake"
    return None


def _end(receipt: Receipt, as_json: bool, line: str, extra: dict[str, Any]) -> None:
    if receipt.ok and not as_json:
        click.echo(line)
        return
    finish(receipt, extra if receipt.ok else None, events=as_json)


@click.command("stop")
@click.argument("target", metavar="NAME|WORKDIR")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
def stop(target: str, as_json: bool) -> None:
    """Stop an engine a restore left serving: its whole process tree, its runtime dir, what
    the driver left beside it and its serving record; the workdir (journal, receipt, logs)
    stays. Journaled in WORKDIR/ops/stop-N (`coldsnap resume` finishes one interrupted)."""
    already = _already(target, "stop")
    if already is not None:
        click.echo(already)
        return
    receipt, what = _run("stop", target, as_json)
    pid = receipt.facts.get("engine_pid")
    _end(receipt, as_json, f"stopped {what} (pid {pid})", {"pid": pid})


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


@click.command("sleep")
@click.argument("target", metavar="NAME|WORKDIR")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
def sleep(target: str, as_json: bool) -> None:
    """Release a restored engine's weights and KV cache through the plugin's release path: the
    server stays up, requests wait (health says 503), the memory is freed. `wake` gives it
    back. Journaled in WORKDIR/ops/sleep-N; a failure after the release resumes them."""
    already = _already(target, "sleep")
    if already is not None:
        click.echo(already)
        return
    receipt, what = _run("sleep", target, as_json)
    done = _sleep.sleep_summary(receipt)
    device = "" if done.get("device_freed") is None else f", device {_mib(done['device_freed'])}"
    _end(
        receipt,
        as_json,
        f"{what} asleep: released {_mib(done.get('host_bytes'))} of host weight pages{device}; "
        f"{receipt.seconds:.3f} s; wake it with: coldsnap wake {what}",
        {"sleep_record": done},
    )


@click.command("wake")
@click.argument("target", metavar="NAME|WORKDIR")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
def wake(target: str, as_json: bool) -> None:
    """Refill a sleeping engine's weights from where its restore took them (the capsule's
    payload, verified again, or the pinned checkpoint) through the plugin's resume path; wait
    until it is healthy. Journaled in WORKDIR/ops/wake-N; a failure leaves it asleep."""
    already = _already(target, "wake")
    if already is not None:
        click.echo(already)
        return
    receipt, what = _run("wake", target, as_json)
    _end(receipt, as_json, f"{what} awake in {receipt.seconds:.3f} s", {})


@click.command("schema")
@click.argument("operation", type=click.Choice([*sorted(_schema.CLASSES), "event"]))
@click.option("--write", is_flag=True, help=f"Write it to {_schema.SCHEMA_DIR}/ instead.")
def schema(operation: str, write: bool) -> None:
    """Print the JSON Schema of a capture or restore request file, or of one `--json` event
    line (docs/cli.md shows examples)."""
    if operation == "event":
        text, path = _events.schema_text(), _schema.SCHEMA_DIR / "event.schema.json"
    else:
        text, path = _schema.text(operation), _schema.path(operation)
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        click.echo(f"wrote {path}")
        return
    click.echo(text, nl=False)


__all__ = ["schema", "sleep", "status", "stop", "wake"]
