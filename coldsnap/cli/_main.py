"""Commands: capture, restore, resume, plan, docs, demo, doctor, ls, show, rm, gc, status, logs,
stop, sleep, wake, schema, push, pull. Parsing is click's; the work is the Machine's, over the
components the registry builds for each request (doctor checks the host; ls, show, rm and gc read
the store; status, logs, stop, sleep and wake act on what a restore left serving; push and pull
move capsules between a store and an OCI registry)."""

from __future__ import annotations

import atexit
import gc
import importlib
import sys
from pathlib import Path

import click

from coldsnap.machine import (
    JOURNAL_NAME,
    REGISTRY,
    Machine,
    document,
    parse_request,
    read_journal,
)

from . import _serving
from ._errors import finish, reported
from ._operations import load, print_event
from ._signals import interrupts

DOCS = Path(__file__).resolve().parents[2] / "docs" / "state-machines.md"

COMMANDS = {
    "capture": "._operations:capture",
    "restore": "._operations:restore",
    "doctor": "._doctor:doctor",
    "ls": "._store_cmds:ls",
    "show": "._store_cmds:show",
    "rm": "._store_cmds:rm",
    "gc": "._store_cmds:gc",
    "status": "._lifecycle:status",
    "stop": "._lifecycle:stop",
    "sleep": "._lifecycle:sleep",
    "wake": "._lifecycle:wake",
    "schema": "._lifecycle:schema",
    "logs": "._logs:logs",
    "push": "._push_pull:push",
    "pull": "._push_pull:pull",
}
"""The commands defined in other modules, each imported when it is run (or listed by --help):
a command pays for its own module, not for every command's (doctor, the store commands)."""


class _Commands(click.Group):
    """The command group, with `COMMANDS` loaded on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, name = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module, __package__), name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{COMMANDS[cmd_name]} is not a click command")
        return command


@click.group(cls=_Commands)
@click.version_option(package_name="coldsnap", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Snapshot and restore initialized inference servers.

    Exit codes: 0 done, 2 bad request, 3 rolled back, 4 failed with leftovers, 5 environment
    missing, 1 any other error."""
    ctx.obj = {"debug": debug}
    _no_collection_at_exit()


def _no_collection_at_exit() -> None:
    """A command's process ends without collecting its garbage: the interpreter's shutdown
    runs full collections over every object the imports made (about 50,000, 0.1-0.15 s of a
    restore's command on a loaded 2-core host), to free memory the exit frees anyway. Frozen
    objects are only left out of the collector's passes: the atexit hooks registered before
    this one still run after it (weakref finalizers, filelock's and logging's), and objects no
    cycle holds are still freed as the modules are cleared."""
    atexit.unregister(gc.freeze)  # once, however many commands a process runs (tests)
    atexit.register(gc.freeze)


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


@main.command()
@click.argument("workdir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def resume(workdir: Path) -> None:
    """Resume (or compensate) the operation journaled in WORKDIR: a capture or restore, or a
    stop, sleep or wake (journaled under the restore's workdir, in ops/<operation>-<n>)."""
    with reported(_debug):
        request = parse_request(read_journal(workdir / JOURNAL_NAME)[0].request or {})
        with interrupts(str(workdir)) as cancel:
            machine = Machine.for_request(request, subscribers=[print_event])
            receipt = machine.resume(workdir, cancel=cancel)
        _serving.after_resume(request, workdir)  # what stop and restore do once they end
    finish(receipt)


@main.command()
@click.argument("request_file", type=click.Path(dir_okay=False, allow_dash=True))
def plan(request_file: str) -> None:
    """Print the steps REQUEST_FILE (JSON) would run, with their guards, needs and makes.

    The registered components are built to evaluate the guards; nothing is run."""
    from ._plan import plan_text

    with reported(_debug):
        request = load(request_file)
        spec = REGISTRY.spec(request.operation, request)
        text = plan_text(spec, request, REGISTRY.components(request).by_role())
    click.echo(text)


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
