"""The artifacts package's cattrs converter, and the JSON edge every record crosses. Strict:
no string-to-int coercion, no unknown keys, and `kind`/`format` are checked first so a wrong
file is named as such rather than as a pile of missing fields."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, TypeVar

import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from ._errors import RecordError

T = TypeVar("T")


def make_converter() -> cattrs.Converter:
    """A strict converter: JSON types must already be right (`"5"` is not an int)."""
    conv = cattrs.Converter(forbid_extra_keys=True)
    for cls in (int, str, bool, float):
        conv.register_structure_hook(cls, _strict(cls))
    return conv


def _strict(cls: type) -> Any:
    def hook(value: Any, _: Any) -> Any:
        if type(value) is not cls and not (cls is float and type(value) is int):
            raise TypeError(f"expected {cls.__name__}, got {type(value).__name__} {value!r}")
        return value

    return hook


converter = make_converter()


def to_json(record: Any, conv: cattrs.Converter = converter) -> bytes:
    """Canonical JSON (sorted keys, compact): equal records give equal bytes and digests."""
    return json.dumps(conv.unstructure(record), sort_keys=True, separators=(",", ":")).encode()


def record_digest(record: Any, conv: cattrs.Converter = converter) -> str:
    return "sha256:" + hashlib.sha256(to_json(record, conv)).hexdigest()


def from_json(
    data: bytes | str | Mapping[str, Any], cls: type[T], conv: cattrs.Converter = converter
) -> T:
    """Structures `cls` from JSON text or plain data; every problem becomes a RecordError line."""
    what = getattr(cls, "KIND", cls.__name__)
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordError(what, [("$", f"not JSON: {exc}")]) from None
    if not isinstance(data, Mapping):
        raise RecordError(what, [("$", f"a record is a JSON object, got {type(data).__name__}")])
    expected_kind = getattr(cls, "KIND", None)
    if expected_kind is not None and data.get("kind") != expected_kind:
        raise RecordError(
            what, [("kind", f"expected {expected_kind!r}, found {data.get('kind')!r}")]
        )
    try:
        return conv.structure(dict(data), cls)
    except RecordError as exc:
        raise RecordError(what, exc.problems) from None
    except (ClassValidationError, IterableValidationError, ForbiddenExtraKeysError) as exc:
        raise RecordError(what, problems(exc)) from None
    except (ValueError, TypeError, KeyError) as exc:
        raise RecordError(what, [_split(str(exc))]) from None


def problems(exc: BaseException) -> list[tuple[str, str]]:
    """Field paths and messages of a cattrs error, with validator messages kept whole."""
    nested = _nested_records(exc)
    if nested:
        return [problem for error in nested for problem in error.problems]
    found: list[tuple[str, str]] = []
    for line in cattrs.transform_error(exc, format_exception=_format):
        message, _, path = line.rpartition(" @ ")
        field = path.removeprefix("$").lstrip(".")
        head, message = _split(message)  # a validator names its field: `size: ...`
        if head != "$":
            field = f"{field}.{head}" if field else head
        found.append((field or "$", message))
    return found or [("$", str(exc))]


def _format(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"unknown fields {sorted(exc.extra_fields)}"
    return str(exc) or type(exc).__name__


def _split(message: str) -> tuple[str, str]:
    head, sep, tail = message.partition(": ")
    if sep and head and " " not in head:
        return head, tail
    return "$", message


def _nested_records(exc: BaseException) -> list[RecordError]:
    """A record's own cross-field check raises RecordError; cattrs wraps it. Unwrap it."""
    if isinstance(exc, RecordError):
        return [exc]
    found: list[RecordError] = []
    for inner in getattr(exc, "exceptions", ()):
        found += _nested_records(inner)
    return found
