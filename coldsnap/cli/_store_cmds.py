"""Store commands that need no engine: `ls` (the capsules of a store), `show NAME` (one capsule's
identity and members), `rm` and `gc` (remove what no capsule reaches). They read the store through
coldsnap.artifacts and the capture record a capsule carries (coldsnap.capsules), and open it as
it is (`Store.open`): a directory that is not a store is refused, never made into one. Each
takes the store capture and restore default to; a capsule is named by a tag, a digest or a
short digest as `ls` prints it."""

from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from coldsnap._paths import DEFAULT_STORE
from coldsnap.artifacts import (
    DIGEST_PREFIX,
    ArtifactError,
    Capsule,
    NoCapsule,
    Store,
    Tally,
    converter,
    from_json,
)
from coldsnap.capsules import RECORD_NAME, CaptureRecord
from coldsnap.machine import RequestError

from . import _serving
from ._errors import OTHER, reported, say

STORE_OPTION = click.option(
    "--store",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STORE,
    show_default=True,
    help="The store directory (the one capture and restore default to).",
)


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _open(store: Path) -> Store:
    """The store at `store`, as it is. One that does not exist is a bad request (a mistyped
    --store); one this user may not read is Store.open's to explain (owner and mode)."""
    try:
        os.lstat(store)
    except FileNotFoundError:
        problem = f"no store at {store}: it does not exist (a capture makes it)"
        raise RequestError([("--store", problem)]) from None
    except PermissionError:
        pass
    return Store.open(store)


def lookup(store: Store, name: str) -> str:
    """The digest of the capsule `name` names (a tag, a digest or a short digest as `ls` prints
    it): what show, rm and restore resolve NAME with. One it names none of (listing the tags),
    or a short digest several digests begin with (naming them), is a bad request."""
    try:
        return store.lookup(name)
    except NoCapsule as exc:
        raise RequestError([("NAME", str(exc))]) from None


def capsule_ref(store: Store, name: str) -> str:
    """What a restore asks the store for when NAME is given: a tag as it is (the restore serves
    under it by default), anything else as the full digest `lookup` resolves it to (a short
    digest would name another capsule once a later one begins with the same digits)."""
    digest = lookup(store, name)
    return name if name in store.tag_names() else digest


def _record(store: Store, capsule: Capsule) -> CaptureRecord | None:
    """The capture record the capsule carries, None when it has none."""
    try:
        member = capsule.member(RECORD_NAME)
    except KeyError:
        return None
    return from_json(store.read_bytes(member.digest), CaptureRecord)


def capture_record(store: Store, ref: str) -> CaptureRecord | None:
    """The capture record of the capsule `ref` (a tag or digest) names; None without one."""
    return _record(store, store.capsule(ref))


