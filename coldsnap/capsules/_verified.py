"""Verification once per node: a store object whose every byte was hashed and found right is not
hashed again while its inode is unchanged and nobody but this user can have changed it.

Re-hashing a multi-GB process image costs as much as the restore itself (about half of a CPU
restore of the tiny model, docs/performance.md), yet store objects are immutable: nothing
rewrites them in place, and a write moves the inode's mtime. So after a member verifies, its
object's inode identity, size, mtime and owner are remembered in a node-local directory (under
/run: a reboot forgets them, and a store mounted from elsewhere is never trusted on another
node's word). A member is taken on that record only when the file is this user's and no one
else may write it (no group or other write bit): the owner of a file can set its mtime back
after a write, so a file another user owns (a store that user made) is hashed every time,
whatever its stamp says. Anything else (a copy instead of a hard link, another inode, a
touched file, an unreadable or foreign record, a record of another format) is hashed as before.
The ctime cannot be part of the key: laying an object out as a hard link changes it. What this
does not catch is what stat cannot see: bits that rot on the medium under an unchanged inode,
or this user itself (root, usually) setting the mtime back.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from attrs import field, frozen

from coldsnap._paths import VERIFIED_ROOT
from coldsnap.artifacts import Stamp, read_record, settled, write_record

_FORMAT = 2
_KIND = "coldsnap.verified-object"

Seen = Stamp
"""What identifies the bytes of an object's inode as they were when they were hashed."""


def _seen(path: Path) -> Stamp:
    return Stamp.of(path, follow_symlinks=False)


def ours_alone(st: os.stat_result) -> bool:
    """Whether only this user can write the file `st` describes: a regular file it owns that no
    group or other may write (only then can no one else change it and put its mtime back)."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _owner(path: Path) -> int | None:
    """The owner of the file at `path` when only this user can write it; else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_uid if ours_alone(st) else None


@frozen(kw_only=True)
class VerifiedRecord:
    """One object verified in full: its digest, the stamp of the inode that was hashed and the
    user who owned it."""

    KIND = _KIND

    format: int = field()
    kind: str
    digest: str
    seen: Stamp
    owner: int

    @format.validator
    def _check_format(self, _attr: object, value: int) -> None:
        if value != _FORMAT:
            raise ValueError(f"format: expected {_FORMAT}, found {value!r}")


class VerifiedObjects:
    """The node's record of objects verified in full (one small JSON file per digest)."""

    def __init__(self, root: Path = VERIFIED_ROOT) -> None:
        self.root = root

    def _path(self, digest: str) -> Path:
        name = digest.removeprefix("sha256:")
        if not name.isalnum():
            raise ValueError(f"not an object digest: {digest!r}")
        return self.root / name[:2] / f"{name}.json"

    def unchanged(self, digest: str, path: Path) -> bool:
        """Whether `path` is the very inode, untouched, that was verified as `digest`, and only
        this user can have written it since."""
        where = self._path(digest)
        owner = _owner(path)
        if owner is None:
            return False
        record = read_record(where, VerifiedRecord)
        if record is None or record.digest != digest or record.owner != owner:
            return False
        try:
            return record.seen == _seen(path)
        except OSError:
            return False

    def remember(self, digest: str, path: Path, before: Stamp) -> None:
        """Records `path` as verified as `digest`, when its inode is still as it was `before`
        the hashing began (a write during the hash leaves nothing recorded) and only this user
        can write it (another's file is hashed at every use)."""
        if not settled(before.mtime_ns):
            return  # a write in the same clock tick would leave the mtime as it is
        owner = _owner(path)
        if owner is None:
            return
        try:
            if _seen(path) != before:
                return
        except OSError:
            return
        record = VerifiedRecord(format=_FORMAT, kind=_KIND, digest=digest, seen=before, owner=owner)
        write_record(self._path(digest), record)


__all__ = ["VERIFIED_ROOT", "Seen", "VerifiedObjects", "VerifiedRecord", "ours_alone"]
