"""Files outside the image that a restore needs, saved with the image and put back each time.

CRIU keeps only the path and size of a regular file a process has open or mapped; the file
itself must be there at restore. Two kinds bite a real SGLang tree:
- /dev/shm files such as `sglang_loads_<id>.shm` (a flock'ed shared map): tmpfs, gone after a
  reboot, and their content at restore should be the content at dump;
- `/dev/shm/link_remap.N`: hard links CRIU makes for deleted files (`--link-remap`). A restore
  consumes them, and a `--leave-running` dump deletes them right after the dump.
So every /dev/shm path the image references (and any extra path the caller names) is copied
into the image directory by CRIU's post-dump hook, while the tree is still frozen, and copied
back before every restore.

Run by CRIU as `python -E -s -S _files.py IMAGES_DIR [EXTRA_PATH ...]` with
CRTOOLS_SCRIPT_ACTION set; standard library only, so it starts in milliseconds.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

if __package__:
    from coldsnap._atomic import atomic_write

    from ._images import ImageFormatError, read_file_paths
else:  # run as a script by CRIU: this file's folder is sys.path[0]; only `save` runs there
    from _images import (  # type: ignore[import-not-found,no-redef]
        ImageFormatError,
        read_file_paths,
    )

SAVED_DIR = "coldsnap-files"
SAVED_PREFIXES = ("/dev/shm/",)


def saved_name(path: str) -> str:
    """Where a file is kept, relative to the image directory."""
    if not path.startswith("/") or ".." in Path(path).parts:
        raise ImageFormatError(f"not an absolute, normalized path: {path!r}")
    return f"{SAVED_DIR}/{path.lstrip('/')}"


def referenced_paths(images_dir: Path, extra: Iterable[str] = ()) -> list[str]:
    """The paths to keep: the image's files under SAVED_PREFIXES, then `extra`."""
    paths = [p for p in read_file_paths(images_dir) if p.startswith(SAVED_PREFIXES)]
    for p in extra:
        if p not in paths:
            paths.append(p)
    return paths


def save(images_dir: Path, paths: Iterable[str]) -> list[str]:
    """Copies each existing regular file into the image directory (mode, owner and times kept).
    Returns the paths copied; a missing path (a deleted file CRIU remapped) is skipped."""
    copied = []
    for path in paths:
        src = Path(path)
        if not src.is_file():
            continue
        dest = images_dir / saved_name(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        st = src.stat()
        os.chown(dest, st.st_uid, st.st_gid)
        copied.append(path)
    return copied


def put_back(images_dir: Path, path: str) -> None:
    """Puts one saved file back at its path (mode, owner and times kept): a fresh copy renamed
    into place, so a process that still maps the old file keeps its own and the restored one
    gets the dumped content."""
    src = images_dir / saved_name(path)
    st = src.stat()
    with open(src, "rb") as source, atomic_write(Path(path)) as copy:
        shutil.copyfileobj(source, copy)
        copy.flush()
        os.fchmod(copy.fileno(), stat.S_IMODE(st.st_mode))
        os.fchown(copy.fileno(), st.st_uid, st.st_gid)
        os.utime(copy.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))


def is_link_remap(path: str) -> bool:
    """CRIU's hard links to deleted files (`--link-remap`), named link_remap.<file id>."""
    return Path(path).name.startswith("link_remap.")


def remove_link_remaps(paths: Iterable[str]) -> None:
    """Removes the link_remap files among `paths` (only those links, never other files)."""
    for path in paths:
        if is_link_remap(path):
            Path(path).unlink(missing_ok=True)


def _main(argv: list[str]) -> int:
    if os.environ.get("CRTOOLS_SCRIPT_ACTION") != "post-dump" or not argv:
        return 0
    images_dir = Path(argv[0])
    save(images_dir, referenced_paths(images_dir, argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