def _created(store: Store, digest: str) -> str:
    marker = store.root / "capsules" / digest.removeprefix(DIGEST_PREFIX)
    stamp = datetime.fromtimestamp(os.stat(marker).st_mtime, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def summary(store: Store, digest: str, tags: list[str]) -> dict[str, Any]:
    """One capsule as `ls` and `show` print it: tags, digest, size, who captured what, when."""
    capsule = store.capsule(digest)
    record = _record(store, capsule)
    identity = capsule.identity
    return {
        "tags": tags,
        "digest": digest,
        "bytes": sum(m.size for m in capsule.members),
        "driver": record.driver if record else identity.snapshot.name if identity else None,
        "provider": record.provider if record else None,
        "engine": record.engine if record else identity.engine.name if identity else None,
        "model_id": record.model_id if record else identity.model.model_id if identity else None,
        "revision": record.revision if record else identity.model.revision if identity else None,
        "serves_on": _serves_on(record),
        "created": _created(store, digest),
    }


def _serves_on(record: CaptureRecord | None) -> str | None:
    """Where a restore serves by default: the captured launch command line's host and port."""
    if record is None or (record.serve_port is None and record.serve_host is None):
        return None
    return f"{record.serve_host or '127.0.0.1'}:{record.serve_port or '(capture port)'}"


def _tags_by_capsule(
    store: Store, damaged: list[tuple[str, str]] | None = None
) -> dict[str, list[str]]:
    """The tags naming each capsule. With `damaged`, a tag that cannot be read is added there
    and the others are still read; without it, it is an error."""
    if damaged is None:
        return _tags_by_capsule_strict(store)
    out: dict[str, list[str]] = defaultdict(list)
    for tag in store.tag_names():
        try:
            out[store.resolve(tag)].append(tag)
        except ArtifactError as exc:
            damaged.append((f"tag {tag!r}", str(exc)))
    return out


def _tags_by_capsule_strict(store: Store) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for tag, digest in store.tags().items():
        out[digest].append(tag)
    return out


@click.command("ls")
@STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
def ls(store: Path, as_json: bool) -> None:
    """List the capsules in a store: tag, digest, size, driver, provider, model, created. A
    capsule that cannot be read is listed as damaged, with why on stderr, and the others still
    are; the exit status is then 1."""
    with reported(_debug):
        found = _open(store)
        damaged: list[tuple[str, str]] = []
        tags = _tags_by_capsule(found, damaged)
        rows: list[dict[str, Any]] = []
        for digest in found.capsules():
            try:
                rows.append(summary(found, digest, tags.get(digest, [])))
            except ArtifactError as exc:
                damaged.append((f"capsule {digest}", str(exc)))
                rows.append({"tags": tags.get(digest, []), "digest": digest, "damaged": str(exc)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo(f"no capsules in {store}")
    else:
        _table(rows)
    for what, why in damaged:
        say(f"{what} is damaged: {why}")
    if damaged:
        sys.exit(OTHER)


def _table(rows: list[dict[str, Any]]) -> None:
    header = ("TAG", "DIGEST", "SIZE", "DRIVER", "PROVIDER", "MODEL", "CREATED")
    table = [header] + [
        (
            ",".join(r["tags"]) or "-",
            r["digest"].removeprefix(DIGEST_PREFIX)[:12],
            *(
                ("DAMAGED", "-", "-", "-", "-")
                if "damaged" in r
                else (
                    _size(r["bytes"]),
                    r["driver"] or "-",
                    r["provider"] or "-",
                    f"{r['model_id'] or '-'}@{r['revision'] or '-'}",
                    r["created"],
                )
            ),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@click.command("show")
@click.argument("name")
@STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def show(name: str, store: Path, as_json: bool) -> None:
    """Show one capsule (by tag, digest or short digest): its identity and a summary of its
    members."""
    with reported(_debug):
        found = _open(store)
        digest = lookup(found, name)
        capsule = found.capsule(digest)
        about = summary(found, digest, _tags_by_capsule(found).get(digest, []))
        roles: dict[str, dict[str, int]] = {}
        for m in capsule.members:
            role = roles.setdefault(m.role, {"count": 0, "bytes": 0})
            role["count"] += 1
            role["bytes"] += m.size
        identity = converter.unstructure(capsule.identity) if capsule.identity else None
    if as_json:
        click.echo(json.dumps({**about, "members": roles, "identity": identity}, indent=2))
        return
    keys = ("digest", "tags", "driver", "provider", "engine", "model_id", "revision", "serves_on")
    for key in keys:
        value = about[key]
        click.echo(f"{key + ':':<10} {', '.join(value) if isinstance(value, list) else value}")
    click.echo(f"{'size:':<10} {_size(about['bytes'])} ({about['bytes']} bytes)")
    click.echo(f"{'created:':<10} {about['created']}")
    click.echo("members:")
    for role, counted in sorted(roles.items()):
        click.echo(f"  {role:<14} {counted['count']:>5} files  {_size(counted['bytes'])}")
    if identity is None:
        click.echo("identity:  none")
        return
    click.echo("identity:")
    engine, model = identity["engine"], identity["model"]
    click.echo(f"  engine     {engine['name']} {engine['version']} ({engine['contract_digest']})")
    click.echo(f"  plugin     {identity['plugin_digest']}")
    click.echo(
        f"  model      {model['model_id']}@{model['revision']} dtype {model['dtype']}, "
        f"quantization {model['quantization']}, {len(model['checkpoint'])} checkpoint files"
    )
    topo = identity["topology"]
    click.echo(
        f"  topology   tp {topo['tp']} pp {topo['pp']} rank {topo['rank']} of {topo['world_size']}"
    )
    platform = {k: v for k, v in identity["platform"].items() if v is not None}
    click.echo(f"  platform   {', '.join(f'{k} {v}' for k, v in platform.items()) or 'CPU'}")
    snap = identity["snapshot"]
    click.echo(f"  snapshot   {snap['name']} (coldsnap {snap['version']})")


@click.command("rm")
@click.argument("name")
@STORE_OPTION
def rm(name: str, store: Path) -> None:
    """Remove a capsule (by tag, digest or short digest) and the tags naming it, and free at once
    the objects only it used. Objects another capsule shares are kept, as are those written
    again since it was published (a capture in progress may be taking them: `gc` frees them
    after its grace). A capsule a restore on this host serves is refused (stop it first)."""
    with reported(_debug):
        found = _open(store)
        digest = lookup(found, name)
        using, starting = _in_use()
        serving = using.get(digest, []) + [
            s for s, artifact in starting.items() if _names(found, artifact, digest)
        ]
        if serving:
            problem = (
                f"{name!r} ({digest}) is what {', '.join(serving)} serves here (a wake reads "
                f"the store): stop it first (`coldsnap stop {serving[0]}`)"
            )
            raise RequestError([("NAME", problem)])
        done = found.remove(digest)
    tags = f" (tags {', '.join(done.tags)})" if done.tags else " (untagged)"
    click.echo(f"removed capsule {done.digest}{tags}")
    if done.unread is not None:
        click.echo(f"freed nothing: the store's capsules could not all be read ({done.unread})")
        click.echo("`coldsnap gc` frees its objects once they can be")
        return
    click.echo(f"freed {_objects(Tally(len(done.freed), done.freed_bytes))} only it used")
    if done.shared.count:
        click.echo(f"kept {_objects(done.shared)} other capsules also use")
    if done.touched.count:
        click.echo(
            f"kept {_objects(done.touched)} written again since it was published (a capture in "
            "progress may be taking them); `coldsnap gc` frees them once unused after its grace"
        )


def _names(store: Store, ref: str, digest: str) -> bool:
    """Whether `ref` (what a restore was asked for) names the capsule `digest` in `store`; a
    ref the store does not know names none of its capsules."""
    try:
        return store.lookup(ref) == digest
    except NoCapsule:
        return False


def _objects(tally: Tally) -> str:
    return f"{tally.count} object{'' if tally.count == 1 else 's'} ({_size(tally.bytes)})"


def _in_use() -> tuple[dict[str, list[str]], dict[str, str]]:
    """The capsules this host's restores serve (by their serving records), each with the names
    it serves under; and the restores still starting, whose record does not name its capsule
    yet, each name with the tag it restores."""
    using: dict[str, list[str]] = defaultdict(list)
    starting: dict[str, str] = {}
    for serving in _serving.records():
        if serving.capsule_digest:
            using[serving.capsule_digest].append(serving.name)
        elif serving.artifact.startswith(DIGEST_PREFIX):
            using[serving.artifact].append(serving.name)
        else:
            starting[serving.name] = serving.artifact
    return using, starting


def _finite(_ctx: click.Context, param: click.Parameter, value: float) -> float:
    """FloatRange lets NaN and infinity through (every comparison with NaN is false)."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds", param=param)
    return value


@click.command("gc")
@STORE_OPTION
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    callback=_finite,
    default=3600.0,
    show_default=True,
    help="Keep untagged capsules, unreachable objects and temporaries younger than this many "
    "seconds (a capture that has not published yet may be writing them).",
)
def gc(store: Path, grace: float) -> None:
    """Remove the capsules no tag names (a re-captured tag's earlier one) once older than the
    grace, unless a restore on this host serves one (its serving record names it); then the
    objects no capsule reaches, and stale temporary files. Says what it kept and why."""
    with reported(_debug):
        using, starting = _in_use()
        report = _open(store).gc(grace_s=grace, untagged=not starting, in_use=set(using))
    for digest in report.unpublished:
        click.echo(f"removed untagged capsule {digest}")
    for digest in report.removed:
        click.echo(f"removed {digest}")
    for digest in report.in_use_capsules:
        click.echo(f"kept untagged capsule {digest}: a restore serves it")
    for digest in report.young_capsules:
        click.echo(f"kept untagged capsule {digest}: published within the grace ({grace:g} s)")
    if starting:
        click.echo(
            f"kept every untagged capsule: the restore serving as {', '.join(starting)} has not "
            "recorded its capsule yet (run gc again once it is done)"
        )
    kept = [f"{_objects(report.reached)} that capsules use"]
    if report.young.count:
        kept.append(f"{_objects(report.young)} unused but within the grace ({grace:g} s)")
    click.echo(
        f"gc: removed {_objects(Tally(len(report.removed), report.freed_bytes))} and "
        f"{len(report.unpublished)} untagged capsules; kept " + ", ".join(kept)
    )


__all__ = ["capsule_ref", "capture_record", "gc", "lookup", "ls", "rm", "show", "summary"]
