"""`pull`: a capsule from a registry into a local store, checked in full before it is tagged.

Steps: `manifest` (the artifact's manifest: an OCI manifest of a capsule), `config` (the
capsule's own manifest, checked against its digest, parsed strictly, its members exactly the
manifest's layers), `present` (the members the store already holds: one this node verified
and whose file is unchanged is taken on that record, coldsnap.capsules' VerifiedObjects; any
other is hashed now, and remembered), `fetch` (the others, several at once, each hashed as it
is written into a temporary file of the store), `publish` (the fetched files become objects,
then the capsule is published under its tag).

A refused pull leaves the store as it was: nothing is installed until every blob fetched has
hashed to its digest; the temporary files of a refused one are removed, and a store the pull
made (with the folders it made for it) is removed again. Each object fetched is remembered as
verified on this node, so that a restore of the pulled capsule does not hash it again while its
file is unchanged.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attrs import frozen

from coldsnap.artifacts import NoCapsule, ObjectWriter, Stamp, Store, StoreError, Tally, tag_problem
from coldsnap.capsules import VerifiedObjects

from ._client import Reference, Repository
from ._errors import ArtifactRefused
from ._mapping import Blob, Served, capsule_of, read_manifest
from ._notes import Notify, Steps

THREADS = 4
"""Blobs fetched at once."""
_BACKDATE_NS = 5_000_000_000
"""How far a fetched object's mtime is set back before it is remembered as verified: further
than the verification record's settling time (coldsnap.artifacts.settled), which refuses a file
written in the same clock tick as it was stamped. Setting it back after the last write is what
makes a later write visible: that moves the mtime to now, past the stamp."""


@frozen(kw_only=True)
class Pulled:
    """What a pull did: the capsule and the tag it is published under (`replaced`: the capsule
    that tag named before, if another), the reference and manifest digest it came from, the
    blobs fetched, those the store held already (`known`: taken on this node's verification
    record; `rehashed`: hashed now)."""

    capsule: str
    tag: str
    reference: str
    manifest: str
    fetched: Tally
    known: Tally
    rehashed: Tally
    replaced: str | None


def pull(
    root: Path,
    ref: Reference,
    repository: Repository,
    notify: Notify,
    *,
    name: str | None = None,
    verified: VerifiedObjects | None = None,
    threads: int = THREADS,
) -> Pulled:
    """Pulls the capsule at `ref` into the store at `root` (made when it does not exist),
    tagged `name`, or the tag it was pushed from."""
    if name is not None and (problem := tag_problem(name)):
        raise ValueError(f"--name: {problem}")
    verified = verified if verified is not None else VerifiedObjects()
    steps = Steps("pull", notify)
    where = str(ref)
    with steps.step("manifest") as said:
        data, manifest = repository.manifest()
        served = read_manifest(data, where)
        tag = name if name is not None else served.tag
        if tag is None:
            raise ArtifactRefused(f"{where} was pushed without a tag: name it with --name")
        if problem := tag_problem(tag):
            raise ArtifactRefused(f"{where}: its tag annotation: {problem}; name it with --name")
        said.done(f"{manifest}: {len(served.layers)} layers")
    with steps.step("config") as said:
        capsule = capsule_of(served, repository.fetch_small(served.config), where)
        said.done(f"capsule {served.config.digest}")
    made = _first_missing(Path(os.path.abspath(root)))
    store = Store(root)
    installed = False
    try:
        blobs = list({b.digest: b for b, _, _ in served.layers}.values())
        with steps.step("present") as said:
            missing, known, rehashed = _present(store, blobs, verified)
            if not known.count and not rehashed.count:
                said.skip("the store holds none of its blobs")
            else:
                said.done(f"{known.count} known on this node, {rehashed.count} hashed now")
        fetched = Tally(len(missing), sum(b.size for b in missing))
        with steps.step("fetch") as said:
            if not missing:
                said.skip("the store holds every blob")
                staged: list[tuple[ObjectWriter, Blob]] = []
            else:
                staged = _fetch(store, repository, missing, steps, where, capsule_names(served),
                                threads)  # fmt: skip
                said.done(f"{fetched.count} blobs, {fetched.bytes} bytes, each hashed")
        with steps.step("publish") as said:
            installed = True
            for writer, blob in staged:
                if store.install_staged(writer, blob.digest):
                    _remember_fresh(verified, blob.digest, store.path(blob.digest))
            try:
                before: str | None = store.resolve(tag)
            except NoCapsule:
                before = None
            digest = store.publish(capsule, tag=tag)
            if digest != served.config.digest:
                raise StoreError(
                    f"the store named the capsule {digest}, not {served.config.digest}"
                )
            said.done(f"{tag} is {digest}")
    except BaseException:
        if made is not None and not installed:
            shutil.rmtree(made, ignore_errors=True)  # made by this pull, holding nothing else
        raise
    return Pulled(capsule=digest, tag=tag, reference=where, manifest=manifest, fetched=fetched,
                  known=known, rehashed=rehashed,
                  replaced=before if before not in (None, digest) else None)  # fmt: skip


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of `path` (itself included) that does not exist: what making the
    store there makes; None when `path` exists."""
    missing = None
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing = folder
    return missing


