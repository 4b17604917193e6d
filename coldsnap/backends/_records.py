"""What the CRIU backend writes to disk: a manifest beside each image, a record of each restore.

Frozen attrs classes with a versioned `format` and a `kind`; one cattrs converter; atomic
writes (temporary file, fsync, rename) so a reader never sees half a record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
from attrs import frozen

from coldsnap._atomic import write_json_atomic

from ._images import ImageFormatError

DUMP_MANIFEST = "coldsnap-dump.json"
RESTORE_RECORD = "coldsnap-restore.json"

converter = cattrs.Converter(forbid_extra_keys=True)
T = TypeVar("T")


@frozen(kw_only=True)
class SavedFile:
    """A file outside the image that the restore needs, kept in the image directory."""

    path: str
    saved_as: str
    size: int


@frozen(kw_only=True)
class DumpManifest:
    """One CRIU dump: which tree, with which CRIU and options, and what else was saved.

    `pids` are every PID and thread ID the image takes back, as the image records them: in an
    image with its own PID namespace (`own_pid_namespace`) they are namespace PIDs, root 1."""

    root_pid: int
    pids: tuple[int, ...]
    own_pid_namespace: bool
    leave_running: bool
    criu_version: str
    criu_args: tuple[str, ...]
    kernel: str
    seconds: float
    image_bytes: int
    saved_files: tuple[SavedFile, ...] = ()
    created_at: float = 0.0
    format: int = 1
    kind: str = "coldsnap.criu-dump"


@frozen(kw_only=True)
class RestoredTree:
    """A restored tree. `pid` is its root as seen from here. `criu_pid`, when set, is our child
    that outlives the tree: CRIU as the tree's parent (an attached restore), or the `unshare`
    running CRIU as a new PID namespace's init. Otherwise the tree was detached (adopted by a
    subreaper or PID 1)."""

    pid: int
    images_dir: str
    work_dir: str
    log_path: str
    seconds: float
    new_pid_namespace: bool
    stopped: bool
    criu_pid: int | None = None
    format: int = 1
    kind: str = "coldsnap.criu-restore"


def write_record(path: Path, record: Any) -> Path:
    return write_json_atomic(path, converter.unstructure(record), indent=2)


def read_record(path: Path, cls: type[T]) -> T:
    """Reads a record, checking its kind and format before anything else."""
    data = json.loads(path.read_text())
    kind = attrs.fields(cls).kind.default  # type: ignore[misc]
    fmt = attrs.fields(cls).format.default  # type: ignore[misc]
    if data.get("kind") != kind:
        raise ImageFormatError(f"{path}: field 'kind' is {data.get('kind')!r}, expected {kind!r}")
    if data.get("format") != fmt:
        raise ImageFormatError(
            f"{path}: field 'format' is {data.get('format')!r}, this reads {fmt}"
        )
    return converter.structure(data, cls)
