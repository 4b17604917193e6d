"""A capsule as an OCI artifact, and back.

The artifact is one OCI image manifest: its config is the capsule's own manifest (the store
object whose digest names the capsule, so the capsule digest is the config digest), and each
member is one layer, its blob the member's object under the digest the store already has
(annotated with the member's name and role). Nothing is repacked or renamed: a registry and a
store hold the same content-addressed bytes, and a blob two capsules share is sent once.

Reading one back trusts nothing but digests: the config must hash to its descriptor (checked
when it is downloaded), parse as a capsule strictly and serialize back to the same bytes; and
the layers must list exactly the capsule's members, in order. The members' bytes are checked
against the capsule's digests as they are downloaded (coldsnap.oci._pull).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from attrs import frozen

from coldsnap.artifacts import Capsule, RecordError, digest_problem, from_json, record_digest

from ._errors import ArtifactRefused

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.coldsnap.capsule.v1"
CONFIG_MEDIA_TYPE = "application/vnd.coldsnap.capsule.v1+json"
MEMBER_MEDIA_TYPE = "application/vnd.coldsnap.member.v1"
TITLE = "org.opencontainers.image.title"
ROLE = "dev.coldsnap.role"
TAG = "dev.coldsnap.tag"
"""The store tag the capsule was pushed from: what a pull names it unless told otherwise."""


@frozen
class Blob:
    """One blob of the artifact: its digest, size in bytes and media type."""

    digest: str
    size: int
    media_type: str


@frozen
class Artifact:
    """A capsule's OCI manifest as pushed (its exact bytes) and the blobs it names."""

    manifest: bytes
    config: Blob
    layers: tuple[Blob, ...]

    def blobs(self) -> tuple[Blob, ...]:
        """The distinct blobs to send, the config first (a blob named twice is sent once)."""
        seen: dict[str, Blob] = {}
        for blob in (self.config, *self.layers):
            seen.setdefault(blob.digest, blob)
        return tuple(seen.values())


def artifact_of(capsule: Capsule, config: bytes, tag: str | None) -> Artifact:
    """The artifact of `capsule`, whose manifest bytes in the store are `config`."""
    digest = record_digest(capsule)
    if digest != "sha256:" + _sha256(config):
        raise ArtifactRefused(f"the capsule's manifest is not its canonical form ({digest})")
    config_blob = Blob(digest, len(config), CONFIG_MEDIA_TYPE)
    layers = tuple(Blob(m.digest, m.size, MEMBER_MEDIA_TYPE) for m in capsule.members)
    body: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": _descriptor(config_blob),
        "layers": [
            _descriptor(blob, {TITLE: m.name, ROLE: m.role})
            for blob, m in zip(layers, capsule.members, strict=True)
        ],
    }
    if tag is not None:
        body["annotations"] = {TAG: tag}
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return Artifact(manifest=data, config=config_blob, layers=layers)


@frozen
class Served:
    """What a registry's manifest says a capsule is: its config blob, its layers (each with
    the member name and role annotated) and the tag it was pushed from."""

    config: Blob
    layers: tuple[tuple[Blob, str, str], ...]
    tag: str | None


def read_manifest(data: bytes, where: str) -> Served:
    """The capsule artifact `data` (a manifest's bytes, from `where`) describes; ArtifactRefused
    naming the field when it is not one."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactRefused(f"{where}: the manifest is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ArtifactRefused(f"{where}: the manifest is not a JSON object")
    if body.get("mediaType") != MANIFEST_MEDIA_TYPE or body.get("schemaVersion") != 2:
        raise ArtifactRefused(
            f"{where}: not an OCI image manifest (mediaType {body.get('mediaType')!r}, "
            f"schemaVersion {body.get('schemaVersion')!r})"
        )
    config = _blob(body.get("config"), where, "config")
    kind = body.get("artifactType", config.media_type)
    if kind != ARTIFACT_TYPE or config.media_type != CONFIG_MEDIA_TYPE:
        raise ArtifactRefused(
            f"{where} is not a coldsnap capsule: artifactType {kind!r}, config mediaType "
            f"{config.media_type!r} (a capsule's are {ARTIFACT_TYPE!r}, {CONFIG_MEDIA_TYPE!r})"
        )
    raw_layers = body.get("layers")
    if not isinstance(raw_layers, list):
        raise ArtifactRefused(f"{where}: field 'layers' is not a list")
    layers = []
    for i, raw in enumerate(raw_layers):
        blob = _blob(raw, where, f"layers[{i}]")
        notes = raw.get("annotations") or {}
        name, role = notes.get(TITLE), notes.get(ROLE)
        if not isinstance(name, str) or not isinstance(role, str):
            raise ArtifactRefused(f"{where}: layers[{i}] lacks the annotations {TITLE}, {ROLE}")
        layers.append((blob, name, role))
    tag = (body.get("annotations") or {}).get(TAG)
    if tag is not None and not isinstance(tag, str):
        raise ArtifactRefused(f"{where}: annotation {TAG} is not a string")
    return Served(config=config, layers=tuple(layers), tag=tag)


def capsule_of(served: Served, config: bytes, where: str) -> Capsule:
    """The capsule a served artifact carries, given its config bytes (already checked against
    the config's digest): parsed strictly, canonical (so the store names it by the same
    digest), and its members exactly the manifest's layers."""
    try:
        capsule = from_json(config, Capsule)
    except RecordError as exc:
        raise ArtifactRefused(f"{where}: the config is not a capsule: {exc}") from None
    if record_digest(capsule) != served.config.digest:
        raise ArtifactRefused(
            f"{where}: the capsule's manifest is not in canonical form: the store would name it "
            f"{record_digest(capsule)}, not {served.config.digest}"
        )
    listed = [(b.digest, b.size, name, role) for b, name, role in served.layers]
    members = [(m.digest, m.size, m.name, m.role) for m in capsule.members]
    if listed != members:
        first = next(
            (i for i, (a, b) in enumerate(zip(listed, members, strict=False)) if a != b),
            min(len(listed), len(members)),
        )
        raise ArtifactRefused(
            f"{where}: the manifest's layers disagree with the capsule's members "
            f"({len(listed)} layers, {len(members)} members; first difference at {first})"
        )
    return capsule


def _descriptor(blob: Blob, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"mediaType": blob.media_type, "digest": blob.digest,
                             "size": blob.size}  # fmt: skip
    if annotations:
        found["annotations"] = annotations
    return found


def _blob(raw: object, where: str, field: str) -> Blob:
    if not isinstance(raw, dict):
        raise ArtifactRefused(f"{where}: field {field!r} is not a descriptor")
    digest, size, media_type = raw.get("digest"), raw.get("size"), raw.get("mediaType")
    if problem := digest_problem(digest):
        raise ArtifactRefused(f"{where}: {field}.digest: {problem}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ArtifactRefused(f"{where}: {field}.size: {size!r} is not a size in bytes")
    if not isinstance(media_type, str):
        raise ArtifactRefused(f"{where}: {field}.mediaType: {media_type!r} is not a media type")
    return Blob(str(digest), size, media_type)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


__all__ = [
    "ARTIFACT_TYPE",
    "CONFIG_MEDIA_TYPE",
    "MANIFEST_MEDIA_TYPE",
    "MEMBER_MEDIA_TYPE",
    "Artifact",
    "Blob",
    "Served",
    "artifact_of",
    "capsule_of",
    "read_manifest",
]
