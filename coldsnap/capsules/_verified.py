"""Verification once per node: a store object whose every byte was hashed and found right is not
hashed again while its inode is unchanged.

Re-hashing a multi-GB process image costs as much as the restore itself (about half of a CPU
restore of the tiny model, docs/performance.md), yet store objects are immutable: nothing
rewrites them in place (they are root's, mode 0600), and a write moves the inode's mtime. So
after a member verifies, its object's inode identity, size and mtime are remembered in a
node-local directory (under /run: a reboot forgets them, and a
store mounted from elsewhere is never trusted on another node's word). A member whose inode
still matches is not re-hashed; anything else (a copy instead of a hard link, another inode, a
touched file, an unreadable or foreign record) is hashed as before. The ctime cannot be part of
the key: laying an object out as a hard link changes it. What this does not catch is what stat
cannot see: bits that rot on the medium under an unchanged inode, or a privileged writer that
sets the mtime back.
"""

from __future__ import annotations

from pathlib import Path

from attrs import field, frozen

from coldsnap._paths import VERIFIED_ROOT
from coldsnap.artifacts import Stamp, read_record, settled, write_record

_FORMAT = 1
_KIND = "coldsnap.verified-object"

Seen = Stamp
"""What identifies the bytes of an object's inode as they were when they were hashed."""


def _seen(path: Path) -> Stamp:
    return Stamp.of(path, follow_symlinks=False)


@frozen(kw_only=True)
class VerifiedRecord:
    """One object verified in full: its digest and the stamp of the inode that was hashed."""

    KIND = _KIND

    format: int = field()
    kind: str
    digest: str
    seen: Stamp

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
        """Whether `path` is the very inode, untouched, that was verified as `digest`."""
        record = read_record(self._path(digest), VerifiedRecord)
        if record is None or record.digest != digest:
            return False
        try:
            return record.seen == _seen(path)
        except OSError:
            return False

    def remember(self, digest: str, path: Path, before: Stamp) -> None:
        """Records `path` as verified as `digest`, when its inode is still as it was `before`
        the hashing began (a write during the hash leaves nothing recorded)."""
        if not settled(before.mtime_ns):
            return  # a write in the same clock tick would leave the mtime as it is
        try:
            if _seen(path) != before:
                return
        except OSError:
            return
        record = VerifiedRecord(format=_FORMAT, kind=_KIND, digest=digest, seen=before)
        write_record(self._path(digest), record)


__all__ = ["VERIFIED_ROOT", "Seen", "VerifiedObjects", "VerifiedRecord"]
