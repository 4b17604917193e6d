"""Capsules between hosts: `push` sends a published capsule of a local store to an OCI
registry as an artifact (a manifest whose config is the capsule's own manifest, one blob per
member under the digest the store already has), `pull` brings one into a store, every blob
checked against its digest before anything is tagged. Over the distribution API through
oras-py (coldsnap.oci._client says what it does and what is done here).

Imported by the command line's `push` and `pull` only (oras-py and requests cost 0.7 s to
import)."""

from ._client import Reference, Repository, docker_configs, parse_reference
from ._errors import ArtifactRefused, RegistryError
from ._mapping import Artifact, Blob, Served, artifact_of, capsule_of, read_manifest
from ._notes import Note, Notify
from ._pull import Pulled, pull
from ._push import Pushed, push

__all__ = [
    "Artifact",
    "ArtifactRefused",
    "Blob",
    "Note",
    "Notify",
    "Pulled",
    "Pushed",
    "Reference",
    "RegistryError",
    "Repository",
    "Served",
    "artifact_of",
    "capsule_of",
    "docker_configs",
    "parse_reference",
    "pull",
    "push",
    "read_manifest",
]
