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

import json
import os
import time
from pathlib import Path

from attrs import asdict, frozen

from coldsnap._atomic import write_json_atomic

VERIFIED_ROOT = Path("/run/coldsnap/verified")
_FORMAT = 1
_KIND = "coldsnap.verified-object"
_SETTLED_NS = 2_000_000_000
"""Only an object whose mtime is this old is remembered: file times tick coarsely (a jiffy), so a
write just after the hash could leave the mtime unchanged."""


@frozen
class Seen:
    """What identifies the bytes of an object's inode as they were when they were hashed."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> Seen:
        st = os.stat(path, follow_symlinks=False)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


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
        record_path = self._path(digest)
        try:
            record = json.loads(record_path.read_text())
            now = Seen.of(path)
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict) or record.get("format") != _FORMAT:
            return False
        return record.get("kind") == _KIND and record.get("seen") == asdict(now)

    def remember(self, digest: str, path: Path, before: Seen) -> None:
        """Records `path` as verified as `digest`, when its inode is still as it was `before`
        the hashing began (a write during the hash leaves nothing recorded)."""
        if time.time_ns() - before.mtime_ns < _SETTLED_NS:
            return  # a write in the same clock tick would leave the mtime as it is
        try:
            if Seen.of(path) != before:
                return
            target = self._path(digest)
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_json_atomic(
                target, {"format": _FORMAT, "kind": _KIND, "digest": digest, "seen": asdict(before)}
            )
        except OSError:
            return  # a record not written costs a re-hash next time, nothing else


__all__ = ["VERIFIED_ROOT", "Seen", "VerifiedObjects"]
