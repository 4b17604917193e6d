"""A capsule: the manifest of one capture, naming its objects (process images, weight packs,
indexes) by digest. Publishing a capsule is what makes a capture visible."""

from __future__ import annotations

import re
from typing import ClassVar

from attrs import field, frozen

from . import _validate as v
from ._identity import Identity

CAPSULE_FORMAT = 1
_ROLE = re.compile(r"[a-z][a-z0-9-]{0,63}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
BLOCK_BYTES = 32 << 20
"""The block size of a member's `blocks`: the sha256 of each BLOCK_BYTES of its bytes (the last
block shorter), so that a large member (a process image's pages) is checked on many cores."""


def _blocks(inst: Member, attribute: object, value: tuple[str, ...]) -> None:
    if not value:
        return
    expected = -(-inst.size // BLOCK_BYTES)
    if len(value) != expected:
        raise ValueError(
            f"blocks: {len(value)} block digests for {inst.size} bytes, expected {expected}"
        )
    for i, digest in enumerate(value):
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise ValueError(f"blocks: block {i} is not 64 lowercase hex digits")


@frozen
class Member:
    """One object of a capsule: its role (`process-image`, `pack`, `pack-index`, ...), a relative
    name that is unique within the capsule, its digest and size in bytes."""

    role: str = field(validator=v.matches(_ROLE, "a role name ([a-z][a-z0-9-]*)"))
    name: str = field(validator=v.member_name)
    digest: str = field(validator=v.digest)
    size: int = field(validator=v.count)
    blocks: tuple[str, ...] = field(default=(), converter=tuple, validator=_blocks)
    """The sha256 (hex) of each BLOCK_BYTES block, for members admission checks in parallel
    (a process image's); empty for others."""


@frozen
class Capsule:
    """The manifest of one capture. `identity` is what a restore checks compatibility against."""

    KIND: ClassVar[str] = "coldsnap.capsule"

    members: tuple[Member, ...] = field(converter=v.unique_names("members"))
    identity: Identity | None = None
    format: int = field(default=CAPSULE_FORMAT, validator=v.exactly(CAPSULE_FORMAT))
    kind: str = field(default=KIND, validator=v.exactly(KIND))

    def member(self, name: str) -> Member:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(f"capsule has no member named {name!r}")

    def by_role(self, role: str) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.role == role)


@frozen
class TagRecord:
    """What `tags/<tag>` holds: the capsule a tag points at."""

    KIND: ClassVar[str] = "coldsnap.store.tag"

    tag: str
    capsule: str = field(validator=v.digest)
    format: int = field(default=1, validator=v.exactly(1))
    kind: str = field(default=KIND, validator=v.exactly(KIND))
