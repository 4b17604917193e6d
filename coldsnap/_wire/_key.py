"""The engine's API key as a file: how the key the engine must require reaches the plugin and
coldsnap's own requests without ever being an argument, a variable or a field of a record that
lands in a snapshot, a capsule or a journal.

One file, `api-key` (mode 0600: written by `_atomic`), holds one record: in the engine's runtime
directory it is the key the plugin checks every request against (read on each request, so a
restored process takes the key this restore was given, not the one its image remembers); in an
operation's workdir it is the key that operation was given, which the engine adapter sends and
hands over to the runtime directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import instance_of

from coldsnap._atomic import atomic_write
from coldsnap._errors import PluginError

KEY_FILE = "api-key"
KEY_FORMAT = 1
KEY_KIND = "coldsnap.api-key"


class KeyFileError(PluginError, ValueError):
    """A key file that cannot be read or is not a key record; the message names the file and
    the field."""


def _key(instance: Any, attribute: Any, value: str) -> None:
    if not value or value != value.strip() or any(c in value for c in "\r\n"):
        raise ValueError(f"field '{attribute.name}' must be a non-empty key without spaces "
                         "around it or line breaks")  # fmt: skip


@attrs.frozen(kw_only=True, repr=False)
class ApiKey:
    """An API key; never shown in repr (tracebacks and logs print records)."""

    key: str = attrs.field(validator=[instance_of(str), _key])
    format: int = KEY_FORMAT
    kind: str = KEY_KIND

    def __repr__(self) -> str:
        return "ApiKey(<hidden>)"


def key_path(folder: Path) -> Path:
    """The key file in `folder` (a runtime directory or an operation's workdir)."""
    return Path(folder) / KEY_FILE


def write_key(folder: Path, key: str) -> Path:
    """Writes `key` into `folder`'s key file, mode 0600, atomically; returns the file."""
    record = ApiKey(key=key)
    path = key_path(folder)
    with atomic_write(path, "w") as handle:
        json.dump({"format": record.format, "kind": record.kind, "key": record.key}, handle)
    return path


def read_key(folder: Path) -> str | None:
    """The key in `folder`'s key file; None when there is none. KeyFileError for a file that
    cannot be read or holds no key record (an unknown, missing or mistyped field)."""
    path = key_path(folder)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: not readable as a key record ({exc})") from None
    if not isinstance(raw, dict):
        raise KeyFileError(f"{path}: not a key record (a JSON object)")
    unknown = sorted(set(raw) - {"format", "kind", "key"})
    if unknown:
        raise KeyFileError(f"{path}: unknown field {unknown[0]!r}")
    if raw.get("kind") != KEY_KIND or raw.get("format") != KEY_FORMAT:
        raise KeyFileError(f"{path}: field 'kind'/'format' must be {KEY_KIND!r}/{KEY_FORMAT}")
    try:
        return ApiKey(key=raw.get("key")).key  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise KeyFileError(f"{path}: field 'key': {exc}") from None


__all__ = ["KEY_FILE", "KEY_FORMAT", "KEY_KIND", "ApiKey", "KeyFileError", "key_path",
           "read_key", "write_key"]  # fmt: skip
