"""`push`: a published capsule of a local store, sent to a registry as an OCI artifact.

Steps: `resolve` (the capsule and its artifact), `check` (which blobs the repository already
holds: a HEAD each), `send` (the others, several at once, each from its store object; skipped
when none is missing), `manifest` (put under the reference's tag, last: a reader never finds
the tag before every blob it names)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from attrs import frozen

from coldsnap.artifacts import Store, Tally

from ._client import Reference, Repository
from ._mapping import Blob, artifact_of
from ._notes import Notify, Steps

THREADS = 4
"""Blobs sent (or asked about) at once."""


@frozen(kw_only=True)
class Pushed:
    """What a push did: the capsule, the reference and manifest digest it is under now, the
    blobs sent and those the registry already held."""

    capsule: str
    reference: str
    manifest: str
    sent: Tally
    present: Tally


def push(
    store: Store,
    name: str,
    ref: Reference,
    repository: Repository,
    notify: Notify,
    *,
    threads: int = THREADS,
) -> Pushed:
    """Sends the capsule `name` (a tag, a digest or a short digest) of `store` to `ref`."""
    if ref.digest is not None:
        raise ValueError(f"{ref}: a push names a tag, not a digest (the registry computes it)")
    steps = Steps("push", notify)
    with steps.step("resolve") as said:
        digest = store.lookup(name)
        capsule = store.capsule(digest)
        tag = name if name in store.tag_names() else None
        artifact = artifact_of(capsule, store.read_bytes(digest), tag)
        blobs = artifact.blobs()
        said.done(f"{digest}: {len(capsule.members)} members, {len(blobs)} blobs")
    with steps.step("check") as said, ThreadPoolExecutor(max(1, threads)) as pool:
        held = list(pool.map(lambda b: repository.has_blob(b.digest), blobs))
        missing = [b for b, h in zip(blobs, held, strict=True) if not h]
        present = Tally(
            len(blobs) - len(missing), sum(b.size for b, h in zip(blobs, held, strict=True) if h)
        )
        said.done(f"{len(missing)} of {len(blobs)} blobs to send")
    sent = Tally(len(missing), sum(b.size for b in missing))
    with steps.step("send") as said:
        if not missing:
            said.skip(f"{ref.registry}/{ref.repository} holds every blob")
        else:
            moved = steps.meter("send", sent.bytes)

            def one(blob: Blob) -> None:
                repository.upload(store.path(blob.digest), blob, moved)

            with ThreadPoolExecutor(max(1, threads)) as pool:
                for _ in pool.map(one, missing):
                    pass
            said.done(f"{sent.count} blobs, {sent.bytes} bytes")
    with steps.step("manifest") as said:
        manifest = repository.put_manifest(artifact.manifest)
        said.done(f"{ref} is {manifest}")
    return Pushed(capsule=digest, reference=str(ref), manifest=manifest, sent=sent,
                  present=present)  # fmt: skip


__all__ = ["THREADS", "Pushed", "push"]
