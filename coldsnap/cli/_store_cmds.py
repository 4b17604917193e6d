"""Store commands that need no engine: `ls` (the capsules of a store), `show NAME` (one capsule's
identity and members), `rm` and `gc` (remove what no capsule reaches). They read the store through
coldsnap.artifacts and the capture record a capsule carries (coldsnap.capsules), and open it as
it is (`Store.open`): a directory that is not a store is refused, never made into one."""

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

from coldsnap.artifacts import (
    DIGEST_PREFIX,
    ArtifactError,
    Capsule,
    Store,
    converter,
    from_json,
)
from coldsnap.capsules import RECORD_NAME, CaptureRecord

from ._errors import OTHER, reported, say

_STORE = click.option(
    "--store",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The store directory.",
)


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


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
@_STORE
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
def ls(store: Path, as_json: bool) -> None:
    """List the capsules in a store: tag, digest, size, driver, provider, model, created. A
    capsule that cannot be read is listed as damaged, with why on stderr, and the others still
    are; the exit status is then 1."""
    with reported(_debug):
        found = Store.open(store)
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
@_STORE
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def show(name: str, store: Path, as_json: bool) -> None:
    """Show one capsule (by tag or sha256: digest): its identity and a summary of its members."""
    with reported(_debug):
        found = Store.open(store)
        digest = found.resolve(name)
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
@_STORE
def rm(name: str, store: Path) -> None:
    """Unpublish a capsule (by tag or sha256: digest) and drop its tags; `gc` then frees what
    nothing else reaches."""
    with reported(_debug):
        digest = Store.open(store).unpublish(name)
    click.echo(f"removed capsule {digest}; run `coldsnap gc` to free its objects")


def _finite(_ctx: click.Context, param: click.Parameter, value: float) -> float:
    """FloatRange lets NaN and infinity through (every comparison with NaN is false)."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds", param=param)
    return value


@click.command("gc")
@_STORE
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    callback=_finite,
    default=3600.0,
    show_default=True,
    help="Keep unreachable objects and temporaries younger than this many seconds.",
)
def gc(store: Path, grace: float) -> None:
    """Remove the objects no published capsule reaches (and stale temporary files)."""
    with reported(_debug):
        report = Store.open(store).gc(grace_s=grace)
    for digest in report.removed:
        click.echo(f"removed {digest}")
    click.echo(
        f"gc: removed {len(report.removed)} objects ({_size(report.freed_bytes)}), "
        f"kept {report.kept}"
    )


__all__ = ["capture_record", "gc", "ls", "rm", "show", "summary"]
