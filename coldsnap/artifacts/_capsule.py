"""A capsule: the manifest of one capture, naming its objects (process images, weight packs,
indexes) by digest. Publishing a capsule is what makes a capture visible."""

from __future__ import annotations

import re
from typing import ClassVar

import attrs
from attrs import field, frozen

from ._identity import Identity
from ._names import digest_problem, exactly, member_name_problem

CAPSULE_FORMAT = 1
_ROLE = re.compile(r"[a-z][a-z0-9-]{0,63}")


@frozen
class Member:
    """One object of a capsule: its role (`process-image`, `pack`, `pack-index`, ...), a relative
    name that is unique within the capsule, its digest and size in bytes."""

    role: str = field()
    name: str = field()
    digest: str = field()
    size: int = field()

    @role.validator
    def _check_role(self, _: attrs.Attribute, value: str) -> None:
        if not isinstance(value, str) or not _ROLE.fullmatch(value):
            raise ValueError(f"role: {value!r} is not a role name ([a-z][a-z0-9-]*)")

    @name.validator
    def _check_name(self, _: attrs.Attribute, value: str) -> None:
        problem = member_name_problem(value)
        if problem:
            raise ValueError(f"name: {problem}")

    @digest.validator
    def _check_digest(self, _: attrs.Attribute, value: str) -> None:
        problem = digest_problem(value)
        if problem:
            raise ValueError(f"digest: {problem}")

    @size.validator
    def _check_size(self, _: attrs.Attribute, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"size: a non-negative integer is required, got {value!r}")


def _members(value: object) -> tuple[Member, ...]:
    members = tuple(value)  # type: ignore[arg-type]
    names = [m.name for m in members]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"members: duplicate names {duplicates}")
    return members


@frozen
class Capsule:
    """The manifest of one capture. `identity` is what a restore checks compatibility against."""

    KIND: ClassVar[str] = "coldsnap.capsule"

    members: tuple[Member, ...] = field(converter=_members)
    identity: Identity | None = None
    format: int = field(default=CAPSULE_FORMAT, validator=exactly(CAPSULE_FORMAT))
    kind: str = field(default=KIND, validator=exactly(KIND))

    def member(self, name: str) -> Member:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(f"capsule has no member named {name!r}")

    def by_role(self, role: str) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.role == role)


@frozen
class TagRecord:
    """What `names/<tag>` holds: the capsule a tag points at."""

    KIND: ClassVar[str] = "coldsnap.store.tag"

    tag: str
    capsule: str = field()
    format: int = field(default=1, validator=exactly(1))
    kind: str = field(default=KIND, validator=exactly(KIND))

    @capsule.validator
    def _check_capsule(self, _: attrs.Attribute, value: str) -> None:
        problem = digest_problem(value)
        if problem:
            raise ValueError(f"capsule: {problem}")
