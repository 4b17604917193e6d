"""Atomic JSON writes, shared by every package that writes records (machine, plugin, backends).

A leaf that imports nothing of coldsnap's, so the packages that must not import each other can
all use it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, indent: int = 1) -> Path:
    """tmp + fsync + rename in the target's folder (created if missing), so a reader sees the
    old file or the new one, never a part of either."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
