"""The errors of moving capsules through an OCI registry, on coldsnap's one tree."""

from __future__ import annotations

from coldsnap._errors import OperationError, RefusedError


class RegistryError(OperationError):
    """An exchange with the registry failed: it cannot be reached, refused a request (an
    unknown repository or tag, missing credentials) or answered outside the distribution API."""


class ArtifactRefused(RefusedError):
    """What the registry serves is not a capsule coldsnap can take: another kind of artifact, a
    manifest that disagrees with the capsule it carries, or a blob whose bytes do not hash to
    its digest. Nothing was changed in the store."""


__all__ = ["ArtifactRefused", "RegistryError"]