def capsule_names(served: Served) -> dict[str, str]:
    """The member names of each digest (for errors that name what a bad blob was)."""
    names: dict[str, str] = {}
    for blob, name, _ in served.layers:
        names[blob.digest] = names[blob.digest] + ", " + name if blob.digest in names else name
    return names


def _present(
    store: Store, blobs: list[Blob], verified: VerifiedObjects
) -> tuple[list[Blob], Tally, Tally]:
    """The blobs the store lacks; those it holds, known (verified on this node, unchanged) or
    hashed now (and remembered). A held object whose bytes are wrong refuses the pull: the
    store is damaged (`coldsnap gc` and a re-capture or re-pull of what used it mend it)."""
    missing, known, rehashed = [], Tally(), Tally()
    for blob in blobs:
        if not store.has(blob.digest):
            missing.append(blob)
            continue
        path = store.path(blob.digest)
        if verified.unchanged(blob.digest, path):
            known = known.add(blob.size)
            continue
        before = Stamp.of(path, follow_symlinks=False)
        store.verify_object(blob.digest)
        verified.remember(blob.digest, path, before)
        rehashed = rehashed.add(blob.size)
    return missing, known, rehashed


def _fetch(
    store: Store,
    repository: Repository,
    missing: list[Blob],
    steps: Steps,
    where: str,
    names: dict[str, str],
    threads: int,
) -> list[tuple[ObjectWriter, Blob]]:
    """Fetches each missing blob into a temporary file of the store, hashed as it is written;
    every one, or none: on any failure (a blob that does not hash to its digest among them)
    the temporary files are removed before the error is raised."""
    moved = steps.meter("fetch", sum(b.size for b in missing))
    staged: list[tuple[ObjectWriter, Blob]] = []

    def one(blob: Blob) -> None:
        writer = store.staging()
        staged.append((writer, blob))
        repository.download(blob, writer.write, moved)
        got = writer.commit()
        if got != blob.digest:
            raise ArtifactRefused(
                f"{where}: blob {blob.digest} (member {names.get(blob.digest, '?')}) hashes to "
                f"{got}: the pull is refused and the store left as it was"
            )

    try:
        with ThreadPoolExecutor(max(1, threads)) as pool:
            for _ in pool.map(one, missing):
                pass
    except BaseException:
        for writer, _ in staged:
            writer.abort()
        raise
    return staged


def _remember_fresh(verified: VerifiedObjects, digest: str, path: Path) -> None:
    """Records an object this pull hashed as it wrote it as verified on this node. Its mtime
    is set back first (see _BACKDATE_NS): only this user can write the file (0600, in the
    store's private folders), and any write after this one moves the mtime past the stamp."""
    past = time.time_ns() - _BACKDATE_NS
    os.utime(path, ns=(past, past), follow_symlinks=False)
    verified.remember(digest, path, Stamp.of(path, follow_symlinks=False))


__all__ = ["THREADS", "Pulled", "pull"]
