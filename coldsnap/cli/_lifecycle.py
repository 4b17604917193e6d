"""`coldsnap status`, `coldsnap stop`, `coldsnap sleep` and `coldsnap wake` (engines a restore
left serving, by serving name or workdir: coldsnap.cli._serving, coldsnap.cli._sleep) and
`coldsnap schema` (the request files' and events' JSON Schemas)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from . import _events, _schema, _serving, _sleep
from ._errors import reported


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _line(name: str | None, state: dict[str, Any]) -> str:
    running = "running" if state["running"] else "not running"
    if state["running"] and not state["listening"]:
        running += " (not listening yet)"
    parts = [name or state["workdir"], running]
    if state["running"] and state.get("sleep") == "asleep":
        parts.append("asleep (coldsnap wake)")
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


@click.command("stop")
@click.argument("target", metavar="NAME|WORKDIR")
def stop(target: str) -> None:
    """Stop an engine a restore left serving: its whole process tree, its runtime dir and
    its serving record; the workdir (journal, receipt, logs) stays. Holds the workdir's lock."""
    with reported(_debug):
        workdir, name = _serving.workdir_of(target)
        done = _serving.stop(workdir)
    what = name or str(workdir)
    if done["was_running"]:
        click.echo(f"stopped {what} (pid {done['pid']}, {done['url']})")
    else:
        click.echo(f"{what} was not running (pid {done['pid']})")


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


@click.command("sleep")
@click.argument("target", metavar="NAME|WORKDIR")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
def sleep(target: str, as_json: bool) -> None:
    """Release a restored engine's weights and KV cache through the plugin's release path: the
    server stays up, requests wait (health says 503), the memory is freed. `wake` gives it
    back."""
    with reported(_debug):
        workdir, name = _serving.workdir_of(target)
        done = _sleep.sleep(workdir)
    if as_json:
        click.echo(json.dumps(done))
        return
    what = name or str(workdir)
    if done["already"]:
        click.echo(f"{what} was already asleep")
        return
    device = "" if done["device_freed"] is None else f", device {_mib(done['device_freed'])}"
    click.echo(
        f"{what} asleep: released {_mib(done['host_bytes'])} of host weight pages{device}; "
        f"resident {_mib(done['rss_before'])} -> {_mib(done['rss_after'])}; "
        f"{done['seconds']:.3f} s; wake it with: coldsnap wake {what}"
    )


@click.command("wake")
@click.argument("target", metavar="NAME|WORKDIR")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
def wake(target: str, as_json: bool) -> None:
    """Refill a sleeping engine's weights from where its restore took them (the capsule's
    payload or the pinned checkpoint) through the plugin's resume path; wait until it is
    healthy."""
    with reported(_debug):
        workdir, name = _serving.workdir_of(target)
        done = _sleep.wake(workdir)
    if as_json:
        click.echo(json.dumps(done))
        return
    what = name or str(workdir)
    click.echo(f"{what} was awake" if done["already"] else
               f"{what} awake in {done['seconds']:.3f} s")  # fmt: skip


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
