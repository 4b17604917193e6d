"""`push NAME REF` and `pull REF`: capsules between a store and an OCI registry
(coldsnap.oci). Each shows its steps as capture and restore do (the running step live, a line
per ended step; `--json`: one event per line, the last `finished` with the result) and ends
with one JSON line of its result."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import click

from coldsnap.machine import RequestError, StepEvent

from ._errors import reported, say
from ._events import EventLine, dumps, print_json_event
from ._progress import LiveSteps
from ._store_cmds import STORE_OPTION

if TYPE_CHECKING:
    from coldsnap.oci import Note, Reference

_PLAIN_HTTP = click.option(
    "--plain-http",
    is_flag=True,
    help="Speak HTTP, not HTTPS, to the registry (one served without TLS, as a local one).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _reference(text: str) -> Reference:
    from coldsnap.oci import parse_reference

    try:
        return parse_reference(text)
    except ValueError as exc:
        raise RequestError([("REF", str(exc))]) from None


@contextlib.contextmanager
def _watching(as_json: bool) -> Iterator[Callable[[Note], None]]:
    """The subscriber of a push or pull: its notes as the step events capture and restore
    show (live, or as JSON lines)."""

    def event(note: Note) -> StepEvent:
        return StepEvent(operation=note.operation, spec=note.operation, step=note.step,
                         phase=note.phase, seconds=note.seconds, detail=note.detail,
                         facts=note.facts)  # fmt: skip

    if as_json:
        yield lambda note: print_json_event(event(note))
        return
    with LiveSteps() as live:
        yield lambda note: live(event(note))


def _finish(operation: str, result: dict[str, Any], began: float, as_json: bool) -> None:
    if as_json:
        line = EventLine(event="finished", operation=operation, spec=operation,
                         status=result["outcome"], seconds=round(time.monotonic() - began, 6),
                         at=time.time(), result=result)  # fmt: skip
        click.echo(dumps(line))
    else:
        click.echo(json.dumps(result))


@contextlib.contextmanager
def _failing(operation: str, began: float, as_json: bool) -> Iterator[None]:
    """Under --json a failed push or pull still ends with its `finished` event (outcome
    failed, the error), then the error's line and exit code as every command's."""
    try:
        yield
    except Exception as exc:
        if as_json:
            _finish(operation, {"outcome": "failed", "error": str(exc)}, began, as_json)
        raise


@click.command()
@click.argument("name")
@click.argument("ref")
@STORE_OPTION
@_PLAIN_HTTP
@_JSON
def push(name: str, ref: str, store: Path, plain_http: bool, as_json: bool) -> None:
    """Send the capsule NAME (a tag, a digest or a short digest) to REF, an OCI registry's
    HOST[:PORT]/REPOSITORY[:TAG], as an artifact: only the blobs the registry lacks are sent.
    Credentials as docker reads them (docker login, ~/.docker/config.json, DOCKER_CONFIG)."""
    began = time.monotonic()
    with reported(_debug), _failing("push", began, as_json):
        from coldsnap import oci
        from coldsnap.artifacts import NoCapsule

        from ._store_cmds import _open

        where = _reference(ref)
        local = _open(store)
        try:
            local.lookup(name)  # a name that names no capsule is a bad request, as for restore
        except NoCapsule as exc:
            raise RequestError([("NAME", str(exc))]) from None
        repository = oci.Repository(where, plain_http=plain_http)
        with _watching(as_json) as notify:
            pushed = oci.push(local, name, where, repository, notify)
    result = {"outcome": "done", **attrs.asdict(pushed)}
    if not as_json:
        click.echo(
            f"pushed {name} ({pushed.capsule}) to {pushed.reference}: {pushed.sent.count} blobs "
            f"sent ({pushed.sent.bytes} bytes), {pushed.present.count} already there"
        )
    _finish("push", result, began, as_json)


@click.command()
@click.argument("ref")
@click.option("--name", help="The tag in the store (default: the tag it was pushed from).")
@STORE_OPTION
@_PLAIN_HTTP
@_JSON
def pull(ref: str, name: str | None, store: Path, plain_http: bool, as_json: bool) -> None:
    """Bring the capsule at REF (HOST[:PORT]/REPOSITORY[:TAG] or @sha256:...) into the store,
    every blob checked against its digest before it is tagged: a refused pull leaves the store
    as it was. Blobs the store holds are not fetched again."""
    began = time.monotonic()
    with reported(_debug), _failing("pull", began, as_json):
        from coldsnap import oci
        from coldsnap.artifacts import tag_problem

        if name is not None and (problem := tag_problem(name)):
            raise RequestError([("--name", problem)])
        where = _reference(ref)
        repository = oci.Repository(where, plain_http=plain_http)
        with _watching(as_json) as notify:
            pulled = oci.pull(store, where, repository, notify, name=name)
    result = {"outcome": "done", "store": str(store), **attrs.asdict(pulled)}
    if not as_json:
        if pulled.replaced:
            say(f"tag {pulled.tag} named {pulled.replaced} before; it names the pulled one now")
        click.echo(
            f"pulled {pulled.reference} as {pulled.tag} ({pulled.capsule}): "
            f"{pulled.fetched.count} blobs fetched ({pulled.fetched.bytes} bytes), "
            f"{pulled.known.count + pulled.rehashed.count} already in the store"
        )
    _finish("pull", result, began, as_json)


__all__ = ["pull", "push"]
