"""What a digest, a member name and a tag may look like. Checked at every edge, so a record read
from disk can never point outside the store (`..`, absolute paths) or at a malformed object."""

from __future__ import annotations

import re

DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@-]*")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SHORT = re.compile(r"(?:sha256:)?([0-9a-f]{4,63})")
SHORT_DIGEST_MIN = 4
"""The fewest hex digits a short digest may have (as git: fewer would match too much)."""


def digest_problem(value: object) -> str | None:
    """Why `value` is not a `sha256:<64 lowercase hex>` digest, or None."""
    if not isinstance(value, str):
        return f"a digest is a string, got {type(value).__name__}"
    if not _DIGEST.fullmatch(value):
        return f"{value!r} is not a digest of the form sha256:<64 lowercase hex digits>"
    return None


def member_name_problem(value: object) -> str | None:
    """A member name is a relative POSIX path of plain segments: no `..`, no `/` prefix, no
    empty segment, no backslash or control characters."""
    if not isinstance(value, str):
        return f"a name is a string, got {type(value).__name__}"
    if not value:
        return "a name may not be empty"
    if len(value) > 512:
        return f"a name is at most 512 characters, got {len(value)}"
    if value.startswith("/"):
        return f"{value!r} is absolute; names are relative"
    for segment in value.split("/"):
        if segment in ("", ".", ".."):
            return f"{value!r} has an empty, '.' or '..' segment"
        if len(segment.encode()) > 255:
            return f"{value!r} has a segment over 255 bytes (a file name's limit)"
        if not _SEGMENT.fullmatch(segment):
            return f"{value!r} has a segment with characters outside [A-Za-z0-9_.+=@-]"
    return None


def tag_problem(value: object) -> str | None:
    """A tag (`tiny-llama`) names a capsule; it cannot be mistaken for a digest or a path."""
    if not isinstance(value, str):
        return f"a tag is a string, got {type(value).__name__}"
    if value.startswith(DIGEST_PREFIX) or not _TAG.fullmatch(value):
        return f"{value!r} is not a tag: 1-128 of [A-Za-z0-9_.-], starting with a letter or digit"
    return None


def short_digest(value: str) -> str | None:
    """The hex digits of a short digest (`3f2a9c1b07de`, `sha256:3f2a`: 4 to 63 lowercase hex
    digits, what `ls` prints is 12), or None when `value` is not spelled as one."""
    found = _SHORT.fullmatch(value)
    return found.group(1) if found else None
